"""Writing HF directories: `to_hf` (an encoder) and `write_export` (what it and the task
export share), into a temporary directory renamed into place, over nothing but an absent
or empty directory or an earlier export (`check_export_target`)."""
import json
import os
from typing import Optional

import jax
import numpy as np
import safetensors.numpy
from flax import traverse_util

from encoders import layers, outdir
from encoders.hf.mapping import family_hook, mapping_for
from encoders.hf.rules import expand, export_rule

# The writer named in the marker file (encoders/outdir.py) of every HF directory to_hf
# writes, and the writers whose directories an HF export may replace. A directory another
# writer of this project marked is replaced only when it is a model directory (an export
# the trainer or fine-tuning marked as theirs); never a work directory, shards, or a
# user's directory.
HF_EXPORT = "HF export"
REPLACEABLE = (HF_EXPORT, "launch.convert")
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "params")


def is_model_dir(path: str) -> bool:
  """config.json plus weights (safetensors, or launch.convert's Orbax params/), and no
  checkpoints/ (a work directory is never a model directory)."""
  return (os.path.isfile(os.path.join(path, "config.json"))
          and any(os.path.exists(os.path.join(path, n)) for n in _WEIGHTS)
          and not os.path.exists(os.path.join(path, "checkpoints")))


def check_export_target(path: str, what: str = HF_EXPORT, writers=REPLACEABLE) -> None:
  """Raises outdir.OutputDirError unless `path` is absent, an empty directory, or an earlier
  export: marked (encoders/outdir.py) by one of `writers`, or by another writer of this
  project when it is a model directory (`is_model_dir`). A directory without the marker
  is never replaced, whatever it holds: an export written before markers existed must be
  removed by hand (it cannot be told from a user's save_pretrained directory)."""
  outdir.check_target(path, what)
  if not outdir.is_ours(path):
    return
  if os.path.exists(os.path.join(path, "checkpoints")) or not (
      outdir.writer_of(path) in writers or is_model_dir(path)):
    raise outdir.OutputDirError(
        f"{what} {path} is this project's {outdir.writer_of(path) or 'unnamed'!r} output, "
        "not a model directory an export may replace; refusing to touch it: choose a new "
        "directory")


def host_flat(params) -> dict:
  """{"a/b/kernel": float32 numpy array} of a params tree."""
  return {k: np.asarray(jax.device_get(v), np.float32)
          for k, v in traverse_util.flatten_dict(params, sep="/").items()}


def write_export(path, table, flat, cfg, prefix, hf, what):
  """Writes an HF directory from our flat params through an expanded rule table, atomically
  (outdir.atomic_dir: a temp dir, renamed into place). `path` must be absent, empty or an
  earlier export (`check_export_target`); anything else is refused before any work.
  Refuses params no rule covers: silently dropping a trained tensor would lose it."""
  check_export_target(path)
  uncovered = sorted(set(flat) - {p for rule in table for p in rule.our_paths})
  if uncovered:
    raise ValueError(f"the {cfg.family!r} {what} has no rule for params "
                     f"{', '.join(uncovered[:20])}; nothing was written")
  tensors = {}
  for rule in table:
    for key, value in export_rule(rule, flat, cfg).items():
      tensors[f"{prefix}.{key}" if (rule.base and prefix) else key] = value
  with outdir.atomic_dir(path, HF_EXPORT, check=check_export_target) as tmp:
    safetensors.numpy.save_file(tensors, os.path.join(tmp, "model.safetensors"),
                                metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(hf, f, indent=2, sort_keys=True)
  return path


def unscanned(cfg, params):
  """Params with scanned layers unstacked (the rules name layers one by one)."""
  if not cfg.get("scan_layers", False):
    return params
  return family_hook(cfg, "unscan_params", lambda c, p: layers.unstack_layer_params(p))(
      cfg, params)


def to_hf(model, params, path: str, architecture: Optional[str] = None):
  """Writes `config.json` + `model.safetensors` that transformers loads with
  `from_pretrained` with no missing or unexpected keys. Written to a temporary
  directory and renamed into place, so a crash never leaves a half-written checkpoint.
  `path` must be absent, an empty directory or an earlier export (its marker file,
  encoders/outdir.py); a directory of anything else is refused (outdir.OutputDirError,
  a ValueError) before any work, and nothing in it is touched."""
  check_export_target(path)
  cfg = model.config
  mapping = mapping_for(cfg.family)
  hf, arch = mapping.config_to_hf(cfg)
  if architecture is not None:
    arch = architecture
  prefix, _ = mapping.architectures[arch]
  hf["architectures"] = [arch]
  flat = host_flat(unscanned(cfg, params))
  return write_export(path, expand(mapping.rules(cfg), cfg), flat, cfg, prefix, hf,
                      "HF mapping")
