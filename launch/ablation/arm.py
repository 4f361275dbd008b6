"""One arm of a study: pretrain (or resume), score the held-out metrics and the
cross-task pair check, fine-tune on the study's downstream task with several seeds.

Everything an arm writes lives in <workdir>/arms/<arm>/:
  pretrain/        the trainer's work directory (checkpoints, metrics.jsonl, hf/)
  pair_<task>.json the arm's pair head scored on <task>'s held-out pairs
  finetune_s<k>/   launch.finetune's work directory for seed k (results.json when done)
  timing.json      seconds spent per phase, summed over interrupted attempts
  result.json      the arm's row (written last: its presence means the arm is done)
Each part is skipped when its output exists, so a killed arm resumes where it stopped:
pretraining from its latest checkpoint (the trainer's own resume), fine-tuning seed by
seed (and from the epoch checkpoint inside a seed).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import threading
import time
import types

import ml_collections
import numpy as np

import objectives
from launch import cli
from launch.trainer import finetuning
from launch import trainer
from launch.ablation import study as study_lib
from launch.data import finetune_data as fd
from launch.data import real_datasets
from launch.trainer import checkpoint as ckpt_lib
from launch.trainer import checks
from launch.trainer import metrics as metrics_lib
from launch.trainer import report

log = logging.getLogger("encoder_zoo")
PAIR_OBJECTIVE = {"nsp": "mlm_nsp", "sop": "mlm_sop"}
PAIR_HEADS = ("nsp", "sop")


def read_json(path, default=None):
  """The JSON file at `path`, or `default` when there is none."""
  if not os.path.isfile(path):
    return default
  with open(path) as f:
    return json.load(f)


def write_json(path, payload):
  """Writes `payload` to `path` atomically (a temporary file renamed over it)."""
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(payload, f, indent=2, default=float)
  os.replace(tmp, path)


def _default_sigterm():
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Interrupted(RuntimeError):
  """A SIGTERM stopped the arm's pretraining early: nothing is evaluated."""


class Timer:
  """Per-phase seconds in timing.json, added to across attempts."""

  def __init__(self, arm_dir):
    self.path = os.path.join(arm_dir, "timing.json")
    self.times = read_json(self.path, {})

  def add(self, phase, seconds):
    self.times[phase] = self.times.get(phase, 0.0) + seconds
    write_json(self.path, self.times)


# ---- FLOPs ----------------------------------------------------------------------------

def step_flops(config) -> float:
  """Training FLOPs of one step of `config`, as the trainer counts them, without data:
  the objective built on a stand-in tokenizer of the configured vocabulary size."""
  c = ml_collections.ConfigDict(config.to_dict())
  v = int(c.tokenizer.vocab_size)
  c.model.vocab_size = v
  tok = types.SimpleNamespace(vocab_size=v, pad_id=0, mask_id=4, cls_id=2, sep_id=3)
  objective = objectives.get_objective(c, tok)
  return float(c.data.global_batch) * objective.flops_per_example(int(c.data.seq_len))


# ---- shared tokenizer -----------------------------------------------------------------

def _tokenizer_key(config) -> str:
  spec = {"tokenizer": config.tokenizer.to_dict(), "data": {
      k: config.data.get(k) for k in ("source", "files", "tfds_name", "max_documents",
                                      "eval_fraction", "eval_split", "text_key")}}
  return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def share_tokenizer(workdir, config, pretrain_dir, direction):
  """Arms with the same tokenizer and data settings train the tokenizer (and tokenize the
  corpus) once: "in" copies the study's copy into a new arm, "out" keeps the first
  arm's. Every arm then sees exactly the same tokenizer."""
  if config.tokenizer.kind != "sentencepiece_train":
    return
  shared = os.path.join(workdir, "shared", _tokenizer_key(config))
  for sub in ("tokenizer", "data_cache"):
    src, dst = ((shared, pretrain_dir) if direction == "in" else (pretrain_dir, shared))
    s, d = os.path.join(src, sub), os.path.join(dst, sub)
    if os.path.isdir(s) and not os.path.exists(d):
      tmp = f"{d}.tmp{os.getpid()}"
      shutil.copytree(s, tmp)
      try:
        os.rename(tmp, d)
      except OSError:  # another arm got there first
        shutil.rmtree(tmp, ignore_errors=True)


# ---- pair tasks -------------------------------------------------------------------------

def pair_head(config) -> str:
  """The model head that classifies pairs ("" when the arm has none)."""
  heads = [h for h in tuple(config.model.heads) if h in PAIR_HEADS]
  own = config.objective.get("pair_head", "") if "objective" in config else ""
  return own or (heads[0] if heads else "")


