"""Hugging Face interop: read and write `config.json` + safetensors directories.

Each family registers a mapping (encoders/hf/<family>.py) that turns an HF config into
ours and back, and lists tensor rules `(our_path, hf_key, kind)`. This module does the
rest for every family: file reading (single or sharded safetensors, never pickle), key
prefixes, tied weights, and errors that name any missing, unexpected or mis-shaped tensor.
"""
import dataclasses
import importlib
import json
import os
import pkgutil
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import jax
import ml_collections
import numpy as np

from encoders import base, layers

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


@dataclasses.dataclass(frozen=True)
class Rule:
  """One tensor: our param path ("a/b/kernel"), its HF key (without the base-model prefix
  when `base` is True), and how to convert: "linear" (HF (out, in) -> our kernel, reshaped;
  `n_in` leading kernel dims are inputs), "embedding" / "vector" (same layout).
  `vocab`: the leading dim is the vocabulary, which our model may pad to a multiple of
  `vocab_pad_multiple` (zero rows appended on import, cut off again on export).

  Paths name layers unscanned ("encoder/layer_3/..."); with `scan_layers` the per-layer
  tensors are stacked into the scanned layout after import and unstacked before export."""
  ours: str
  hf: str
  kind: str = "vector"
  n_in: int = 1
  base: bool = True
  vocab: bool = False


class Mapping:
  """Per-family HF mapping. Subclasses set model_types/architectures and implement the rest."""
  model_types: Tuple[str, ...] = ()
  # HF architecture name -> (prefix its files give base-model tensors, our heads)
  architectures: Dict[str, Tuple[str, Tuple[str, ...]]] = {}
  # Tensors HF ties to another (absent from, or equal in, saved files): hf key -> source key
  tied: Dict[str, str] = {}

  def base_prefix(self, hf: dict) -> str:
    """The base model's attribute name (HF's base_model_prefix), e.g. "bert"."""
    return hf["model_type"]

  def config_from_hf(self, hf: dict, heads: Tuple[str, ...]) -> ml_collections.ConfigDict:
    raise NotImplementedError

  def config_to_hf(self, cfg) -> Tuple[dict, str]:
    """-> (config.json dict, architecture name)."""
    raise NotImplementedError

  def rules(self, cfg) -> List[Rule]:
    raise NotImplementedError


_MAPPINGS: Dict[str, Mapping] = {}


def register_mapping(cls):
  m = cls()
  for t in cls.model_types:
    _MAPPINGS[t] = m
  return cls




def refuse_unknown(hf: dict, consumed: Sequence[str], required: Dict[str, object]):
  """Errors on config attributes we would otherwise silently ignore.

  `consumed`: keys the family reads; `required`: key -> the only value we implement."""
  for key, want in required.items():
    if key in hf and hf[key] != want and not (want is None and hf[key] in (None, False)):
      raise ValueError(f"config.json sets {key}={hf[key]!r}; encoder-zoo supports only "
                       f"{key}={want!r} for model_type {hf.get('model_type')!r}")
  unknown = sorted(k for k in hf if k not in GENERIC_KEYS and k not in consumed
                   and k not in required)
  if unknown:
    raise ValueError(f"config.json has attributes encoder-zoo does not support for model_type "
                     f"{hf.get('model_type')!r}: {', '.join(unknown)}")


