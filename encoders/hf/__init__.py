"""Hugging Face interop: read and write `config.json` + safetensors directories.

Each family registers a `Mapping` (encoders/hf/<family>.py): HF config <-> ours, and a
declarative tensor table. This package does the rest for every family: file reading
(single or sharded safetensors, never pickle), key prefixes, tied weights, per-layer
expansion, and errors that name any missing, unexpected or mis-shaped tensor.

A table (`Mapping.rules(cfg)`) is a list of `Rule`s and `PerLayer` templates; one expander
(`rules.expand`) fills the templates' "{name}" placeholders from each index dict and
returns the concrete rules import and export both walk. Shapes below: D hidden, H heads,
K head dim, F intermediate, V vocabulary, E embedding width; HF linear weights are
(out, in), our kernels (in..., out...).

    def rules(self, cfg):
      D, H = cfg.hidden_size, cfg.num_attention_heads
      K = D // H
      return [
        Rule("embeddings/word_embeddings/embedding", "embeddings.word_embeddings.weight",
             "embedding", vocab=True),                              # (V,E), padded rows ours
        PerLayer([
          # our (D,H,K) kernel vs HF (H*K,D): the declared `shape` licenses the reshape
          Rule("encoder/layer_{i}/attention/query/kernel",
               "encoder.layer.{i}.attention.self.query.weight", "linear", shape=(D, H, K)),
          Rule("encoder/layer_{i}/attention/query/bias",
               "encoder.layer.{i}.attention.self.query.bias", shape=(H, K)),   # HF (H*K,)
          Rule("encoder/layer_{i}/attention/out/kernel",                       # HF (D,H*K)
               "encoder.layer.{i}.attention.output.dense.weight", "linear",
               shape=(H, K, D), n_in=2),
          Rule("encoder/layer_{i}/mlp/wi/kernel",                    # (D,F) vs HF (F,D)
               "encoder.layer.{i}.intermediate.dense.weight", "linear"),
          # (a family whose files fuse q/k/v instead: one HF (3*H*K, D) weight <-> three
          # (D,H,K) kernels; each path or key may be claimed by one rule only)
          # Rule(("layer_{i}/attention/query/kernel", "layer_{i}/attention/key/kernel",
          #       "layer_{i}/attention/value/kernel"), "layers.{i}.attn.Wqkv.weight",
          #      "split", of="linear", shape=(D, H, K)),
        ], layer_indices(cfg.num_hidden_layers)),        # [{"i": 0}, ..., {"i": L-1}]
        # grouped layers: PerLayer([...], [{"g": g, "j": j} for g ... for j ...]) with
        # "encoder/group_{g}/layer_{j}/..." <->
        # "encoder.albert_layer_groups.{g}.albert_layers.{j}...."
        Rule("mlm/bias", "cls.predictions.bias", base=False, vocab=True),  # not under "bert."
        Rule("", "embeddings.position_embeddings.weight", "computed",
             compute=lambda cfg: table(cfg)),  # checked on import, not loaded; written on export
      ]

Kinds (see `Rule`): "vector"/"embedding" (same layout), "linear", "split" (one HF tensor
-> several of ours along an HF-layout `axis`; concatenated back on export), "concat"
(several HF tensors -> one of ours; split back on export, equal parts or `sizes`),
"computed". Without a declared `shape` the layouts must agree exactly; a tensor of any
other shape is an error naming its HF key with the expected and the actual shape.
Our paths name layers unscanned ("encoder/layer_3/..."); with `scan_layers` the family's
`scan_params(cfg, params)` stacks them after import and its `unscan_params` unstacks
them before export (default: `layers.stack_layer_params` / `unstack_layer_params`).
`Mapping.ignorable` lists key suffixes a family's files may carry that we drop (buffers
such as "embeddings.position_ids"); `Mapping.tied` the tensors HF ties to another.
"""
import importlib
import json
import os
import pkgutil
from typing import Dict, Optional, Sequence, Tuple

import jax
import ml_collections
import numpy as np

from encoders import layers, outdir
from encoders.hf.rules import (KINDS, PerLayer, Rule, Table, expand, export_rule,  # noqa: F401
                               import_rule, layer_indices)

# HF config keys that describe the checkpoint or the generic PreTrainedModel machinery and
# never change the encoder's numbers.
GENERIC_KEYS = frozenset({
    "_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype",
    "dtype", "use_cache", "gradient_checkpointing", "output_hidden_states",
    "output_attentions", "return_dict", "id2label", "label2id", "problem_type",
    "chunk_size_feed_forward", "bos_token_id", "eos_token_id", "sep_token_id",
    "classifier_dropout", "initializer_range", "hidden_dropout_prob",
    "attention_probs_dropout_prob", "tokenizer_class", "prefix", "task_specific_params",
    "finetuning_task", "pruned_heads", "torchscript", "tf_legacy_loss",
    "use_bfloat16", "output_past", "num_labels", "_attn_implementation_autoset",
    "layer_norm_epsilon_comment", "name_or_path",
})


