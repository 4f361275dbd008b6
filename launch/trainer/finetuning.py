"""Fine-tuning as a job of the one loop (loop.py): labelled rows in epochs (the task's
reader and encoder, launch/data/finetune_data.py), an evaluation at every epoch end that
keeps the best epoch, and the exports. The entry point is launch/finetune.py.

The loop gives it what pretraining has: start-up checks before anything is read or
written, the work directory's claim and lock, checkpoints every `checkpoint.every` steps
and at every epoch end, a SIGTERM that saves the place in the epoch (the same command
resumes there with the same batches and ends as an uninterrupted run), the NaN guard,
progress with ETA, TensorBoard and metrics.jsonl. The job adds `best/` and
`predictions.jsonl` (the best epoch), and at the end `hf/` (the best weights, loadable by
transformers' task class), `results.json` and the task's report (e.g. a confusion matrix).
"""
import hashlib
import json
import logging
import math
import os
import shutil
import time
from typing import Optional

import flax.linen as nn
import jax
import ml_collections
import numpy as np

import objectives
from encoders import outdir
from encoders import tasks
from launch import cli
from launch.data import badinput
from launch.data import finetune_data as fd
from launch.trainer import checks
from launch.trainer import fingerprint as fp_lib
from launch.trainer import guard as guard_lib
from launch.trainer import loop
from launch.trainer import sharding as shard_lib

log = logging.getLogger("encoder_zoo")
WRITER = "launch.finetune"  # the work directory's and its exports' marker
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json",
                   "special_tokens_map.json", "merges.txt", "vocab.json", "spiece.model")


class TokenizerInfo:
  """What trainer.build hands the objective: the vocabulary size and pad id."""

  def __init__(self, tok, pad_id):
    self.tok, self.pad_id, self.vocab_size = tok, pad_id, tok.get_vocab_size()


def predict(setup, task, params, arrays, batch_size, buckets=None):
  """The task's scored outputs (`task.output_fields`, numpy) on every row of `arrays`
  (padding rows dropped). Per-token outputs of batches cut to a length bucket are padded
  back to the arrays' width with `task.pad_value` (a value that predicts nothing)."""
  objective = setup.objective
  rules = shard_lib.rules_tuple(setup.config.mesh.rules)
  fields = task.output_fields

  @jax.jit
  def fwd(p, b):
    with nn.logical_axis_rules(rules):
      out = objective.forward(p, b)
    return {k: getattr(out, k) for k in fields}

  got = {k: [] for k in fields}
  keys = ("input_ids", "attention_mask", "token_type_ids")
  width = arrays["input_ids"].shape[1]
  for b in fd.batches({k: arrays[k] for k in keys + ("example_weight",)}, batch_size,
                      buckets=buckets):
    n = int(b["example_weight"].sum())
    with jax.set_mesh(setup.mesh):
      out = fwd(params, shard_lib.global_batch({k: b[k] for k in keys}, setup.batch_sharding))
    for k in fields:
      v = np.asarray(jax.device_get(out[k]))[:n]
      cut = b["input_ids"].shape[1]
      if cut < width and task.per_token:  # per-token: back to the width
        pad = [(0, 0), (0, width - cut)] + [(0, 0)] * (v.ndim - 2)
        v = np.pad(v, pad, constant_values=task.pad_value(k))
      got[k].append(v)
  return {k: np.concatenate(v) for k, v in got.items()}


def _copy_tokenizer(src_dir, dst_dir):
  for name in TOKENIZER_FILES:
    if src_dir and os.path.isfile(os.path.join(src_dir, name)):
      shutil.copy(os.path.join(src_dir, name), os.path.join(dst_dir, name))


def validate(config, devices=None) -> None:
  """Every fine-tuning setting that can be checked before any data is read or anything
  written: raises one cli.ConfigError naming each bad key, its value and the fix (the
  fine-tuning keys first, all in one line; then the trainer's checks of the shared
  sections)."""
  errs = fd.config_errors(config)
  if config.data.get("bad_data", "skip") not in badinput.POLICIES:
    errs.append(f"data.bad_data={config.data.get('bad_data')!r}; expected one of "
                f"{badinput.POLICIES}")
  if int(config.data.get("max_document_bytes", 1)) <= 0:
    errs.append(f"data.max_document_bytes={config.data.max_document_bytes} must be positive")
  if int(config.train.log_every) < 1:
    errs.append(f"train.log_every={config.train.log_every} must be >= 1")
  if int(config.checkpoint.get("every", 0) or 0) < 0:
    errs.append(f"checkpoint.every={config.checkpoint.every} must be >= 0 (0: epoch ends "
                "only)")
  if int(config.checkpoint.keep) < 1:
    errs.append(f"checkpoint.keep={config.checkpoint.keep} must be >= 1")
  if errs:
    raise cli.ConfigError("; ".join(errs))
  # The trainer's start-up checks (launch/trainer/checks.py): every enum and rate of the
  # shared sections, data.seq_len against the checkpoint's positions, the batch against
  # the devices. On a scratch copy: the steps come from the epochs later, and checkpoints
  # are taken at epoch ends when checkpoint.every is 0.
  scratch = ml_collections.ConfigDict(config.to_dict())
  scratch.train.steps = 10**9
  scratch.checkpoint.every = int(scratch.checkpoint.get("every", 0) or 0) or 10**9
  checks.check(scratch, devices)