def read_safetensors(path: str) -> Dict[str, np.ndarray]:
  """All tensors of an HF directory as float32/int numpy arrays. Refuses pickle files."""
  from safetensors.numpy import load_file
  single = os.path.join(path, "model.safetensors")
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.isfile(single):
    files = [single]
  elif os.path.isfile(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    files = [os.path.join(path, name) for name in sorted(set(weight_map.values()))]
  elif any(os.path.isfile(os.path.join(path, n)) for n in ("pytorch_model.bin", "tf_model.h5")):
    raise ValueError(f"{path} holds only a pickle-based checkpoint (pytorch_model.bin); "
                     "encoder-zoo never unpickles files. Convert it to safetensors first "
                     "(e.g. save_pretrained(..., safe_serialization=True) in a trusted "
                     "environment).")
  else:
    raise ValueError(f"no model.safetensors or model.safetensors.index.json in {path}")
  tensors = {}
  for name in files:
    for key, value in load_file(name).items():
      if value.dtype.kind == "f" or value.dtype.name == "bfloat16":
        value = value.astype(np.float32)
      tensors[key] = value
  return tensors


def _architecture(mapping: Mapping, hf: dict, tensors: Dict[str, np.ndarray]) -> str:
  archs = hf.get("architectures") or []
  for arch in archs:
    if arch in mapping.architectures:
      return arch
  if archs:
    raise ValueError(f"architecture {archs[0]!r} is not supported; supported for "
                     f"{hf['model_type']!r}: {sorted(mapping.architectures)}")
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


def _get(tree: dict, path: str):
  for p in path.split("/"):
    tree = tree[p]
  return tree


def hf_config(path: str) -> dict:
  with open(os.path.join(path, "config.json")) as f:
    return json.load(f)


def from_hf(path: str, heads: Optional[Sequence[str]] = None, **overrides):
  """Loads an HF directory -> (model, params). `heads` defaults to the checkpoint's
  architecture; `overrides` set model config fields (e.g. dtype="bfloat16")."""
  import encoders
  hf = hf_config(path)
  model_type = hf.get("model_type")
  if model_type not in _MAPPINGS:
    raise ValueError(f"model_type {model_type!r} is not supported; supported: "
                     f"{sorted(_MAPPINGS)}")
  mapping = _MAPPINGS[model_type]
  tensors = read_safetensors(path)
  arch = _architecture(mapping, hf, tensors)
  _, arch_heads = mapping.architectures[arch]
  cfg = mapping.config_from_hf(hf, tuple(heads) if heads is not None else arch_heads)
  for key, value in overrides.items():
    cfg[key] = value
  tensors = _strip_prefix(tensors, mapping.base_prefix(hf))
  params = {}
  used = set()
  for rule in mapping.rules(cfg):
    if rule.hf not in tensors:
      raise ValueError(f"{path}: tensor {rule.hf!r} (needed for {rule.ours}) is missing")
    value = tensors[rule.hf]
    used.add(rule.hf)
    params_value = _to_ours(rule, value, cfg)
    _set(params, rule.ours, params_value)
  for tied, source in mapping.tied.items():
    if tied in tensors:
      used.add(tied)
      if tensors[tied].shape != tensors[source].shape or not np.array_equal(
          tensors[tied], tensors[source]):
        raise ValueError(f"{path}: {tied!r} differs from {source!r}; encoder-zoo ties them "
                         "and does not support untied weights")
  unexpected = sorted(k for k in tensors if k not in used and not _ignorable(k))
  if unexpected:
    raise ValueError(f"{path}: unexpected tensors not used by {arch} in encoder-zoo: "
                     f"{', '.join(unexpected[:20])}")
  model = encoders.build(cfg)
  if cfg.get("scan_layers", False):
    flat_cfg = ml_collections.ConfigDict(cfg.to_dict())
    flat_cfg.scan_layers = False
    _check_shapes(encoders.build(flat_cfg), params, path)
    params = layers.stack_layer_params(params, cfg.num_hidden_layers)
  else:
    _check_shapes(model, params, path)
  return model, params


def _ignorable(key: str) -> bool:
  # Buffers older transformers versions saved next to the weights.
  return key.endswith("position_ids") or key.endswith("token_type_ids")


def _to_ours(rule: Rule, value: np.ndarray, cfg):
  if rule.vocab:
    rows = base.padded_vocab_size(cfg)
    if value.shape[0] == cfg.vocab_size and rows > cfg.vocab_size:
      pad = np.zeros((rows - cfg.vocab_size,) + value.shape[1:], value.dtype)
      value = np.concatenate([value, pad], axis=0)
  if rule.kind == "linear":
    return np.ascontiguousarray(value.T)  # (in, out); reshaped by _check_shapes
  return value


def _check_shapes(model, params, path):
  """Reshapes linear kernels to our (in..., out...) layout and errors on any mismatch."""
  import encoders
  expected = jax.eval_shape(lambda: encoders.init_params(model, jax.random.PRNGKey(0)))
  flat_expected = _flatten(expected)
  flat = _flatten(params)
  missing = sorted(set(flat_expected) - set(flat))
  extra = sorted(set(flat) - set(flat_expected))
  if missing or extra:
    raise ValueError(f"{path}: parameter tree mismatch; missing {missing}, extra {extra}")
  for key, spec in flat_expected.items():
    value = flat[key]
    if value.shape != spec.shape:
      if value.size != int(np.prod(spec.shape)):
        raise ValueError(f"{path}: tensor for {key} has shape {value.shape}, expected "
                         f"{spec.shape}")
      value = value.reshape(spec.shape)
    _set(params, key, jax.numpy.asarray(value, dtype=spec.dtype))


def _flatten(tree, prefix=""):
  out = {}
  for k, v in tree.items():
    key = f"{prefix}/{k}" if prefix else k
    if isinstance(v, dict):
      out.update(_flatten(v, key))
    else:
      out[key] = v
  return out


def to_hf(model, params, path: str, architecture: Optional[str] = None):
  """Writes `config.json` + `model.safetensors` that transformers loads with
  `from_pretrained` with no missing or unexpected keys. Written to a temporary
  directory and renamed into place, so a crash never leaves a half-written checkpoint."""
  import shutil
  import tempfile
  from safetensors.numpy import save_file
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
    params = layers.unstack_layer_params(params)
  tensors = {}
  for rule in mapping.rules(cfg):
    value = np.asarray(jax.device_get(_get(params, rule.ours)), dtype=np.float32)
    if rule.vocab:
      value = value[:cfg.vocab_size]  # padding rows exist only in our table
    if rule.kind == "linear":
      value = value.reshape(int(np.prod(value.shape[:rule.n_in])), -1).T
    elif rule.kind == "vector":
      value = value.reshape(-1)
    key = f"{prefix}.{rule.hf}" if (rule.base and prefix) else rule.hf
    tensors[key] = np.ascontiguousarray(value)
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".to_hf_", dir=parent)
  try:
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w") as f:
      json.dump(hf, f, indent=2, sort_keys=True)
    if os.path.exists(path):
      shutil.rmtree(path)
    os.replace(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return path


def _load_mappings():
  # Each family's mapping registers itself; a new family adds a file here, edits nothing.
  for info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{info.name}")


_load_mappings()
