"""One arm of a study: for each pretraining seed, pretrain (or resume), score the
held-out metrics and the cross-task pair check, probe the frozen features (and those of
the same encoder at random init), optionally fine-tune; then the arm's row over seeds.

Everything an arm writes lives in <workdir>/arms/<arm>/:
  seed<k>/pretrain/        the trainer's work directory (checkpoints, metrics.jsonl, hf/)
  seed<k>/pair_<task>.json the seed's pair head scored on <task>'s held-out pairs
  seed<k>/probe.json       the linear probe on the pretrained encoder's features
  seed<k>/probe_random.json  the same probe on the encoder at random init (train.seed k),
                           exported to seed<k>/random_init/hf
  seed<k>/finetune_s<j>/   launch.finetune's work directory for fine-tuning seed j
  seed<k>/result.json      the seed's row (written last: the seed is done)
  timing.json              seconds spent per phase, summed over seeds and attempts
  result.json              the arm's row (written last: its presence means the arm is done)
Each part is skipped when its output exists, so a killed arm resumes where it stopped:
finished seeds are kept, pretraining resumes from its latest checkpoint (the trainer's
own resume), fine-tuning seed by seed (and from the epoch checkpoint inside a seed).
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

import jax
import ml_collections
import numpy as np

import objectives
from encoders import outdir
from launch import cli
from launch.trainer import finetuning
from launch import trainer
from launch.ablation import probe as probe_lib
from launch.ablation import stats
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

def downstream_file(ft, workdir, what="finetune") -> str:
  """The downstream table: a local file as given, or an archive's rows prepared once
  (in <workdir>/downstream/ for fine-tuning, <workdir>/probe_data/ for the probe)."""
  name = str(ft.get("dataset", ""))
  if os.path.splitext(name)[1] in (".csv", ".tsv", ".jsonl"):
    if not os.path.isfile(name):
      raise study_lib.StudyError(f"evaluate.{what}.dataset {name!r} does not exist")
    return os.path.abspath(name)
  if name not in ("rt", "bbc"):
    raise study_lib.StudyError(f"evaluate.{what}.dataset {name!r}: expected rt, bbc or a "
                               ".csv/.tsv/.jsonl path")
  out = os.path.join(workdir, "downstream" if what == "finetune" else "probe_data")
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


# ---- the probe ---------------------------------------------------------------------------

_PROBE_TASKS = {}


def probe_task(pcfg, workdir):
  """(texts, labels, train rows, eval rows, majority accuracy) of the probe's table, read
  once per process."""
  path = downstream_file(pcfg, workdir, "probe")
  key = (path, json.dumps(pcfg.to_dict() if hasattr(pcfg, "to_dict") else dict(pcfg),
                          sort_keys=True, default=str))
  if key not in _PROBE_TASKS:
    texts, y, _ = probe_lib.read_labelled(path, str(pcfg.get("text_column", "text")),
                                          str(pcfg.get("label_column", "label")))
    tr, ev = probe_lib.split(len(texts), float(pcfg.get("eval_fraction", 0.2)),
                             int(pcfg.get("split_seed", 0)), int(pcfg.get("max_train", -1)))
    _PROBE_TASKS[key] = (texts, y, tr, ev, probe_lib.majority(y[tr], y[ev]))
  return _PROBE_TASKS[key]


def probe_encoder(pcfg, workdir, hf_dir) -> dict:
  """The linear probe on `hf_dir`'s frozen features (probe.py)."""
  texts, y, tr, ev, maj = probe_task(pcfg, workdir)
  rows = np.concatenate([tr, ev])
  feats = probe_lib.features(hf_dir, [texts[i] for i in rows],
                             int(pcfg.get("seq_len", 128)), str(pcfg.get("pool", "mean")))
  out = probe_lib.probe(feats[:len(tr)], y[tr], feats[len(tr):], y[ev])
  out["majority"] = maj
  return out


def export_random_init(config, pretrain_dir, out_dir):
  """The arm's encoder at initialisation (the trainer's own init at config.train.seed,
  the seed's tokenizer), exported as the trainer exports a finished run."""
  c = checks.check(ml_collections.ConfigDict(config.to_dict()))
  c, pipeline = trainer.prepare(c, pretrain_dir)
  setup = trainer.build(c, pipeline.tokenizer)
  state = setup.init_state()
  host = jax.device_get({**state.params, **state.frozen})
  with outdir.atomic_dir(out_dir, "launch.ablate random init") as tmp:
    setup.objective.export(host, tmp, pipeline.tokenizer)