def pair_accuracy(config, pretrain_dir, task) -> dict:
  """The pretrained pair head scored on `task`'s held-out pairs (the same rows and masks
  the trainer evaluates on): the trainer's own eval, with the data and the objective
  switched to `task` and the arm's head kept."""
  head = pair_head(config)
  c = ml_collections.ConfigDict(config.to_dict())
  c.objective.name = PAIR_OBJECTIVE[task]
  c.objective.pair_head = head
  c.data.packing = "pairs"
  c.data.pair_task = task
  c = checks.check(c)  # as the trainer does (a warmup longer than the run is clamped)
  c, pipeline = trainer.prepare(c, pretrain_dir)  # the arm's cached tokenizer
  setup = trainer.build(c, pipeline.tokenizer)
  manager = ckpt_lib.Manager(os.path.join(pretrain_dir, "checkpoints"), c.checkpoint)
  restored = manager.restore_latest(setup.abstract_state)
  manager.close()
  if restored is None:
    raise RuntimeError(f"{pretrain_dir} has no checkpoint to score the {task} pairs with")
  spec = setup.objective.batch_spec()
  batches = [spec.select(b) for b in pipeline.eval_batches(c.train.eval_batches)]
  metrics = trainer.evaluate(setup, restored[0], batches)
  return {"task": task, "head": head, "accuracy": metrics.get(f"{task}_accuracy"),
          "count": metrics.get(f"{task}_count")}


# ---- downstream -------------------------------------------------------------------------

def downstream_file(ft, workdir) -> str:
  """The downstream table: a local file as given, or an archive's rows prepared once."""
  name = str(ft.dataset)
  if os.path.splitext(name)[1] in (".csv", ".tsv", ".jsonl"):
    if not os.path.isfile(name):
      raise study_lib.StudyError(f"evaluate.finetune.dataset {name!r} does not exist")
    return os.path.abspath(name)
  if name not in ("rt", "bbc"):
    raise study_lib.StudyError(f"evaluate.finetune.dataset {name!r}: expected rt, bbc or a "
                               ".csv/.tsv/.jsonl path")
  out = os.path.join(workdir, "downstream")
  path = os.path.join(out, f"{name}.jsonl")
  if not os.path.isfile(path):
    try:
      made, _ = real_datasets.prepare(name, out, int(ft.get("max_rows", -1)),
                                      int(ft.get("split_seed", 0)))
    except FileNotFoundError as e:
      raise study_lib.StudyError(str(e)) from None
    assert made == path
  return path


def majority_baseline(ft, workdir):
  """Accuracy of always predicting the most frequent training label on the held-out
  rows (the split launch.finetune makes), or None before the data exists."""
  try:
    path = downstream_file(ft, workdir)
  except (study_lib.StudyError, SystemExit):
    return None
  rows = fd.read_table(path, str(ft.get("text_column", "text")),
                       label=str(ft.get("label_column", "label")))
  tr, ev = fd.holdout(len(rows), float(ft.get("eval_fraction", 0.2)),
                      int(ft.get("split_seed", 0)))
  # Class names as fine-tuning makes them (1, "1" and 1.0 are one class); a tie goes to
  # the first name in sorted order, not to whatever a set's hash order gives this process.
  name = lambda i: fd.canonical_label(rows[i]["label"])
  labels = [name(i) for i in tr]
  counts = {n: labels.count(n) for n in sorted(set(labels) - {None})}
  top = max(counts, key=counts.get)
  return float(np.mean([name(i) == top for i in ev]))


def finetune_config(ft, init_from, data_file, seed):
  c = cli.load_config("finetune:sequence").unlock()
  c.init_from = init_from
  f = c.finetune
  f.train_file, f.eval_fraction = data_file, float(ft.get("eval_fraction", 0.2))
  f.split_seed, f.epochs = int(ft.get("split_seed", 0)), int(ft.get("epochs", 2))
  f.text_column = str(ft.get("text_column", "text"))
  f.label_column = str(ft.get("label_column", "label"))
  c.train.seed = int(seed)
  c.data.seq_len = int(ft.get("seq_len", 64))
  c.data.global_batch = int(ft.get("global_batch", 32))
  c.optimizer.learning_rate = float(ft.get("learning_rate", 1e-4))
  c.optimizer.warmup_steps = 0
  c.optimizer.clip_norm = 1.0
  c.train.log_every = 1000
  c.mesh.shape = (-1, 1, 1)
  c.logging.plot = False
  return c


def finetune_seed(ft, init_from, data_file, seed, ft_dir) -> dict:
  done = read_json(os.path.join(ft_dir, "results.json"))
  if done is None:
    done = finetuning.run(finetune_config(ft, init_from, data_file, seed), ft_dir)
  last = done["history"][-1]
  return {"seed": int(seed), "accuracy": last["accuracy"], "macro_f1": last.get("macro_f1"),
          "best_accuracy": done["best"]["metrics"]["accuracy"],
          "epochs": len(done["history"])}