def better(value, best) -> bool:
  """Whether an epoch's selection metric beats the best so far (None: no best yet); NaN
  never beats a number, and any number beats NaN."""
  if best is None:
    return True
  if math.isnan(float(value)):
    return False
  return math.isnan(float(best)) or value > best


def _write_atomic(path: str, text: str) -> None:
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as fp:
    fp.write(text)
  os.replace(tmp, path)


def _export(setup, params, init_from, path):
  """The HF directory of `params` (+ the checkpoint's tokenizer) at `path`, atomically:
  the old one (ours) stays until the new one is complete."""
  with outdir.atomic_dir(path, WRITER) as tmp:
    setup.objective.export(params, tmp)
    _copy_tokenizer(init_from, tmp)


def _fingerprint(config, train, labels):
  """What the run is (launch/trainer/fingerprint.py's settings: model, init_from, data,
  objective) and what it trains on: a hash of the encoded training rows, the label set,
  the task, packing and the shuffling seed. Saved with every checkpoint; a resume with a
  different one is refused, naming the keys."""
  f = config.finetune
  h = hashlib.sha256()
  for k in sorted(train):
    h.update(k.encode())
    h.update(np.ascontiguousarray(train[k]).tobytes())
  return dict(fp_lib.fingerprint(config), **{
      "finetune.train_rows": f"{len(train['example_weight'])} rows, sha256 "
                             f"{h.hexdigest()[:16]}",
      "finetune.labels": list(labels), "finetune.task": str(f.task),
      "finetune.packing": bool(f.get("packing", False)), "train.seed": int(config.train.seed)})


class _Epochs:
  """The training batches, epoch after epoch (each shuffled with seed train.seed * 1000 +
  epoch), from a place in an epoch; `get_state` is what a checkpoint keeps."""

  def __init__(self, job, epoch: int, batch: int):
    self.job, self.epoch, self.batch = job, epoch, batch
    self._it = None

  def __iter__(self):
    return self

  def __next__(self):
    job = self.job
    while True:
      if self._it is None:
        if self.batch == 0 or job.t_epoch is None:
          job.t_epoch = time.perf_counter()
        self._it = iter(fd.batches(job.train, job.global_batch,
                                   seed=job.seed * 1000 + self.epoch, buckets=job.buckets,
                                   pack=job.pack, start=self.batch,
                                   groups=job.task.width_groups))
      try:
        b = next(self._it)
      except StopIteration:
        self.epoch, self.batch, self._it = self.epoch + 1, 0, None
        continue
      self.batch += 1
      return b

  def place(self):
    """(epoch, batch): the next batch to train; an epoch's end is the next one's start."""
    if self.batch >= self.job.steps_per_epoch:
      return self.epoch + 1, 0
    return self.epoch, self.batch

  def get_state(self):
    epoch, batch = self.place()
    return self.job.position(epoch, batch)


