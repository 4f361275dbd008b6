"""Hugging Face interop: read and write `config.json` + safetensors directories.

Each family registers a `Mapping` (encoders/hf/<family>.py on mapping.py's base): HF
config <-> ours, and a declarative tensor table. This package does the rest for every
family: file reading (stream.py: single or sharded safetensors, never pickle), writing
(export.py), task models (tasks.py), key prefixes, tied weights, per-layer expansion, and
errors that name any missing, unexpected or mis-shaped tensor.

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
import pkgutil
from typing import Dict, Optional, Sequence

import numpy as np

from encoders import outdir
from encoders.hf import stream
from encoders.hf.export import (HF_EXPORT, REPLACEABLE, check_export_target, is_model_dir,
                                to_hf, write_export)
from encoders.hf.mapping import (GENERIC_KEYS, Mapping, family_hook, hf_config, mapping_for,
                                 model_types, refuse_unknown, register_mapping)
from encoders.hf.rules import (KINDS, PerLayer, Rule, Table, expand, export_rule, import_rule,
                               layer_indices)


def read_safetensors(path: str, allow_nonfinite: bool = False) -> Dict[str, np.ndarray]:
  """All tensors of an HF directory as float32/int numpy arrays (headers checked, floats
  refused when they hold NaN / inf unless `allow_nonfinite`). Refuses pickle files."""
  tensors = stream.Tensors(path, allow_nonfinite)
  return {key: tensors.read(key) if stream.is_float(tensors.entries[key][1])
          else tensors.read_raw(key) for key in tensors}


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
  return stream.load(path, heads, mesh=mesh, rules=rules, shardings=shardings,
                     param_dtype=param_dtype, allow_nonfinite=allow_nonfinite, **overrides)


_modes_from_umask = outdir.modes_from_umask  # the former private name

__all__ = ["GENERIC_KEYS", "HF_EXPORT", "KINDS", "REPLACEABLE", "Mapping", "PerLayer", "Rule",
           "Table", "check_export_target", "expand", "export_rule", "family_hook",
           "from_hf", "hf_config", "import_rule", "is_model_dir", "layer_indices",
           "mapping_for", "model_types", "read_safetensors", "refuse_unknown",
           "register_mapping", "to_hf", "write_export"]

# Modules of this package that are not family mappings; each other module is one family's
# mapping and registers itself, so a new family adds a file here and edits nothing.
_CORE = ("export", "mapping", "rules", "stream", "tasks")
for _info in pkgutil.iter_modules(__path__):
  if _info.name not in _CORE:
    importlib.import_module(f"{__name__}.{_info.name}")
