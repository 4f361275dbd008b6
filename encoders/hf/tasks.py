"""Hugging Face task models <-> encoder-zoo task models, for every family that declares
them (see encoders/tasks.py for what a family declares).

    model, params = encoders.hf.tasks.from_hf(dir)   # ...ForSequenceClassification etc.
    model.task, model.labels                          # "sequence", ("neg", "pos")
    encoders.hf.tasks.to_hf(model, params, out_dir)   # loads in transformers, id2label kept

The base model's tensors go through the family's own table (`Mapping.rules`) with the
encoder heads the task needs (BERT's pooler for sequence classification, nothing else);
the task head's tensors through `task_head_rules`, built from the family's `TaskHF`.
Import errors name every missing, unexpected or mis-shaped tensor, as encoders.hf does.
"""
from typing import Optional

import jax
import ml_collections
import numpy as np

from encoders import base, layers, tasks
from encoders.hf import (write_export, _flatten, _mapping_for, _set, expand, hf_config,
                         import_rule)
from encoders.hf.rules import Rule


def task_hf(mapping, cfg, task: str) -> Optional[tasks.TaskHF]:
  """The family's TaskHF for `task` (None: transformers has no such model). ValueError
  when the family's mapping declares no task models at all."""
  declare = getattr(mapping, "task_hf", None)
  if declare is None:
    raise tasks._undeclared(cfg.get("family", "bert"), "no task_hf on its HF Mapping")
  th = declare(cfg, task)
  if th is not None and not isinstance(th, tasks.TaskHF):
    raise ValueError(f"{type(mapping).__name__}.task_hf must return tasks.TaskHF or None")
  return th


def task_head_rules(cfg, task: str, th: tasks.TaskHF):
  """Rules of our `<task>_head/...` params vs the HF head modules (never under the base
  model's prefix)."""
  head = tasks.head_name(task)
  if th.rules is not None:
    return list(th.rules)
  spec = tasks.head_spec(cfg, task)
  parts = ["out"] + (["dense"] if spec.act is not None else []) + (["norm"] if spec.norm
                                                                    else [])
  missing = [p for p in parts if p not in (th.modules or {})]
  if missing:
    raise ValueError(f"{th.architecture}: TaskHF.modules names no HF module for head parts "
                     f"{missing}")
  rules = []
  for part in parts:
    mod = th.modules[part]
    if part == "norm":
      rules.append(Rule(f"{head}/norm/scale", f"{mod}.weight", base=False))
      if spec.norm_bias:
        rules.append(Rule(f"{head}/norm/bias", f"{mod}.bias", base=False))
    else:
      rules.append(Rule(f"{head}/{part}/kernel", f"{mod}.weight", "linear", base=False))
      if part == "out" or spec.dense_bias:
        rules.append(Rule(f"{head}/{part}/bias", f"{mod}.bias", base=False))
  return rules


def task_architectures(mapping, cfg):
  """{transformers task class name: (task, TaskHF)} of the family's task models."""
  found = {}
  for task in tasks.TASKS:
    th = task_hf(mapping, cfg, task)
    if th is not None:
      found[th.architecture] = (task, th)
  return found


def is_task_architecture(mapping, hf: dict, arch: str) -> bool:
  """Whether `arch` (a config.json architecture) is one of the family's task models."""
  if getattr(mapping, "task_hf", None) is None:
    return False
  return arch in task_architectures(mapping, mapping.config_from_hf(hf, ()))


def _find_task(mapping, cfg, arch: str):
  found = task_architectures(mapping, cfg)
  if arch not in found:
    raise ValueError(f"architecture {arch!r} is not a task model encoder-zoo supports for "
                     f"{cfg.get('family')!r}; supported: {sorted(found)}")
  return found[arch]


def labels_from_hf(hf: dict):
  """HF id2label ({"0": "neg", ...}) -> ("neg", ...) in id order."""
  id2label = hf.get("id2label") or {}
  ids = sorted(int(k) for k in id2label)
  if ids != list(range(len(ids))):
    raise ValueError(f"id2label ids must be 0..N-1, got {ids}")
  return tuple(str(id2label[str(i)] if str(i) in id2label else id2label[i]) for i in ids)