# ---- the arm ----------------------------------------------------------------------------

def _pretrain_record(pretrain_dir, key):
  for r in metrics_lib.read(pretrain_dir):
    if r.get("split") == key:
      return r
  return {}


def run(study, arm, workdir, steps=None) -> dict:
  """Runs (or resumes) one arm; returns and writes its result row."""
  workdir = os.path.abspath(workdir)  # Orbax checkpoints need absolute paths
  arm_dir = os.path.join(workdir, "arms", arm)
  pretrain_dir = os.path.join(arm_dir, "pretrain")
  os.makedirs(pretrain_dir, exist_ok=True)
  config = study_lib.arm_config(study, arm, steps)
  timer = Timer(arm_dir)
  a = study.arms[arm]
  log.info("arm %s: %s, %d steps", arm, a.config, int(config.train.steps))

  share_tokenizer(workdir, config, pretrain_dir, "in")
  t0 = time.perf_counter()
  out = trainer.train_and_evaluate(config, pretrain_dir)
  if out["setup"] is not None:  # it trained (a finished run returns at once)
    timer.add("pretrain_s", time.perf_counter() - t0)
  _default_sigterm()  # the trainer's save-and-stop handler would swallow a later SIGTERM
  if int(out["step"]) < int(config.train.steps):  # SIGTERM: checkpoint saved, stop here
    raise Interrupted(f"arm {arm!r}: pretraining stopped at step {out['step']} of "
                      f"{config.train.steps} (checkpoint saved); rerun to resume")
  share_tokenizer(workdir, config, pretrain_dir, "out")
  final = report.final_eval(pretrain_dir)
  run_rec = _pretrain_record(pretrain_dir, "run")
  base = _pretrain_record(pretrain_dir, "baseline")
  steps_done = int(config.train.steps)
  row = {"arm": arm, "label": a.get("label", arm), "config": a.config,
         "overrides": list(a.get("overrides", ())), "steps": steps_done,
         "params": run_rec.get("params"), "step_flops": run_rec.get("step_flops"),
         "pretrain_flops": (run_rec.get("step_flops") or 0.0) * steps_done,
         "objective": config.objective.name, "eval": final, "baseline": base}
  ev = study.evaluate
  if ev.get("mlm", True):
    key = "mlm_accuracy" if "mlm_accuracy" in final else "mlm_gen_accuracy"
    row["mlm_accuracy"] = final.get(key)
    row["mlm_baseline"] = base.get("mlm_majority_accuracy")
  head = pair_head(config)
  for task in ev.get("pair_tasks", ()):
    path = os.path.join(arm_dir, f"pair_{task}.json")
    if not head:
      continue
    res = read_json(path)
    own = (config.data.packing == "pairs" and config.data.get("pair_task") == task
           and config.objective.name == PAIR_OBJECTIVE[task])
    if res is None and own and final.get(f"{task}_accuracy") is not None:
      # The arm's own task: the trainer's final eval already scored these pairs.
      res = {"task": task, "head": head, "accuracy": final[f"{task}_accuracy"],
             "count": final.get(f"{task}_count"), "from": "pretraining eval"}
      write_json(path, res)
    if res is None:
      t0 = time.perf_counter()
      res = pair_accuracy(config, pretrain_dir, task)
      timer.add("pair_eval_s", time.perf_counter() - t0)
      write_json(path, res)
    row[f"pair_on_{task}"] = res["accuracy"]
    row[f"pair_on_{task}_count"] = res["count"]
  ft = ev.get("finetune", None)
  if ft is not None:
    data_file = downstream_file(ft, workdir)
    init_from = os.path.join(pretrain_dir, "hf")
    seeds = []
    for seed in tuple(ft.seeds):
      ft_dir = os.path.join(arm_dir, f"finetune_s{seed}")
      t0 = time.perf_counter()
      fresh = not os.path.isfile(os.path.join(ft_dir, "results.json"))
      seeds.append(finetune_seed(ft, init_from, data_file, seed, ft_dir))
      if fresh:
        timer.add("finetune_s", time.perf_counter() - t0)
      log.info("arm %s seed %s: accuracy %.4f", arm, seed, seeds[-1]["accuracy"])
    acc = np.asarray([s["accuracy"] for s in seeds])
    row.update(finetune=seeds, downstream_mean=float(acc.mean()),
               downstream_std=float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
               downstream_seeds=[float(x) for x in acc])
  row["timing"] = dict(timer.times)
  row["wall_s"] = float(sum(timer.times.values()))
  write_json(os.path.join(arm_dir, "result.json"), row)
  return row
