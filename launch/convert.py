"""Convert between training work directories, HF directories and Orbax checkpoints.

    # a training run's checkpoint (any step; default the latest) -> an HF directory
    python -m launch.convert --from WORKDIR [--step N] --out HF_DIR
    # an HF directory -> an Orbax checkpoint the trainer starts from
    python -m launch.convert --from HF_DIR --out ORBAX_DIR
    # and back
    python -m launch.convert --from ORBAX_DIR --out HF_DIR

What each direction writes:
- WORKDIR -> HF: the state of checkpoint `step` is restored (onto this machine's first
  device, whatever mesh it was saved on) and exported by the run's objective, exactly as
  the trainer's own end-of-run export: weights, config.json and the run's tokenizer.
- HF -> ORBAX: the directory's config.json and tokenizer files, with the weights as our
  param tree in an Orbax checkpoint under `params/` (float32, layers unscanned). Such a
  directory is read by `encoders.from_hf` like an HF one (Orbax restores each param
  straight onto its sharding), so the trainer starts from it with
  `--config.init_from=ORBAX_DIR`, and `launch.export` / `encoders.load` take it too.
- ORBAX -> HF: `encoders.to_hf` of those params, plus the tokenizer files.
HF -> ORBAX -> HF gives back every tensor bit for bit.

`--out` is written atomically (a temporary directory, renamed into place when complete)
and must be absent, an empty directory, or an earlier output of this command or of an
HF export (recognised by its marker file, encoders/outdir.py). Anything else, a training
work directory above all, is refused before any work and left untouched.
"""
import argparse
import json
import os
import shutil
import sys
from typing import Optional

import jax
import ml_collections
import orbax.checkpoint as ocp

import encoders
from encoders import outdir
from encoders.hf import check_export_target
from encoders.hf import hf_config
from encoders.hf.stream import ORBAX_PARAMS, is_orbax_dir, weight_files
from launch import trainer as train
from launch.data import tokenization

CONVERT = "launch.convert"  # the writer named in the marker of what this command writes

_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "config.json", ORBAX_PARAMS)


def kind_of(path: str) -> str:
  """"workdir", "orbax" or "hf"; ValueError when `path` is none of them."""
  if os.path.isdir(os.path.join(path, "checkpoints")) and os.path.isfile(
      os.path.join(path, "config.json")):
    return "workdir"
  if os.path.isfile(os.path.join(path, "config.json")):
    if is_orbax_dir(path):
      return "orbax"
    weight_files(path)  # raises, naming what is wrong (e.g. a pickle-only directory)
    return "hf"
  raise ValueError(f"{path} is not a training work directory (config.json + checkpoints/), "
                   "an HF directory or an Orbax directory written by launch.convert")


def _copy_side_files(src: str, dst: str):
  """Tokenizer and other small files: everything but the weights and config.json."""
  for name in os.listdir(src):
    if name in _WEIGHTS or name.startswith("model-") or name.startswith("."):
      continue
    s = os.path.join(src, name)
    if os.path.isfile(s):
      shutil.copy2(s, os.path.join(dst, name))


def check_out(out: str, src: Optional[str] = None):
  """Raises OutputDirError unless `out` may be written: absent, empty, or an earlier
  output of this command or of an HF export; never a work directory, nor `src` or a
  directory holding it."""
  out_abs = os.path.abspath(out)
  if src is not None:
    src_abs = os.path.abspath(src)
    if src_abs == out_abs or src_abs.startswith(out_abs.rstrip(os.sep) + os.sep):
      raise outdir.OutputDirError(f"--out {out} is --from {src} or holds it; choose a new "
                                  "directory")
  if os.path.isdir(os.path.join(out, "checkpoints")):
    raise outdir.OutputDirError(f"--out {out} is a training work directory (it holds "
                                "checkpoints/); convert never writes into one: choose a new "
                                "directory")
  check_export_target(out, "--out")


def hf_to_orbax(src: str, out: str) -> str:
  check_out(out, src)
  _, params = encoders.from_hf(src, scan_layers=False, vocab_pad_multiple=1)
  params = jax.device_get(params)
  with outdir.atomic_dir(out, CONVERT) as tmp:
    with ocp.StandardCheckpointer() as ckpt:
      ckpt.save(os.path.join(tmp, ORBAX_PARAMS), params)
      ckpt.wait_until_finished()
    shutil.copy2(os.path.join(src, "config.json"), os.path.join(tmp, "config.json"))
    _copy_side_files(src, tmp)
  return out


def orbax_to_hf(src: str, out: str) -> str:
  check_out(out, src)
  model, params = encoders.from_hf(src, scan_layers=False)
  archs = hf_config(src).get("architectures") or [None]
  with outdir.atomic_dir(out, CONVERT) as tmp:
    encoders.to_hf(model, params, tmp, architecture=archs[0])
    _copy_side_files(src, tmp)
  return out


def workdir_to_hf(workdir: str, out: str, step: Optional[int] = None) -> str:
  """The run's objective exports checkpoint `step` (default: the latest) to `out`."""
  check_out(out, workdir)
  workdir = os.path.abspath(workdir)
  with open(os.path.join(workdir, "config.json")) as f:
    config = ml_collections.ConfigDict(json.load(f))
  config.mesh.shape = (1, 1, 1)  # restored onto one device, whatever it was saved on
  tokenizer = tokenization.make_tokenizer(config.tokenizer, workdir, _no_documents)
  setup = train.build(config, tokenizer, jax.devices()[:1])
  ckpt_dir = os.path.join(workdir, "checkpoints")
  with ocp.CheckpointManager(ckpt_dir, item_names=("state",)) as mngr:
    steps = sorted(mngr.all_steps())
    if not steps:
      raise ValueError(f"{ckpt_dir} holds no checkpoint")
    if step is None:
      step = steps[-1]
    if step not in steps:
      raise ValueError(f"no checkpoint of step {step} in {ckpt_dir}; steps: {steps}")
    restored = mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(setup.abstract_state)))
  state = restored["state"]
  params = jax.device_get({**state.params, **state.frozen})
  with outdir.atomic_dir(out, CONVERT) as tmp:  # the objective's export, then renamed
    setup.objective.export(params, tmp, tokenizer)
  return out


def _no_documents():
  raise ValueError("the work directory has no cached tokenizer (tokenizer/), and convert "
                   "does not retrain one")


def convert(src: str, out: str, step: Optional[int] = None) -> str:
  """Converts by the kind of `src` (module docstring). -> the kind written."""
  kind = kind_of(src)
  if step is not None and kind != "workdir":
    raise ValueError(f"--step applies to a training work directory; {src} is an {kind} "
                     "directory")
  if os.path.abspath(src) == os.path.abspath(out):
    raise ValueError("--out must differ from --from")
  check_out(out, src)  # before any work
  if kind == "workdir":
    workdir_to_hf(src, out, step)
    return "hf"
  if kind == "hf":
    hf_to_orbax(src, out)
    return "orbax"
  orbax_to_hf(src, out)
  return "hf"


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m launch.convert",
                               description=__doc__.split("\n")[0])
  ap.add_argument("--from", dest="src", required=True,
                  help="a training work directory, an HF directory or an Orbax directory")
  ap.add_argument("--out", required=True, help="directory to write")
  ap.add_argument("--step", type=int, default=None,
                  help="work directory only: the checkpoint step (default: the latest)")
  a = ap.parse_args(argv)
  try:
    written = convert(a.src, a.out, a.step)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(f"wrote {written} directory {a.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