class Mapping:
  """Per-family HF mapping. Subclasses set model_types/architectures and implement the rest."""
  model_types: Tuple[str, ...] = ()
  # HF architecture name -> (prefix its files give base-model tensors, our heads)
  architectures: Dict[str, Tuple[str, Tuple[str, ...]]] = {}
  # Tensors HF ties to another (absent from, or equal in, saved files): hf key -> source key
  tied: Dict[str, str] = {}
  # Key suffixes of tensors the files may carry that we drop (e.g. "embeddings.position_ids",
  # a buffer older transformers versions saved next to the weights).
  ignorable: Tuple[str, ...] = ()

  def base_prefix(self, hf: dict) -> str:
    """The base model's attribute name (HF's base_model_prefix), e.g. "bert"."""
    return hf["model_type"]

  def config_from_hf(self, hf: dict, heads: Tuple[str, ...]) -> ml_collections.ConfigDict:
    raise NotImplementedError

  def config_to_hf(self, cfg) -> Tuple[dict, str]:
    """-> (config.json dict, architecture name)."""
    raise NotImplementedError

  def rules(self, cfg) -> Table:
    """The tensor table for `cfg`: `Rule`s and `PerLayer` templates (module docstring)."""
    raise NotImplementedError

  def is_ignorable(self, key: str) -> bool:
    return any(key == s or key.endswith("." + s) for s in self.ignorable)


_MAPPINGS: Dict[str, Mapping] = {}


def register_mapping(cls):
  m = cls()
  for t in cls.model_types:
    _MAPPINGS[t] = m
  return cls


def refuse_unknown(hf: dict, consumed: Sequence[str], required: Dict[str, object]):
  """Errors on config attributes we would otherwise silently ignore.

  `consumed`: keys the family reads; `required`: key -> the only value we implement."""
  if hf.get("pruned_heads"):  # transformers would drop those heads: other numbers
    raise ValueError(f"config.json sets pruned_heads={hf['pruned_heads']!r}; encoder-zoo "
                     "does not support pruned attention heads")
  for key, want in required.items():
    if key in hf and hf[key] != want and not (want is None and hf[key] in (None, False)):
      raise ValueError(f"config.json sets {key}={hf[key]!r}; encoder-zoo supports only "
                       f"{key}={want!r} for model_type {hf.get('model_type')!r}")
  unknown = sorted(k for k in hf if k not in GENERIC_KEYS and k not in consumed
                   and k not in required)
  if unknown:
    raise ValueError(f"config.json has attributes encoder-zoo does not support for model_type "
                     f"{hf.get('model_type')!r}: {', '.join(unknown)}")


def read_safetensors(path: str, allow_nonfinite: bool = False) -> Dict[str, np.ndarray]:
  """All tensors of an HF directory as float32/int numpy arrays (headers checked, floats
  refused when they hold NaN / inf unless `allow_nonfinite`). Refuses pickle files."""
  from encoders.hf.stream import Tensors, _is_float
  tensors = Tensors(path, allow_nonfinite)
  return {key: tensors.read(key) if _is_float(tensors.entries[key][1])
          else tensors.read_raw(key) for key in tensors}


def _architecture(mapping: Mapping, hf: dict, tensors: Dict[str, np.ndarray]) -> str:
  archs = hf.get("architectures") or []
  for arch in archs:
    if arch in mapping.architectures:
      return arch
  if archs:
    from encoders.hf import tasks as tasks_hf  # imports this module
    hint = (f"; {archs[0]!r} is a task model: load it with "
            f"encoders.hf.tasks.from_hf(path), whose params hold this encoder's tree "
            f"plus the task head" if tasks_hf.is_task_architecture(mapping, hf, archs[0])
            else "")
    raise ValueError(f"architecture {archs[0]!r} is not supported; supported for "
                     f"{hf['model_type']!r}: {sorted(mapping.architectures)}{hint}")
  # No architectures field: take the first (base model) architecture.
  return next(iter(mapping.architectures))


def _strip_prefix(tensors, prefix):
  """HF files name base-model tensors with or without `prefix.` (a BertModel saved alone
  has none, BertForMaskedLM has "bert."); returns the keys without it."""
  out = {}
  for key, value in tensors.items():
    if key.startswith(prefix + "."):
      out[key[len(prefix) + 1:]] = value
    else:
      out[key] = value
  return out


def _set(tree: dict, path: str, value):
  parts = path.split("/")
  for p in parts[:-1]:
    tree = tree.setdefault(p, {})
  tree[parts[-1]] = value