# ---- the arm ----------------------------------------------------------------------------

def _pretrain_record(pretrain_dir, key):
  for r in metrics_lib.read(pretrain_dir):
    if r.get("split") == key:
      return r
  return {}


# Held-out metrics of the trainer's eval -> the names in the study's rows.
EVAL_METRICS = {"rtd_accuracy": "rtd_accuracy",
                "rtd_all_original_accuracy": "rtd_never_flag",
                "rtd_replaced_accuracy": "rtd_recall", "rtd_flagged_accuracy": "rtd_precision",
                "nsp_accuracy": "own_nsp", "sop_accuracy": "own_sop"}
CURVE_KEYS = ("mlm_accuracy", "mlm_gen_accuracy", "rtd_accuracy",
              "rtd_all_original_accuracy", "rtd_replaced_accuracy", "nsp_accuracy",
              "sop_accuracy", "loss")


def curve(pretrain_dir) -> list:
  """The held-out evaluations over steps (the learning curve)."""
  out = []
  for r in metrics_lib.read(pretrain_dir):
    if r.get("split") == "eval":
      out.append({"step": r["step"], **{k: r[k] for k in CURVE_KEYS if k in r}})
  return out


def seed_dir(workdir, arm, seed) -> str:
  return os.path.join(workdir, "arms", arm, f"seed{int(seed)}")


def run_seed(study, arm, workdir, seed, steps, timer) -> dict:
  """Runs (or resumes) one pretraining seed of an arm and its evaluations; returns and
  writes the seed's row."""
  sdir = seed_dir(workdir, arm, seed)
  done = read_json(os.path.join(sdir, "result.json"))
  if done is not None:
    return done
  pretrain_dir = os.path.join(sdir, "pretrain")
  os.makedirs(pretrain_dir, exist_ok=True)
  config = study_lib.arm_config(study, arm, steps, seed)
  log.info("arm %s seed %d: %s, %d steps", arm, seed, study.arms[arm].config,
           int(config.train.steps))
  share_tokenizer(workdir, config, pretrain_dir, "in")
  t0 = time.perf_counter()
  out = trainer.train_and_evaluate(config, pretrain_dir)
  if out["setup"] is not None:  # it trained (a finished run returns at once)
    timer.add("pretrain_s", time.perf_counter() - t0)
  _default_sigterm()  # the trainer's save-and-stop handler would swallow a later SIGTERM
  if int(out["step"]) < int(config.train.steps):  # SIGTERM: checkpoint saved, stop here
    raise Interrupted(f"arm {arm!r} seed {seed}: pretraining stopped at step {out['step']} "
                      f"of {config.train.steps} (checkpoint saved); rerun to resume")
  share_tokenizer(workdir, config, pretrain_dir, "out")
  final = report.final_eval(pretrain_dir)
  run_rec = _pretrain_record(pretrain_dir, "run")
  base = _pretrain_record(pretrain_dir, "baseline")
  steps_done = int(config.train.steps)
  row = {"seed": int(seed), "steps": steps_done, "params": run_rec.get("params"),
         "step_flops": run_rec.get("step_flops"),
         "pretrain_flops": (run_rec.get("step_flops") or 0.0) * steps_done,
         "eval": final, "baseline": base, "curve": curve(pretrain_dir)}
  ev = study.evaluate
  if ev.get("mlm", True):
    key = "mlm_accuracy" if "mlm_accuracy" in final else "mlm_gen_accuracy"
    row["mlm_accuracy"] = final.get(key)
    row["mlm_baseline"] = base.get("mlm_majority_accuracy")
  for key, name in EVAL_METRICS.items():
    if final.get(key) is not None:
      row[name] = final[key]
  head = pair_head(config)
  for task in ev.get("pair_tasks", ()):
    path = os.path.join(sdir, f"pair_{task}.json")
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
  pcfg = ev.get("probe", None)
  if pcfg is not None:
    path = os.path.join(sdir, "probe.json")
    res = read_json(path)
    if res is None:
      t0 = time.perf_counter()
      res = probe_encoder(pcfg, workdir, os.path.join(pretrain_dir, "hf"))
      timer.add("probe_s", time.perf_counter() - t0)
      write_json(path, res)
    path = os.path.join(sdir, "probe_random.json")
    rnd = read_json(path)
    if rnd is None:
      t0 = time.perf_counter()
      hf_dir = os.path.join(sdir, "random_init", "hf")
      if not os.path.isfile(os.path.join(hf_dir, "config.json")):
        os.makedirs(os.path.dirname(hf_dir), exist_ok=True)
        export_random_init(config, pretrain_dir, hf_dir)
      rnd = probe_encoder(pcfg, workdir, hf_dir)
      timer.add("probe_s", time.perf_counter() - t0)
      write_json(path, rnd)
    row.update(probe_accuracy=res["accuracy"], probe_random=rnd["accuracy"],
               probe_gain=res["accuracy"] - rnd["accuracy"], probe_se=res["se"],
               probe_majority=res["majority"], probe_n=res["n_eval"], probe_l2=res["l2"],
               probe_random_l2=rnd["l2"])
  ft = ev.get("finetune", None)
  if ft is not None:
    data_file = downstream_file(ft, workdir)
    init_from = os.path.join(pretrain_dir, "hf")
    seeds = []
    for j in tuple(ft.seeds):
      ft_dir = os.path.join(sdir, f"finetune_s{j}")
      t0 = time.perf_counter()
      fresh = not os.path.isfile(os.path.join(ft_dir, "results.json"))
      seeds.append(finetune_seed(ft, init_from, data_file, j, ft_dir))
      if fresh:
        timer.add("finetune_s", time.perf_counter() - t0)
      log.info("arm %s seed %d fine-tuning seed %s: accuracy %.4f", arm, seed, j,
               seeds[-1]["accuracy"])
    row["finetune"] = seeds
    row["finetune_accuracy"] = float(np.mean([x["accuracy"] for x in seeds]))
  write_json(os.path.join(sdir, "result.json"), row)
  return row


