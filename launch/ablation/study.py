"""A study config: which paper and table it reproduces, its arms, how each arm is
evaluated, the paper's numbers for the same arms, and the scale knobs.

A study file (configs/ablations/study_*.py) defines `get_config()` returning a ConfigDict:

  name        short name (the output files use it)
  paper       e.g. "RoBERTa (Liu et al. 2019)"
  table       e.g. "Table 2"
  question    one line: what the study asks
  scale       knobs applied to every arm: variant (substituted for `{variant}` in the arm
              config strings), steps, seq_len, global_batch (0 = the arm config's own),
              checkpoint_every, learning_rate (0 = the arm config's own), seeds
              (the pretraining seeds: each arm is pretrained once per seed, with
              train.seed and data.shuffle_seed = the seed, in arms/<arm>/seed<k>/;
              default (0,)), evals (held-out evaluations during pretraining, for the
              learning curves; default 4)
  order       the arms' run order (optional; ConfigDict sorts its keys)
  arms        ConfigDict name -> arm:
                config      "FILE[:ARG]" of a pretraining config, `{variant}` allowed
                overrides   ("section.key=value", ...) on that locked config
                label       the paper's name for the arm
                note        how the arm maps onto the paper's (say when approximated)
                paper       the paper's numbers, one string per `paper_columns` entry
                            ("not checked" where unsure: never a guessed number)
                match_flops_of  another arm's name: this arm's steps are set so that
                            its pretraining FLOPs equal that arm's (ELECTRA vs BERT)
  paper_columns  the paper's metric names for `arms.*.paper`
  paper_compare  which paper column our downstream task stands in for (e.g. "SST-2")
  not_run     ("PAPER ARM: why it is not run here", ...)
  compare     (optional) the paper's claim tested with a paired test over the seeds:
                higher, lower   the arms the paper says score higher / lower on `metric`
                metric          one of report.METRICS (probe_accuracy, pair_on_sop, ...)
                paper           the paper's direction in words (with its numbers)
  evaluate    mlm (report held-out MLM accuracy), pair_tasks (score an arm's pair head on
              each of these tasks' held-out pairs: the cross-task check), probe (a
              frozen-feature linear probe of each pretrained encoder and of the same
              encoder at random init, launch/ablation/probe.py: dataset, max_rows,
              eval_fraction, split_seed, max_train, seq_len, pool ("mean" | "cls" | "mlm"),
              text_column, label_column), finetune (optional: dataset: "rt" | "bbc"
              (launch/data/real_datasets.py's archives) or a .csv/.tsv/.jsonl path;
              max_rows, eval_fraction, split_seed, epochs, seeds, seq_len, global_batch,
              learning_rate, text_column, label_column)
"""
from __future__ import annotations

import ast
import hashlib
import json
import os

import ml_collections

from launch import cli
from launch.ablation import probe as probe_lib

REQUIRED = ("name", "paper", "table", "arms", "evaluate")
# ConfigDict lists its keys sorted: `order` (optional) gives the arms' run order.
ARM_KEYS = ("config", "overrides", "label", "note", "paper", "match_flops_of")
SCALE_KEYS = ("variant", "steps", "seq_len", "global_batch", "checkpoint_every",
              "learning_rate", "seeds", "evals")
FINETUNE_KEYS = ("dataset", "max_rows", "eval_fraction", "split_seed", "epochs", "seeds",
                 "seq_len", "global_batch", "learning_rate", "text_column", "label_column")
PROBE_KEYS = ("dataset", "max_rows", "eval_fraction", "split_seed", "max_train", "seq_len",
              "pool", "text_column", "label_column")
COMPARE_KEYS = ("higher", "lower", "metric", "paper")
EVALUATE_KEYS = ("mlm", "pair_tasks", "probe", "finetune")
# Per-seed metrics a comparison may test (launch/ablation/report.py aggregates them).
METRICS = ("mlm_accuracy", "rtd_accuracy", "rtd_recall", "rtd_precision", "pair_on_nsp",
           "pair_on_sop", "probe_accuracy", "probe_gain", "finetune_accuracy")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class StudyError(ValueError):
  """A study config that cannot run, said in one line."""


