"""Hugging Face task models <-> encoder-zoo task models, for every registered task and
every family that declares the task's head kind (encoders/tasks/base.py).

    model, params = encoders.hf.tasks.from_hf(dir)   # ...ForSequenceClassification etc.
    model.task, model.labels                          # "sequence", ("neg", "pos")
    encoders.hf.tasks.to_hf(model, params, out_dir)   # loads in transformers, id2label kept

The class is the family mapping's `task_prefix` + the task's `hf_suffix`. The base model's
tensors go through the family's own table (`Mapping.rules`) with the encoder heads the
task needs (BERT's pooler for a pooled head, nothing else); the head's tensors through
`head_rules`, from the transformers module names the family's Head gives. Import errors
name every missing, unexpected or mis-shaped tensor, as encoders.hf does.
"""
import jax
import ml_collections
from flax import traverse_util

from encoders import layers, tasks
from encoders.hf import stream
from encoders.hf.export import check_export_target, host_flat, unscanned, write_export
from encoders.hf.mapping import (family_hook, hf_config, mapping_for, task_classes,
                                 task_of)
from encoders.hf.rules import Rule, expand, import_rule


def head_rules(cfg, task: tasks.Task):
  """Rules of our `<task>_head/...` params vs the transformers modules the family's Head
  names (never under the base model's prefix)."""
  if task.head_kind is None:
    return []
  spec = tasks.head_spec(cfg, task.head_kind)
  parts = ["out"] + (["dense"] if spec.act is not None else []) + (["norm"] if spec.norm
                                                                    else [])
  missing = [p for p in parts if p not in spec.hf]
  if missing:
    raise ValueError(f"family {cfg.get('family')!r}: its {task.head_kind!r} Head names no "
                     f"transformers module (Head.hf) for the parts {missing}")
  head, rules = task.head_name, []
  for part in parts:
    mod = spec.hf[part]
    if part == "norm":
      rules.append(Rule(f"{head}/norm/scale", f"{mod}.weight", base=False))
      if spec.norm_bias:
        rules.append(Rule(f"{head}/norm/bias", f"{mod}.bias", base=False))
    else:
      rules.append(Rule(f"{head}/{part}/kernel", f"{mod}.weight", "linear", base=False))
      if part == "out" or spec.dense_bias:
        rules.append(Rule(f"{head}/{part}/bias", f"{mod}.bias", base=False))
  return rules


def is_task_model(path: str) -> bool:
  """Whether an HF directory's first architecture is a task model's class."""
  hf = hf_config(path)
  archs = hf.get("architectures") or []
  mapping = mapping_for(hf.get("model_type"))
  return bool(archs) and archs[0] in task_classes(mapping, mapping.config_from_hf(hf, ()))


def from_hf(path: str, *, allow_nonfinite: bool = False, **overrides):
  """An HF task-model directory (`...ForSequenceClassification`,
  `...ForTokenClassification`, `...ForQuestionAnswering`, or a registered task's class)
  -> (TaskModel, params); the labels from id2label. The files are checked as
  `encoders.from_hf` checks them (headers before any read, integer-stored tensors, and
  NaN / inf unless `allow_nonfinite=True`)."""
  hf = hf_config(path)
  mapping = mapping_for(hf.get("model_type"))
  archs = hf.get("architectures") or []
  if not archs:
    raise ValueError(f"{path}: config.json names no architecture; a task model needs one")
  try:
    task = task_of(mapping, hf, archs[0])
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None
  cfg = mapping.config_from_hf(hf, ())
  for key, value in overrides.items():
    cfg[key] = value
  labels = task.hf_labels(hf)
  num_labels = len(labels) or int(hf.get("num_labels", 2))
  model = tasks.build(cfg, task.name, num_labels=num_labels, labels=labels)
  tcfg = model.config
  scan = tcfg.get("scan_layers", False)
  flat_model = model
  if scan:  # rules name layers unscanned; stacked below
    flat_cfg = ml_collections.ConfigDict(tcfg.to_dict())
    flat_cfg.scan_layers = False
    flat_model = tasks.build(flat_cfg, task.name, num_labels=num_labels, labels=labels)
  expected = traverse_util.flatten_dict(jax.eval_shape(
      lambda: tasks.init_params(flat_model, jax.random.PRNGKey(0))), sep="/")
  shapes = {k: tuple(v.shape) for k, v in expected.items()}
  tensors = stream.Tensors(path, allow_nonfinite)  # headers only: read per rule
  tensors.strip_prefix(mapping.base_prefix(hf))
  flat, used = {}, set()
  try:
    for rule in expand(list(mapping.rules(tcfg)) + head_rules(tcfg, task), tcfg):
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
  params = traverse_util.unflatten_dict(
      {k: jax.numpy.asarray(flat[k], dtype=spec.dtype) for k, spec in expected.items()},
      sep="/")
  if scan:
    stack = family_hook(tcfg, "scan_params",
                        lambda c, p: layers.stack_layer_params(p, c.num_hidden_layers))
    params = stack(tcfg, params)
  return model, params


def to_hf(model: tasks.TaskModel, params, path: str, labels=None):
  """Writes `config.json` + `model.safetensors` that transformers' task class loads with
  no missing or unexpected keys; id2label / label2id from `labels` (default: the
  model's). Written to a temporary directory and renamed into place; `path` must be
  absent, empty or an earlier export (refused before any work otherwise, as `to_hf`)."""
  check_export_target(path)
  cfg, task = model.config, tasks.get(model.task)
  mapping = mapping_for(cfg.family)
  arch = mapping.task_architecture(cfg, task)
  if arch is None:
    raise ValueError(f"no transformers class for the {model.task!r} task of family "
                     f"{cfg.family!r}")
  hf, _ = mapping.config_to_hf(cfg)
  hf["architectures"] = [arch]
  hf.update(task.hf_entries(tuple(labels if labels is not None else model.labels),
                            model.num_labels))
  flat = host_flat(unscanned(cfg, params))
  table = expand(list(mapping.rules(cfg)) + head_rules(cfg, task), cfg)
  return write_export(path, table, flat, cfg, mapping.base_prefix(hf), hf, "HF task mapping")
