"""The per-family HF mapping base class and its registry.

A family's mapping (encoders/hf/<family>.py) subclasses `Mapping`, states the HF keys it
reads (`consumed`, `renamed`, `handled`) and the values it requires (`required`), builds
its config on `config_start` (the opening every family shares: unknown keys refused, the
family's defaults, the keys copied), and registers with `@register_mapping`.
"""
import json
import os
from typing import Dict, Optional, Sequence, Tuple

import ml_collections

from encoders import base, tasks
from encoders.hf.rules import Table

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
  # What `config_start` reads: HF keys copied one to one, HF name -> ours, keys the family
  # reads itself, and key -> the only value implemented.
  consumed: Tuple[str, ...] = ()
  renamed: Dict[str, str] = {}
  handled: Tuple[str, ...] = ()
  required: Dict[str, object] = {}
  # transformers' class-name prefix of the family's task models ("Bert"): + a task's
  # suffix ("ForTokenClassification"); None: no task models.
  task_class_prefix: Optional[str] = None

  def defaults(self) -> ml_collections.ConfigDict:
    """The family's model section defaults (its encoders/<family>.py `defaults()`)."""
    raise NotImplementedError

  def config_start(self, hf: dict, heads: Tuple[str, ...]) -> ml_collections.ConfigDict:
    """The opening of every `config_from_hf`: attributes the family does not read
    refused, its defaults with the HF keys it reads copied (renamed ones under our
    name), heads set, no size variant."""
    refuse_unknown(hf, tuple(self.consumed) + tuple(self.renamed) + tuple(self.handled),
                   self.required)
    m = self.defaults()
    for key in self.consumed:
      if key in hf:
        m[key] = hf[key]
    for theirs, ours in self.renamed.items():
      if theirs in hf:
        m[ours] = hf[theirs]
    if m.hidden_size % m.num_attention_heads:
      raise ValueError(f"hidden_size {m.hidden_size} must be a multiple of "
                       f"num_attention_heads {m.num_attention_heads}")
    m.variant = ""
    m.heads = tuple(heads)
    return m

  def base_prefix(self, hf: dict) -> str:
    """The base model's attribute name (HF's base_model_prefix), e.g. "bert"."""
    return hf["model_type"]

  def config_from_hf(self, hf: dict, heads: Tuple[str, ...]) -> ml_collections.ConfigDict:
    raise NotImplementedError

  def config_to_hf(self, cfg) -> Tuple[dict, str]:
    """-> (config.json dict, architecture name)."""
    raise NotImplementedError

  def rules(self, cfg) -> Table:
    """The tensor table for `cfg`: `Rule`s and `PerLayer` templates (encoders/hf)."""
    raise NotImplementedError

  def task_prefix(self, cfg) -> Optional[str]:
    """The class-name prefix of the family's task models for `cfg` (BERT's depends on
    its position style: "Bert" or "Roberta")."""
    return self.task_class_prefix

  def task_architecture(self, cfg, task) -> Optional[str]:
    """transformers' class of `task` (a tasks.Task) for this family, or None: no prefix,
    no suffix, or a head kind the family does not declare."""
    prefix = self.task_prefix(cfg)
    if prefix is None or task.hf_suffix is None:
      return None
    if task.head_kind is not None and task.head_kind not in tasks.family_heads(cfg):
      return None
    return prefix + task.hf_suffix

  def is_ignorable(self, key: str) -> bool:
    return any(key == s or key.endswith("." + s) for s in self.ignorable)


_MAPPINGS: Dict[str, Mapping] = {}


def register_mapping(cls):
  m = cls()
  for t in cls.model_types:
    _MAPPINGS[t] = m
  return cls


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


def family_hook(cfg, name, default):
  """The family's `scan_params`/`unscan_params` (a family whose scanned layout is not
  one stack of `layer_<i>`, e.g. ALBERT's shared groups, says so there), else `default`."""
  return getattr(base.family(cfg.get("family", "bert")), name, default)


def task_classes(mapping: Mapping, cfg) -> Dict[str, list]:
  """{transformers class: the registered tasks with that class} for the family's `cfg`
  (sequence and regression share one)."""
  found = {}
  for t in tasks.registered():
    arch = mapping.task_architecture(cfg, t)
    if arch is not None:
      found.setdefault(arch, []).append(t)
  return found


def task_of(mapping: Mapping, hf: dict, arch: str):
  """The registered task of class `arch` that reads this config.json; ValueError when no
  task has the class, or none (or several) of those that do reads the config."""
  cfg = mapping.config_from_hf(hf, ())
  found = task_classes(mapping, cfg)
  if arch not in found:
    raise ValueError(f"architecture {arch!r} is not a task model encoder-zoo supports for "
                     f"{cfg.get('family')!r}; supported: {sorted(found)}")
  claimed = [t for t in found[arch] if t.hf_claims(hf)]
  if len(claimed) != 1:
    raise ValueError(f"config.json sets problem_type={hf.get('problem_type')!r} with "
                     f"num_labels={hf.get('num_labels', len(hf.get('id2label') or {}))}: "
                     f"{'no' if not claimed else 'more than one'} encoder-zoo task reads "
                     f"{arch} so (tasks {[t.name for t in found[arch]]}: single-label "
                     "softmax classification, or regression with one output), so its "
                     "probabilities and loss would be wrong for this model")
  return claimed[0]


def architecture(mapping: Mapping, hf: dict) -> str:
  """The encoder architecture of a config.json (its first, or the family's base model);
  a task model's class is refused, naming the loader that reads it."""
  archs = hf.get("architectures") or []
  for arch in archs:
    if arch in mapping.architectures:
      return arch
  if archs:
    is_task = archs[0] in task_classes(mapping, mapping.config_from_hf(hf, ()))
    hint = (f"; {archs[0]!r} is a task model: load it with "
            f"encoders.hf.tasks.from_hf(path), whose params hold this encoder's tree "
            f"plus the task head" if is_task else "")
    raise ValueError(f"architecture {archs[0]!r} is not supported; supported for "
                     f"{hf['model_type']!r}: {sorted(mapping.architectures)}{hint}")
  return next(iter(mapping.architectures))