class FinetuneJob(loop.Job):
  """Fine-tuning as a job of the one loop (launch/trainer/loop.py): labelled rows in
  epochs, an evaluation at every epoch end that keeps the best epoch's weights (`best/`,
  `predictions.jsonl`, `best.json`), and at the end `hf/` (the best weights),
  `results.json` and, for classification, `confusion_matrix.png`."""
  writer = WRITER
  export_writer = WRITER

  def __init__(self):
    self.data_report, self.history, self.best = {}, [], None
    self.train_tokens, self.train_time, self.epoch_times = 0, 0.0, []
    self.t_epoch = None
    self.batches = None

  def check(self, config, devices):
    config = ml_collections.ConfigDict(config.to_dict())
    validate(config, devices)  # one line naming bad settings, before anything is read
    return config

  def legacy(self, workdir):
    """An earlier version's run: results.json, or checkpoints/ with best.json."""
    return os.path.isfile(os.path.join(workdir, "results.json")) or (
        os.path.isdir(os.path.join(workdir, "checkpoints"))
        and os.path.isfile(os.path.join(workdir, "best.json")))

  def adopt(self, workdir):
    for sub in ("best", "hf"):  # its exports are ours too
      d = os.path.join(workdir, sub)
      if os.path.isfile(os.path.join(d, "config.json")) and not outdir.is_ours(d):
        outdir.write_marker(d, WRITER)

  def export_check(self, path):
    outdir.check_target(path, WRITER)

  def prepare(self, config, workdir):
    self.workdir, f = workdir, config.finetune
    for sub in ("best", "hf"):  # a user's files there: refused before any training
      outdir.check_target(os.path.join(workdir, sub), f"the run's {sub}/ export")
    objectives.prepare_config(config)  # model section + tokenizer path from init_from
    tok = fd.load_tokenizer(config.init_from, config.tokenizer.get("lowercase", False))
    t0 = time.perf_counter()
    self.train, self.evals, self.info, labels = fd.load_data(config, tok,
                                                             report=self.data_report)
    self.data_s = time.perf_counter() - t0
    f.labels = self.labels = tuple(labels)
    self.n_train = len(self.train["example_weight"])
    self.global_batch = int(config.data.global_batch)
    self.steps_per_epoch = -(-self.n_train // self.global_batch)
    self.epochs = int(f.epochs)
    config.train.steps = self.steps_per_epoch * self.epochs
    self.seed = int(config.train.seed)
    self.buckets = fd.length_buckets(f.get("length_buckets", "auto"),
                                     int(config.data.seq_len))
    self.task = tasks.get(f.task)
    self.select = fd.selection_metric(config)
    self.tokenizer = TokenizerInfo(tok, int(config.model.pad_token_id))
    self.fingerprint = _fingerprint(config, self.train, labels)
    self.config = config
    best_path = os.path.join(workdir, "best.json")
    if os.path.isfile(best_path):
      with open(best_path) as fp:
        self.best = json.load(fp)
    return config

  def start(self, setup):
    self.setup, self.pack, self.seen = setup, None, set()
    f = self.config.finetune
    if f.get("packing", False):
      unit = shard_lib.batch_unit(setup.mesh, self.config.mesh.rules,
                                  int(self.config.optimizer.get("grad_accum_steps", 1)))
      self.pack = {"task": f.task, "rows": fd.row_buckets(self.global_batch, unit),
                   "pad_id": int(self.config.model.pad_token_id), "seen": self.seen}
    self.batches = _Epochs(self, 0, 0)

  def resume(self, data_state, step, workdir):
    pos = dict(data_state or {})
    spe = self.steps_per_epoch
    if "batch" not in pos:  # an earlier version's epoch-end checkpoint: {"epoch": done}
      pos = {"epoch": step // spe, "batch": 0}
    if "fingerprint" in pos:
      refused, accepted = fp_lib.compare(pos["fingerprint"], self.fingerprint,
                                         fp_lib.parse_allowed(self.config.train.get(
                                             "allow_config_change", "")))
      if refused:
        raise cli.ConfigError(fp_lib.refusal(workdir, step, refused))
      if accepted:
        log.warning("resuming with changed settings (train.allow_config_change): %s",
                    fp_lib.describe(accepted))
    epoch, batch = int(pos["epoch"]), int(pos["batch"])
    if step != epoch * spe + batch:
      raise cli.ConfigError(
          f"{workdir}: the checkpoint of step {step} was saved at epoch {epoch + 1} batch "
          f"{batch}, which is step {epoch * spe + batch} with this run's {spe} steps per "
          "epoch: the training rows or data.global_batch changed since; use a new --workdir")
    self.history = list(pos.get("history", []))
    self.train_tokens = int(pos.get("train_tokens", 0))
    partial = float(pos.get("epoch_s", 0.0))  # the stopped epoch's time so far
    self.train_time = float(pos.get("train_s", 0.0)) - partial
    self.t_epoch = time.perf_counter() - partial
    self.epoch_times = list(pos.get("epoch_train_s", []))
    self.seen.update(int(r) for r in pos.get("packed_rows_seen", []))
    self.batches = _Epochs(self, epoch, batch)
    log.info("resuming at epoch %d, batch %d of %d (step %d)", epoch + 1, batch, spe, step)

  def train_iter(self, start_state=None):
    return self.batches

  def position(self, epoch, batch):
    """The data state a checkpoint keeps: the place in the epochs, the run so far
    (history, trained tokens and time) and what the run is (`_fingerprint`)."""
    spent = time.perf_counter() - self.t_epoch if batch and self.t_epoch is not None else 0.0
    return {"epoch": epoch, "batch": batch, "history": self.history,
            "train_tokens": self.train_tokens, "packed_rows_seen": sorted(self.seen),
            "train_s": self.train_time + spent, "epoch_s": spent,
            "epoch_train_s": self.epoch_times, "fingerprint": self.fingerprint}

  def record(self, setup):
    return {"task": self.config.finetune.task, "labels": list(self.labels),
            "train_rows": self.n_train, "eval_rows": len(self.evals["example_weight"]),
            "data_s": self.data_s, "data": self.data_report}

  def count_tokens(self, batch):
    """Real tokens of the examples trained on (a row that only fills the batch: none)."""
    n = 0
    for k in batch:  # every text of a row (a pair task's roles: <role>_attention_mask)
      if k.endswith("attention_mask"):
        mask = np.asarray(batch[k])
        mask = mask.reshape(len(mask), -1)
        if "example_weight" in batch:
          mask = mask * (np.asarray(batch["example_weight"]) > 0)[:, None]
        n += int(mask.sum())
    self.train_tokens += n
    return n

  def bad_data_skipped(self):
    return int(self.data_report.get("skipped_bad_rows", 0))

  def eval_due(self, step, total):
    return step % self.steps_per_epoch == 0

  checkpoint_due = eval_due  # every epoch end, with its evaluation in the history

  def evaluate(self, setup, state, step):
    jax.block_until_ready(state.params)
    self.epoch_times.append(time.perf_counter() - self.t_epoch)
    self.train_time += self.epoch_times[-1]
    epoch = step // self.steps_per_epoch
    outputs = predict(setup, self.task, state.params, self.evals, self.global_batch,
                      self.buckets)
    metrics, records = fd.score(self.config, outputs, self.info, self.labels)
    flat = {k: v for k, v in metrics.items() if isinstance(v, float)}
    self.history.append(dict(flat, epoch=epoch))
    if better(flat[self.select], self.best and self.best["metrics"][self.select]):
      self.best = {"epoch": epoch, "metrics": metrics, "selection_metric": self.select}
      if jax.process_index() == 0:
        host_params = jax.device_get(state.params)
        guard_lib.assert_finite_params(host_params, step, f"the export {self.workdir}/best")
        _export(setup, host_params, self.config.init_from,
                os.path.join(self.workdir, "best"))
        _write_atomic(os.path.join(self.workdir, "predictions.jsonl"),
                      "".join(json.dumps(r) + "\n" for r in records))
        _write_atomic(os.path.join(self.workdir, "best.json"), json.dumps(self.best))
    self.t_epoch = time.perf_counter()
    return dict(flat, epoch=epoch)

  def export(self, setup, host_params, path):
    """hf/: the best epoch's weights, config and tokenizer (a copy of best/)."""
    src = os.path.join(self.workdir, "best")
    for name in os.listdir(src):
      if name != outdir.MARKER and os.path.isfile(os.path.join(src, name)):
        shutil.copy(os.path.join(src, name), os.path.join(path, name))
      elif os.path.isdir(os.path.join(src, name)):  # an export's modules (1_Pooling/)
        shutil.copytree(os.path.join(src, name), os.path.join(path, name))

  def result(self):
    return {"best": self.best, "history": self.history, "workdir": self.workdir,
            "train_s": self.train_time, "train_tokens": self.train_tokens,
            "epoch_train_s": self.epoch_times,
            "train_tokens_per_s": (self.train_tokens / self.train_time
                                   if self.train_time else 0.0),
            "data": self.data_report}

  def finish(self, setup, host_params, workdir, writer):
    best = self.best
    self.task.report(best["metrics"], self.labels, workdir,
                     f"epoch {best['epoch']}: {self.select} {best['metrics'][self.select]:.3f}")
    _write_atomic(os.path.join(workdir, "results.json"), json.dumps(self.result(), indent=2))


def run(config, workdir: str, devices=None, stop_after: Optional[int] = None):
  """Fine-tunes as configured through the one loop; returns {"best", "history",
  "workdir", ...} (results.json's content) and "state".

  Resumable at any step: a SIGTERM (or `stop_after`: stop after that global step, as a
  preemption would) saves the state with its place in the epoch and returns
  {"stopped": True, "epoch", "batch", "step", ...}; the same call again continues from
  there and ends as an uninterrupted run would (the same batches, in the same order).

  Callers that are their own process should call hostmem.tune_malloc() before JAX
  starts, as main() does: without it every step re-faults XLA's temporary buffer."""
  job = FinetuneJob()
  out = loop.train_and_evaluate(config, workdir, job, devices, stop_after)
  if out["stopped"]:
    epoch, batch = job.batches.epoch, job.batches.batch
    log.info("stopped at epoch %d batch %d/%d (step %d): checkpoint saved; the same command "
             "resumes there", epoch + 1, batch, job.steps_per_epoch, out["step"])
    return dict(stopped=True, epoch=epoch, batch=batch, step=out["step"],
                workdir=job.workdir, history=job.history, best=job.best,
                data=job.data_report, state=out["state"])
  return dict(job.result(), state=out["state"])