def from_hf(path: str, *, allow_nonfinite: bool = False, **overrides):
  """An HF `...ForSequenceClassification` / `...ForTokenClassification` /
  `...ForQuestionAnswering` directory -> (TaskModel, params); the labels from id2label.
  The files are checked as `encoders.from_hf` checks them (headers before any read,
  integer-stored tensors, and NaN / inf unless `allow_nonfinite=True`)."""
  from encoders.hf.stream import Tensors
  hf = hf_config(path)
  mapping = _mapping_for(hf.get("model_type"))
  archs = hf.get("architectures") or []
  if not archs:
    raise ValueError(f"{path}: config.json names no architecture; a task model needs one")
  cfg = mapping.config_from_hf(hf, ())
  for key, value in overrides.items():
    cfg[key] = value
  task, th = _find_task(mapping, cfg, archs[0])
  problem = hf.get("problem_type")
  if task == "sequence" and problem not in (None, "single_label_classification",
                                            "regression"):
    raise ValueError(f"{path}: config.json sets problem_type={problem!r}; encoder-zoo's "
                     "sequence task is single-label classification (softmax) or regression, "
                     "so its probabilities and loss would be wrong for this model")
  labels = labels_from_hf(hf) if task != "qa" else ()
  num_labels = len(labels) or int(hf.get("num_labels", 2))
  model = tasks.build(cfg, task, num_labels=num_labels, labels=labels)
  tcfg = model.config
  scan = tcfg.get("scan_layers", False)
  flat_model = model
  if scan:  # rules name layers unscanned; stacked below
    flat_cfg = ml_collections.ConfigDict(tcfg.to_dict())
    flat_cfg.scan_layers = False
    flat_model = tasks.build(flat_cfg, task, num_labels=num_labels, labels=labels)
  expected = _flatten(jax.eval_shape(lambda: tasks.init_params(flat_model,
                                                               jax.random.PRNGKey(0))))
  shapes = {k: tuple(v.shape) for k, v in expected.items()}
  tensors = Tensors(path, allow_nonfinite)  # headers only: tensors are read per rule
  tensors.strip_prefix(mapping.base_prefix(hf))
  flat, used = {}, set()
  try:
    for rule in expand(list(mapping.rules(tcfg)) + task_head_rules(tcfg, task, th), tcfg):
      flat.update(import_rule(rule, tensors, shapes, tcfg))
      used.update(k for k in rule.hf_keys if k in tensors)
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None
  unexpected = sorted(k for k in tensors if k not in used and not mapping.is_ignorable(k))
  if unexpected:
    raise ValueError(f"{path}: unexpected tensors not used by {archs[0]} in encoder-zoo: "
                     f"{', '.join(unexpected[:20])}")
  missing, extra = sorted(set(expected) - set(flat)), sorted(set(flat) - set(expected))
  if missing or extra:
    raise ValueError(f"{path}: the {hf['model_type']} task mapping does not cover the "
                     f"model's parameters; missing {missing}, extra {extra}")
  params = {}
  for key, spec in expected.items():
    _set(params, key, jax.numpy.asarray(flat[key], dtype=spec.dtype))
  if scan:
    fam = base.family(tcfg.get("family", "bert"))
    stack = getattr(fam, "scan_params", None) or (
        lambda c, p: layers.stack_layer_params(p, c.num_hidden_layers))
    params = stack(tcfg, params)
  return model, params


def to_hf(model: tasks.TaskModel, params, path: str, labels=None):
  """Writes `config.json` + `model.safetensors` that transformers' task class loads with
  no missing or unexpected keys; id2label / label2id from `labels` (default: the
  model's). Written to a temporary directory and renamed into place; `path` must be
  absent, empty or an earlier export (refused before any work otherwise, as `to_hf`)."""
  from encoders.hf import _MAPPINGS, check_export_target
  check_export_target(path)
  cfg = model.config
  mapping = _MAPPINGS.get(cfg.family) or next(
      (m for m in _MAPPINGS.values() if cfg.family in m.model_types), None)
  if mapping is None:
    raise ValueError(f"no Hugging Face mapping for family {cfg.family!r}")
  th = task_hf(mapping, cfg, model.task)
  if th is None:
    raise ValueError(f"transformers has no {model.task!r} model for family {cfg.family!r}")
  hf, _ = mapping.config_to_hf(cfg)
  hf["architectures"] = [th.architecture]
  labels = tuple(labels if labels is not None else model.labels)
  if model.task != "qa":
    if labels and len(labels) != model.num_labels:
      raise ValueError(f"{len(labels)} labels for a {model.num_labels}-way head")
    labels = labels or tuple(f"LABEL_{i}" for i in range(model.num_labels))
    hf["id2label"] = {str(i): name for i, name in enumerate(labels)}
    hf["label2id"] = {name: i for i, name in enumerate(labels)}
    if model.num_labels == 1:
      hf["problem_type"] = "regression"
  prefix = mapping.base_prefix(hf)
  if cfg.get("scan_layers", False):
    fam = base.family(cfg.get("family", "bert"))
    unstack = getattr(fam, "unscan_params", None) or (
        lambda c, p: layers.unstack_layer_params(p))
    params = unstack(cfg, params)
  flat = {k: np.asarray(jax.device_get(v), np.float32) for k, v in _flatten(params).items()}
  table = expand(list(mapping.rules(cfg)) + task_head_rules(cfg, model.task, th), cfg)
  return write_export(path, table, flat, cfg, prefix, hf, "HF task mapping")