AGGREGATED = ("mlm_accuracy", "mlm_baseline", "rtd_accuracy", "rtd_never_flag",
              "rtd_recall", "rtd_precision", "own_nsp", "own_sop", "pair_on_nsp",
              "pair_on_sop", "probe_accuracy", "probe_random", "probe_gain",
              "probe_majority", "finetune_accuracy")


def aggregate(study, arm, seed_rows, timing) -> dict:
  """The arm's row: each metric's mean, standard error and per-seed values."""
  a = study.arms[arm]
  first = seed_rows[0]
  row = {"arm": arm, "label": a.get("label", arm), "config": a.config,
         "overrides": list(a.get("overrides", ())), "steps": first["steps"],
         "params": first.get("params"), "step_flops": first.get("step_flops"),
         "pretrain_flops": first.get("pretrain_flops"),
         "objective": study_lib.arm_config(study, arm).objective.name,
         "seeds": [r["seed"] for r in seed_rows], "per_seed": seed_rows, "metrics": {}}
  for m in AGGREGATED:
    values = [r.get(m) for r in seed_rows]
    if any(v is None for v in values):
      continue
    mean, se = stats.mean_se(values)
    row["metrics"][m] = {"mean": mean, "se": se, "values": [float(v) for v in values]}
    row[m] = mean
  for task in ("nsp", "sop"):
    counts = [r.get(f"pair_on_{task}_count") for r in seed_rows]
    if all(c is not None for c in counts):
      row[f"pair_on_{task}_count"] = float(np.mean(counts))
  if all("finetune" in r for r in seed_rows):  # every fine-tuning run of every seed
    acc = np.asarray([x["accuracy"] for r in seed_rows for x in r["finetune"]])
    row.update(downstream_mean=float(acc.mean()),
               downstream_std=float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
               downstream_seeds=[float(x) for x in acc],
               finetune=[x for r in seed_rows for x in r["finetune"]])
  row["timing"] = dict(timing)
  row["wall_s"] = float(sum(timing.values()))
  return row


def run(study, arm, workdir, steps=None) -> dict:
  """Runs (or resumes) one arm, seed by seed; returns and writes its row."""
  workdir = os.path.abspath(workdir)  # Orbax checkpoints need absolute paths
  arm_dir = os.path.join(workdir, "arms", arm)
  os.makedirs(arm_dir, exist_ok=True)
  timer = Timer(arm_dir)
  rows = [run_seed(study, arm, workdir, k, steps, timer) for k in study_lib.seeds_of(study)]
  row = aggregate(study, arm, rows, timer.times)
  write_json(os.path.join(arm_dir, "result.json"), row)
  return row