def _flatten(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    key = f"{prefix}/{k}" if prefix else k
    if isinstance(v, dict):
      out.update(_flatten(v, key))
    else:
      out[key] = v
  return out


def mapping_for(name: str) -> Mapping:
  """The registered Mapping of an HF model_type ("roberta", "deberta-v2") or a family
  name ("bert"); a family's name is one of its mapping's model types. ValueError naming
  the supported ones otherwise."""
  if name not in _MAPPINGS:
    raise ValueError(f"model_type {name!r} is not supported; supported: "
                     f"{sorted(_MAPPINGS)}")
  return _MAPPINGS[name]


def model_types() -> Tuple[str, ...]:
  """Every HF model_type a registered mapping reads, sorted."""
  return tuple(sorted(_MAPPINGS))


_mapping_for = mapping_for  # the former private name


def hf_config(path: str) -> dict:
  """`path`'s config.json; ValueError naming the file when it is missing or malformed."""
  name = os.path.join(path, "config.json")
  if not os.path.isfile(name):
    raise ValueError(f"{path} has no config.json: not a Hugging Face model directory")
  try:
    with open(name) as f:
      hf = json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise ValueError(f"{name} is not valid JSON ({e})") from None
  if not isinstance(hf, dict):
    raise ValueError(f"{name} is not a JSON object")
  return hf


def from_hf(path: str, heads: Optional[Sequence[str]] = None, *, mesh=None, rules=None,
            shardings=None, param_dtype=None, allow_nonfinite=False, **overrides):
  """Loads an HF directory -> (model, params). `heads` defaults to the checkpoint's
  architecture; `overrides` set model config fields (e.g. dtype="bfloat16").

  Refused, with an error naming the file (and tensor): a malformed safetensors header
  (length past the file or over 100 MB, offsets outside the file or overlapping, a shape
  that does not match its bytes, an unknown dtype), a sharded index naming a missing
  file, a tensor stored as integers, and any weight holding NaN or inf unless
  `allow_nonfinite=True`.

  Tensors stream from the safetensors file(s) one at a time (encoders/hf/stream.py).
  `mesh`: place every param as a jax.Array sharded on it by its logical axes through
  `rules` (default encoders.sharding_rules.DEFAULT_RULES), each process reading only the
  slices its devices hold; `shardings`: a params-shaped tree of shardings that overrides
  those per param. Neither: params on the default device, as before. `param_dtype`
  casts the stored params (default: the model's param dtype, float32)."""
  from encoders.hf import stream
  return stream.load(path, heads, mesh=mesh, rules=rules, shardings=shardings,
                     param_dtype=param_dtype, allow_nonfinite=allow_nonfinite, **overrides)


def _family_hook(cfg, name, default):
  """The family's `scan_params`/`unscan_params` (a family whose scanned layout is not
  one stack of `layer_<i>`, e.g. ALBERT's shared groups, says so there), else `default`."""
  from encoders import base
  return getattr(base.family(cfg.get("family", "bert")), name, default)


def to_hf(model, params, path: str, architecture: Optional[str] = None):
  """Writes `config.json` + `model.safetensors` that transformers loads with
  `from_pretrained` with no missing or unexpected keys. Written to a temporary
  directory and renamed into place, so a crash never leaves a half-written checkpoint.
  `path` must be absent, an empty directory or an earlier export (its marker file,
  encoders/outdir.py); a directory of anything else is refused (outdir.OutputDirError,
  a ValueError) before any work, and nothing in it is touched."""
  check_export_target(path)
  cfg = model.config
  mapping = _MAPPINGS.get(cfg.family) or next(
      (m for m in _MAPPINGS.values() if cfg.family in m.model_types), None)
  if mapping is None:
    raise ValueError(f"no Hugging Face mapping for family {cfg.family!r}")
  hf, arch = mapping.config_to_hf(cfg)
  if architecture is not None:
    arch = architecture
  prefix, _ = mapping.architectures[arch]
  hf["architectures"] = [arch]
  if cfg.get("scan_layers", False):
    params = _family_hook(cfg, "unscan_params", lambda c, p: layers.unstack_layer_params(p))(
        cfg, params)
  flat = {k: np.asarray(jax.device_get(v), np.float32) for k, v in _flatten(params).items()}
  table = expand(mapping.rules(cfg), cfg)
  return write_export(path, table, flat, cfg, prefix, hf, "HF mapping")


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


def write_export(path, table, flat, cfg, prefix, hf, what):
  """Writes an HF directory from our flat params through an expanded rule table, atomically
  (outdir.atomic_dir: a temp dir, renamed into place). `path` must be absent, empty or an
  earlier export (`check_export_target`); anything else is refused before any work.
  Refuses params no rule covers: silently dropping a trained tensor would lose it. Shared
  by `to_hf` and the task-model export."""
  from safetensors.numpy import save_file
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
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(hf, f, indent=2, sort_keys=True)
  return path


_modes_from_umask = outdir.modes_from_umask  # the former private name


_CORE = ("rules", "stream")  # modules of this package that are not family mappings


def _load_mappings():
  # Each family's mapping registers itself; a new family adds a file here, edits nothing.
  for info in pkgutil.iter_modules(__path__):
    if info.name in _CORE:
      continue
    importlib.import_module(f"{__name__}.{info.name}")


_load_mappings()
