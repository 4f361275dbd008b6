"""Continued pretraining: `--config.init_from=DIR` starts from a Hugging Face directory.

- `configure(config)` (before the data pipeline is built): the model section takes the
  directory's architecture (through `encoders.from_hf`), keeping this run's execution
  settings (KEPT: dtype, attention kernel, remat, scan, vocabulary padding) and the heads
  the objective trains; the tokenizer becomes the directory's (`tokenizer.json`, else
  `vocab.txt`).
- `load_into(DIR, params, shardings)` (the objective's after-init hook): every tensor of
  the checkpoint replaces the freshly initialised one at the same path, placed with that
  parameter's sharding; parameters the checkpoint lacks (e.g. an MLM head on a
  sentence-embedding checkpoint) keep their fresh init, and checkpoint heads this run
  does not have are left out. Both are logged. A shape mismatch is an error naming it.
"""
import json
import logging
import os

import jax
from flax import traverse_util

import encoders
from encoders.hf import stream

log = logging.getLogger("encoder_zoo")

KEPT = ("dtype", "attention_impl", "remat_policy", "scan_layers", "vocab_pad_multiple",
        "heads")


def _load(path: str, model_config, shardings=None):
  """(model, params) of the directory, with this run's execution settings, streamed from
  its safetensors straight onto `shardings` (a params tree; encoders/hf/stream.py). Not
  kept between `configure` and `load_into`: a resumed run never loads the weights."""
  overrides = {k: model_config[k] for k in KEPT if k != "heads" and k in model_config}
  return encoders.from_hf(path, shardings=shardings, **overrides)


def _model_config(path: str, model_config):
  """The directory's model config with this run's execution settings (no weights read)."""
  overrides = {k: model_config[k] for k in KEPT if k != "heads" and k in model_config}
  return encoders.build(stream.config(path, **overrides)[0]).config


def tokenizer_file(path: str) -> str:
  for name in ("tokenizer.json", "vocab.txt"):
    f = os.path.join(path, name)
    if os.path.isfile(f):
      return f
  raise ValueError(f"init_from={path!r}: the directory has no tokenizer.json or vocab.txt "
                   "(continued pretraining keeps the checkpoint's tokenizer)")


def configure(config):
  """Sets config.model and config.tokenizer from `config.init_from` (no-op when empty)."""
  path = config.get("init_from", "")
  if not path:
    return
  if not os.path.isfile(os.path.join(path, "config.json")):
    raise ValueError(f"init_from={path!r} is not a Hugging Face directory (no config.json)")
  model_config = _model_config(path, config.model)
  theirs = model_config.to_dict() if hasattr(model_config, "to_dict") else dict(model_config)
  kept = {k: config.model[k] for k in KEPT if k in config.model}
  for k, v in theirs.items():
    if k not in KEPT:
      config.model[k] = v
  for k, v in kept.items():
    config.model[k] = v
  tok_file = tokenizer_file(path)
  config.tokenizer.kind = "hf"
  config.tokenizer.path = tok_file
  if tok_file.endswith("vocab.txt"):
    tc = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(tc):
      with open(tc) as f:
        config.tokenizer.lowercase = bool(json.load(f).get("do_lower_case", False))
  log.info("init_from %s: %s model (%d layers, hidden %d), tokenizer %s", path,
           config.model.get("family"), config.model.get("num_hidden_layers", 0),
           config.model.get("hidden_size", 0), tok_file)


def load_into(path: str, params, shardings, model_config):
  """`params` (a module's sharded params) with the directory's tensors in place.
  `model_config`: the run's model section (after `configure`)."""
  _, theirs = _load(path, model_config, shardings)
  ours = traverse_util.flatten_dict(params)
  flat_s, flat_t = traverse_util.flatten_dict(shardings), traverse_util.flatten_dict(theirs)
  out = dict(ours)
  skipped = sorted("/".join(p) for p in flat_t if p not in ours)
  fresh = sorted("/".join(p) for p in ours if p not in flat_t)
  for p, value in flat_t.items():
    if p not in ours:
      continue
    target = ours[p]
    if tuple(value.shape) != tuple(target.shape):
      raise ValueError(f"init_from={path!r}: {'/'.join(p)} has shape {value.shape} in the "
                       f"checkpoint, {tuple(target.shape)} in the model")
    # Already on its sharding (streamed there); a no-op unless the dtype differs.
    out[p] = jax.device_put(value.astype(target.dtype), flat_s[p])
  log.info("init_from %s: loaded %d tensors; fresh init for %d (%s); not used: %d (%s)",
           path, len(ours) - len(fresh), len(fresh), ", ".join(fresh[:8]), len(skipped),
           ", ".join(skipped[:8]))
  return traverse_util.unflatten_dict(out)
