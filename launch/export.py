"""Export an encoder for serving: a `jax.export` artifact (StableHLO, weights inside).

    python -m launch.export --from HF_DIR --out model.jaxexport \\
        [--batch dynamic|N] [--seq dynamic|N] [--platforms cpu,tpu,cuda] [--dtype float32]

The artifact is `jax.export.Exported.serialize()` bytes: a function of
(input_ids int32 (B,T), attention_mask int32 (B,T), token_type_ids int32 (B,T)) returning
a dict of the model's outputs (last_hidden_state, and pooler_output / mlm_logits / ...
as the checkpoint's heads give). The weights are constants inside it, so serving needs
only JAX (or any StableHLO runtime), never this repository:

    exp = jax.export.deserialize(open("model.jaxexport", "rb").read())
    out = exp.call(ids, mask, types)

`dynamic` batch / length are symbolic dimensions ("b", "t"; t <= the model's maximum
length), so one artifact serves every shape. Platforms: each requested platform is
lowered into the one artifact where this machine's JAX can lower for it (TPU and CUDA
lowering need no accelerator); the ones that could not be lowered are recorded with the
reason. `FILE.json` beside the artifact records the platforms, shapes, outputs and the
model settings.

`--out` is never a file this command did not write: it may be absent, or an earlier
artifact of launch.export (recognised by its FILE.json, which names this writer). Anything
else is refused before the model is loaded. Both files are written to temporary files
beside them and renamed into place, so a crash leaves the earlier artifact whole.
"""
import argparse
import json
import os
import sys
import tempfile
from typing import Optional, Sequence

import jax
import numpy as np

import encoders
from encoders.outdir import OutputDirError

DEFAULT_PLATFORMS = ("cpu", "cuda", "tpu")
WRITER = "launch.export"  # named in the FILE.json of every artifact written here


def _ours(out: str) -> bool:
  """Whether `out` (and `out`.json) are an artifact of launch.export: its metadata names
  this writer, or (written before it did) this very artifact and a jax.export version."""
  try:
    with open(out + ".json") as f:
      meta = json.load(f)
  except (OSError, ValueError):
    return False
  if not isinstance(meta, dict):
    return False
  return meta.get("writer") == WRITER or (
      "writer" not in meta and meta.get("artifact") == os.path.abspath(out)
      and "calling_convention_version" in meta)


def check_out(out: str):
  """Raises OutputDirError (a ValueError) unless `out` and `out`.json may be written."""
  for p in (out, out + ".json"):
    if os.path.islink(p) or os.path.isdir(p):
      raise OutputDirError(f"--out {p} is a directory or a link; give a new file path for "
                           "the artifact")
  if (os.path.lexists(out) or os.path.lexists(out + ".json")) and not _ours(out):
    raise OutputDirError(f"--out {out} (or {out}.json) exists and is not an artifact "
                         "launch.export wrote; refusing to overwrite it: choose a new path")