def _keys(node) -> list:
  try:
    return list(node.keys())
  except AttributeError:
    return []


def _only_known(name, where, node, known) -> None:
  """StudyError naming the first key of `node` that is not in `known`."""
  for key in _keys(node):
    if key not in known:
      raise StudyError(f"study {name!r}: unknown {where} key {key!r}; known: "
                       f"{', '.join(known)}")


def validate(study) -> None:
  """Raises StudyError naming the first missing field, unknown key or bad reference."""
  name = study.get("name", "?") if hasattr(study, "get") else "?"
  for field in REQUIRED:
    if field not in _keys(study) or study[field] in (None, "", ()):
      raise StudyError(f"study {name!r} has no {field!r} (a study needs "
                       f"{', '.join(REQUIRED)})")
  if not _keys(study.arms):
    raise StudyError(f"study {name!r}: arms is empty")
  order = tuple(study.get("order", ()))
  if order and sorted(order) != sorted(_keys(study.arms)):
    raise StudyError(f"study {name!r}: order {order} must list each arm once "
                     f"({', '.join(sorted(_keys(study.arms)))})")
  arms = arm_names(study)
  _only_known(name, "scale", study.get("scale", {}), SCALE_KEYS)
  columns = tuple(study.get("paper_columns", ()))
  for arm in arms:
    a = study.arms[arm]
    for key in _keys(a):
      if key not in ARM_KEYS:
        raise StudyError(f"study {name!r}: arm {arm!r} has unknown key {key!r}; known: "
                         f"{', '.join(ARM_KEYS)}")
    if not a.get("config", ""):
      raise StudyError(f"study {name!r}: arm {arm!r} has no 'config'")
    paper = tuple(a.get("paper", ()))
    if paper and len(paper) != len(columns):
      raise StudyError(f"study {name!r}: arm {arm!r} gives {len(paper)} paper numbers for "
                       f"{len(columns)} paper_columns {columns}")
    ref = a.get("match_flops_of", "")
    if ref and (ref not in arms or arms.index(ref) >= arms.index(arm)):
      raise StudyError(f"study {name!r}: arm {arm!r} matches the FLOPs of {ref!r}, which "
                       "is not an arm listed before it")
  seeds = tuple(study.get("scale", {}).get("seeds", (0,)) or ())
  if not seeds or len(set(seeds)) != len(seeds) or not all(
      isinstance(k, int) and k >= 0 for k in seeds):
    raise StudyError(f"study {name!r}: scale.seeds={seeds!r} must be distinct integers >= 0")
  ev = study.evaluate
  _only_known(name, "evaluate", ev, EVALUATE_KEYS)
  probe = ev.get("probe", None)
  if probe is not None:
    _only_known(name, "evaluate.probe", probe, PROBE_KEYS)
    if not probe.get("dataset", ""):
      raise StudyError(f"study {name!r}: evaluate.probe has no 'dataset'")
    if probe.get("pool", "mean") not in probe_lib.POOLS:
      raise StudyError(f"study {name!r}: evaluate.probe.pool={probe.pool!r}; expected one "
                       f"of {', '.join(probe_lib.POOLS)}")
  cmp = study.get("compare", None)
  if cmp is not None and _keys(cmp):
    _only_known(name, "compare", cmp, COMPARE_KEYS)
    for key in ("higher", "lower"):
      if cmp.get(key, "") not in arms:
        raise StudyError(f"study {name!r}: compare.{key}={cmp.get(key, '')!r} is not an arm "
                         f"({', '.join(arms)})")
    if cmp.higher == cmp.lower:
      raise StudyError(f"study {name!r}: compare.higher and compare.lower are both "
                       f"{cmp.higher!r}")
    if cmp.get("metric", "") not in METRICS:
      raise StudyError(f"study {name!r}: compare.metric={cmp.get('metric', '')!r}; choose "
                       f"from {', '.join(METRICS)}")
  ft = ev.get("finetune", None)
  if ft is not None:
    _only_known(name, "evaluate.finetune", ft, FINETUNE_KEYS)
    if not ft.get("dataset", ""):
      raise StudyError(f"study {name!r}: evaluate.finetune has no 'dataset'")
    if not tuple(ft.get("seeds", ())):
      raise StudyError(f"study {name!r}: evaluate.finetune.seeds is empty")
  for task in ev.get("pair_tasks", ()):
    if task not in ("nsp", "sop"):
      raise StudyError(f"study {name!r}: evaluate.pair_tasks has {task!r}; expected nsp, sop")