def _write_atomically(path: str, data: bytes):
  """`data` to a temporary file beside `path`, then renamed over it (umask's modes)."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-", dir=directory)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def _dim(value: str, name: str):
  if value in ("dynamic", "", None):
    return name
  try:
    n = int(value)
  except ValueError:
    raise ValueError(f"--{'batch' if name == 'b' else 'seq'} must be 'dynamic' or a "
                     f"positive integer, got {value!r}") from None
  if n <= 0:
    raise ValueError(f"--{'batch' if name == 'b' else 'seq'} must be positive, got {n}")
  return n


def serving_fn(model, params):
  """(input_ids, attention_mask, token_type_ids) -> {output name: array}, weights closed
  over (they become constants of the exported program)."""
  def serve(input_ids, attention_mask, token_type_ids):
    out = model.apply({"params": params}, input_ids, attention_mask, token_type_ids)
    return {k: getattr(out, k) for k in out.__dataclass_fields__
            if getattr(out, k) is not None}
  return serve


def export(path: str, out: str, batch="dynamic", seq="dynamic",
           platforms: Sequence[str] = DEFAULT_PLATFORMS, dtype: Optional[str] = None,
           heads: Optional[Sequence[str]] = None) -> dict:
  """Writes the artifact `out` and its metadata `out + ".json"`; returns the metadata."""
  b, t = _dim(batch, "b"), _dim(seq, "t")
  requested = [p.strip().lower() for p in platforms if p.strip()]
  unknown = sorted(set(requested) - set(DEFAULT_PLATFORMS + ("rocm",)))
  if unknown or not requested:
    raise ValueError(f"--platforms: unknown {unknown}; choose from cpu, cuda, rocm, tpu")
  check_out(out)  # before any work
  overrides = {"dtype": dtype} if dtype else {}
  model, params = encoders.from_hf(path, heads, **overrides)
  params = jax.device_get(params)
  max_len = model.max_length()
  if isinstance(t, int) and max_len is not None and t > max_len:
    raise ValueError(f"--seq {t} exceeds the model's maximum length {max_len}")
  names = ", ".join(n for n in (b, t) if isinstance(n, str))
  sym = {}
  if names:
    constraints = [f"t <= {max_len}"] if t == "t" and max_len is not None else []
    dims = jax.export.symbolic_shape(names, constraints=constraints)
    sym = dict(zip([n for n in (b, t) if isinstance(n, str)], dims))
  shape = tuple(sym.get(d, d) if isinstance(d, str) else d for d in (b, t))
  spec = jax.ShapeDtypeStruct(shape, np.int32)
  fn = jax.jit(serving_fn(model, params))
  lowered, failed = [], {}
  for p in requested:  # which platforms this JAX can lower for, one by one
    try:
      jax.export.export(fn, platforms=[p])(spec, spec, spec)
      lowered.append(p)
    except Exception as e:  # noqa: BLE001 (recorded, not hidden)
      failed[p] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
  if not lowered:
    raise ValueError(f"no requested platform could be lowered: {failed}")
  exported = jax.export.export(fn, platforms=lowered)(spec, spec, spec)
  blob = exported.serialize()
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  cfg = model.config
  meta = {
      "writer": WRITER, "source": os.path.abspath(path), "artifact": os.path.abspath(out),
      "bytes": len(blob), "platforms": list(exported.platforms),
      "platforms_failed": failed,
      "inputs": {k: {"shape": [str(d) for d in shape], "dtype": "int32"}
                 for k in ("input_ids", "attention_mask", "token_type_ids")},
      "max_length": max_len,
      "outputs": {k: {"shape": [str(d) for d in v.shape], "dtype": str(v.dtype)}
                  for k, v in jax.tree.unflatten(exported.out_tree,
                                                 exported.out_avals).items()},
      "model": {k: cfg.get(k) for k in ("family", "hidden_size", "num_hidden_layers",
                                         "vocab_size", "dtype", "attention_impl", "heads")},
      "jax_version": jax.__version__, "calling_convention_version":
          exported.calling_convention_version,
  }
  meta["model"]["heads"] = list(meta["model"]["heads"] or ())
  info = json.dumps(meta, indent=1).encode()
  check_out(out)  # nothing of the user's appeared meanwhile
  _write_atomically(out, bytes(blob))
  _write_atomically(out + ".json", info)
  return meta


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m launch.export", description=__doc__.split(
      "\n")[0])
  ap.add_argument("--from", dest="src", required=True, help="HF directory")
  ap.add_argument("--out", required=True, help="artifact file to write")
  ap.add_argument("--batch", default="dynamic", help="'dynamic' (default) or N")
  ap.add_argument("--seq", default="dynamic", help="'dynamic' (default) or N")
  ap.add_argument("--platforms", default=",".join(DEFAULT_PLATFORMS),
                  help="comma-separated: cpu, cuda, rocm, tpu (default cpu,cuda,tpu)")
  ap.add_argument("--dtype", default="", help="compute dtype (default: the model's auto)")
  a = ap.parse_args(argv)
  try:
    meta = export(a.src, a.out, a.batch, a.seq, a.platforms.split(","), a.dtype or None)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps({k: meta[k] for k in ("artifact", "bytes", "platforms",
                                          "platforms_failed", "inputs", "outputs")},
                   indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