def arm_names(study) -> list:
  """The arms in run order (`order`, else the keys)."""
  return list(study.get("order", ())) or _keys(study.arms)


def _parse_value(text: str):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def _set(config, dotted: str, value, where: str):
  msg = cli.unknown_key(config, dotted)
  if msg:
    raise StudyError(f"{where}: {msg}")
  *parents, leaf = dotted.split(".")
  node = config
  for p in parents:
    node = node[p]
  old = node[leaf]
  if isinstance(old, tuple) and isinstance(value, (list, str)):
    value = tuple(value) if isinstance(value, list) else (value,)
  try:
    node[leaf] = value
  except (TypeError, ValueError) as e:
    raise StudyError(f"{where}: {dotted}={value!r}: {e}") from None


def seeds_of(study) -> tuple:
  """The pretraining seeds (scale.seeds; one seed, 0, when not given)."""
  return tuple(int(k) for k in study.get("scale", {}).get("seeds", (0,)))


def arm_config(study, arm: str, steps: int | None = None, seed: int | None = None):
  """The arm's pretraining config: its config file, the study's scale, its overrides
  (all checked: an unknown key is a StudyError naming the arm); with `seed`, that
  pretraining seed (train.seed: init, masking, dropout; data.shuffle_seed: the data
  order and the pairs), the same for every arm so that arms pair by seed."""
  a, s = study.arms[arm], study.get("scale", ml_collections.ConfigDict())
  spec = a.config.replace("{variant}", str(s.get("variant", "tiny")))
  path, _, arg = spec.partition(":")
  if not os.path.isabs(path) and not os.path.isfile(path):
    path = os.path.join(ROOT, path)
  where = f"arm {arm!r} ({spec})"
  try:
    config = cli.load_config(f"{path}:{arg}" if arg else path)
  except (cli.ConfigError, ValueError) as e:
    raise StudyError(f"{where}: {e}") from None
  config = ml_collections.ConfigDict(config.to_dict())  # a private copy, unlocked ...
  config.lock()  # ... then locked: overrides may only change existing keys
  knobs = {"steps": "train.steps", "seq_len": "data.seq_len",
           "global_batch": "data.global_batch", "checkpoint_every": "checkpoint.every",
           "learning_rate": "optimizer.learning_rate"}
  for knob, key in knobs.items():
    if s.get(knob, 0):
      _set(config, key, s[knob], f"study scale {knob}")
  for item in a.get("overrides", ()):
    key, eq, value = str(item).partition("=")
    if not eq:
      raise StudyError(f"{where}: override {item!r} is not section.key=value")
    _set(config, key.strip(), _parse_value(value.strip()), where)
  if steps is not None:
    config.train.steps = int(steps)
  if seed is not None:
    config.train.seed = int(seed)
    config.data.shuffle_seed = int(seed)
  n = int(config.train.steps)
  evals = max(1, int(s.get("evals", 4)))
  config.train.eval_every = max(1, n // evals)  # the learning curve; the last at step n
  config.checkpoint.every = min(int(config.checkpoint.every), max(1, n // 2))
  config.logging.tensorboard = False
  config.logging.plot = False
  return config


def check_all(study) -> None:
  """Every arm's config loads with its overrides (before anything runs)."""
  validate(study)
  for arm in arm_names(study):
    arm_config(study, arm)


def fingerprint(study, arm: str, config) -> str:
  """What decides an arm's results: its resolved config and the evaluation settings."""
  payload = {"config": json.loads(config.to_json_best_effort()),
             "evaluate": json.loads(study.evaluate.to_json_best_effort())}
  return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def load(spec: str):
  """The study ConfigDict of `FILE[:ARG]`, validated."""
  try:
    study = cli.load_config(spec)
  except cli.ConfigError as e:
    raise StudyError(str(e)) from None
  validate(study)
  return study

