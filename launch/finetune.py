"""Fine-tuning entry point: a task head on a pretrained HF directory, with the one
trainer's setup (mesh, sharded init, exact-accumulation train step, optimizer, Orbax
checkpoints, metrics writer).

  python -m launch.finetune --config configs/finetune.py:sequence \
      --config.init_from=DIR --workdir /tmp/ft --config.finetune.train_file=train.csv

Before anything is read or written, `validate` checks the settings (one line naming each
bad key). The work directory must be new, empty or this project's (its marker file; a work
directory of an earlier version is recognised); a second run on it is refused while the
first holds its lock (launch/trainer/lock.py).

Data (launch/data/finetune_data.py): bad rows follow `data.bad_data` ("skip": counted in
the run summary and on the console; "error": stop naming the file and line); the label
set is `finetune.labels` or the training rows' labels, and an eval label outside it is an
error or skipped and counted (`finetune.unknown_eval_labels`).

Per epoch: train on the shuffled rows (seed train.seed * 1000 + epoch), evaluate on the
held-out rows (classification: accuracy, macro-F1; tagging: entity F1; QA: EM, F1;
regression: Pearson, Spearman), write the metrics (metrics.jsonl, the console), checkpoint
the state, and keep the best epoch's weights as an HF directory (`best/`, by
`selection_metric`). A SIGTERM saves the state with its place in the epoch (epoch, batch;
also every `checkpoint.every` steps when set), and the same command resumes there with the
same batches: the run ends as an uninterrupted one would. At the end: `hf/` (the best
weights, loadable by transformers' task class, with id2label and the checkpoint's
tokenizer), `predictions.jsonl` (the best epoch's eval predictions), `results.json`, and for
classification `confusion_matrix.png`. best/ and hf/ are replaced atomically (a temporary
directory renamed into place), and only when they are this run's own.
"""
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import threading
import time
from typing import Optional

import flax.linen as nn
import jax
import ml_collections
import numpy as np

import objectives
from encoders import outdir
from launch.data import badinput
from launch.data import finetune_data as fd
from objectives import finetune as ft_objective  # noqa: F401  (registers "finetune")
from objectives import losses
from objectives import task_metrics as tm

log = logging.getLogger("encoder_zoo")
WRITER = "launch.finetune"  # the work directory's and its exports' marker
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json",
                   "special_tokens_map.json", "merges.txt", "vocab.json", "spiece.model")


class _TokenizerInfo:
  """What trainer.build hands the objective: the vocabulary size and pad id."""

  def __init__(self, tok, pad_id):
    self.tok, self.pad_id, self.vocab_size = tok, pad_id, tok.get_vocab_size()


def predict(setup, params, arrays, batch_size, buckets=None):
  """Model outputs on every row of `arrays` (numpy, padding rows dropped). Batches cut
  to a length bucket have their per-token outputs padded back to the arrays' width:
  token logits with 0, QA start/end logits with -1e9 (no span starts or ends there)."""
  from launch.trainer import sharding as shard_lib
  objective = setup.objective
  rules = shard_lib.rules_tuple(setup.config.mesh.rules)
  fields = ("logits",) if objective.task != "qa" else ("start_logits", "end_logits")

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
      if cut < width and objective.task in ("token", "qa"):  # per-token: back to width
        pad = [(0, 0), (0, width - cut)] + [(0, 0)] * (v.ndim - 2)
        v = np.pad(v, pad, constant_values=-1e9 if k != "logits" else 0.0)
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
  from launch.cli import ConfigError
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
    raise ConfigError("; ".join(errs))
  # The trainer's start-up checks (launch/trainer/checks.py): every enum and rate of the
  # shared sections, data.seq_len against the checkpoint's positions, the batch against
  # the devices. On a scratch copy: the steps come from the epochs later, and checkpoints
  # are taken at epoch ends when checkpoint.every is 0.
  from launch.trainer import checks
  scratch = ml_collections.ConfigDict(config.to_dict())
  scratch.train.steps = 10**9
  scratch.checkpoint.every = int(scratch.checkpoint.get("every", 0) or 0) or 10**9
  checks.check(scratch, devices)


def _claim_workdir(workdir: str) -> str:
  """The work directory, created with the project's marker or accepted as ours (the
  marker; or a work directory of an earlier version: checkpoints/ with best.json, or
  results.json, whose best/ and hf/ exports are then ours too). A non-empty directory
  the project did not write is refused (outdir.OutputDirError) and left untouched; so is
  a best/ or hf/ inside ours that holds something else."""
  legacy = (os.path.isdir(workdir) and not outdir.is_ours(workdir) and (
      os.path.isfile(os.path.join(workdir, "results.json")) or (
          os.path.isdir(os.path.join(workdir, "checkpoints"))
          and os.path.isfile(os.path.join(workdir, "best.json")))))
  if legacy:
    outdir.write_marker(workdir, WRITER)
    for sub in ("best", "hf"):
      d = os.path.join(workdir, sub)
      if os.path.isfile(os.path.join(d, "config.json")) and not outdir.is_ours(d):
        outdir.write_marker(d, WRITER)
  workdir = outdir.claim_dir(workdir, WRITER, writers=(WRITER,))
  for sub in ("best", "hf"):
    outdir.check_target(os.path.join(workdir, sub), f"the run's {sub}/ export")
  return workdir


def _better(value, best) -> bool:
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


def run(config, workdir: str, devices=None, stop_after: Optional[int] = None):
  """Fine-tunes as configured; returns {"best", "history", "workdir", ...}.

  Resumable at any step: a SIGTERM (or `stop_after`: stop after that global step, as a
  preemption would) saves the state with its place in the epoch and returns
  {"stopped": True, "epoch", "batch", "step", ...}; the same call again continues from
  there and ends as an uninterrupted run would (the same batches, in the same order).

  Callers that are their own process should call launch.trainer.hostmem.tune_malloc() before
  JAX starts, as main() does: without it every step re-faults XLA's temporary buffer
  (measured in docs/finetune.md, "Fine-tuning")."""
  config = ml_collections.ConfigDict(config.to_dict())
  validate(config, devices)  # one line naming bad settings, before anything is read/written
  workdir = _claim_workdir(os.path.abspath(workdir))
  from launch.trainer import lock as lock_lib
  handle = lock_lib.acquire(workdir, enabled=jax.process_index() == 0)
  try:
    return _run(config, workdir, devices, stop_after)
  finally:
    lock_lib.release(handle)


def _log_train(writer, config, skips, per_step, step):
  """The train metrics of the steps since the last log (`per_step`: their host metric
  sums) as the pretraining loop writes them: under train.nonfinite_policy="stop" a
  skipped (non-finite) update raises; under "skip" the skipped updates are counted (and
  too many in a row raise guard.Diverged), the means are over the applied steps, and an
  interval with every update skipped shows no loss."""
  from launch.trainer import guard as guard_lib
  host = {}
  for s in per_step:
    host = losses.add_metrics(host, s)
  n = len(per_step)
  guard_lib.check(host, config.train, step, step - n)
  n_skipped = skips.observe(step - n + 1, per_step)
  applied = n - n_skipped
  lr, gnorm = float(host.pop("learning_rate")) / n, float(host.pop("grad_norm"))
  metrics = losses.finalize_metrics({k: float(v) for k, v in host.items()})
  if applied:
    metrics["grad_norm"] = gnorm / applied
  else:
    metrics = {k: v for k, v in metrics.items()
               if k.endswith("_count") or k in guard_lib.COUNTERS}
  if guard_lib.COUNTERS[0] in host:
    metrics.update(skipped_steps=n_skipped, applied_steps=applied, skipped_total=skips.total)
  writer.write(step, "train", dict(metrics, learning_rate=lr))


def _fingerprint(config, train, labels):
  """What the run is (launch/trainer/fingerprint.py's settings: model, init_from, data,
  objective) and what it trains on: a hash of the encoded training rows, the label set,
  the task, packing and the shuffling seed. Saved with every checkpoint; a resume with a
  different one is refused, naming the keys."""
  from launch.trainer import fingerprint as fp_lib
  f = config.finetune
  h = hashlib.sha256()
  for k in sorted(train):
    h.update(k.encode())
    h.update(np.ascontiguousarray(train[k]).tobytes())
  return dict(fp_lib.fingerprint(config), **{
      "finetune.train_rows": f"{len(train['example_weight'])} rows, sha256 "
                             f"{h.hexdigest()[:16]}",
      "finetune.labels": list(labels), "finetune.task": str(f.task),
      "finetune.regression": bool(f.regression),
      "finetune.packing": bool(f.get("packing", False)), "train.seed": int(config.train.seed)})


def _position(epoch, batch, history, train_tokens, pack, times, fingerprint):
  """The data state saved with a checkpoint: where in which epoch, the run so far, and
  what the run is (`_fingerprint`)."""
  return {"epoch": epoch, "batch": batch, "history": history, "train_tokens": train_tokens,
          "packed_rows_seen": sorted(pack["seen"]) if pack else [], **times,
          "fingerprint": fingerprint}


def _run(config, workdir, devices, stop_after):
  from launch import trainer
  from launch.trainer import checkpoint as ckpt_lib
  from launch.trainer import guard as guard_lib
  from launch.trainer import metrics as metrics_lib
  from launch.trainer import preemption as preemption_lib
  from launch.trainer import sharding as shard_lib
  from launch.trainer import compile_cache
  compile_cache.enable(config.train.get("compilation_cache_dir", ""), workdir)
  f = config.finetune
  objectives.prepare_config(config)  # model section + tokenizer path from init_from
  tok = fd.load_tokenizer(config.init_from, config.tokenizer.get("lowercase", False))
  t0 = time.perf_counter()
  data_report = {}
  train, evals, info, labels = fd.load_data(config, tok, report=data_report)
  f.labels = tuple(labels)
  n_train = len(train["example_weight"])
  gb = int(config.data.global_batch)
  steps_per_epoch = -(-n_train // gb)
  epochs = int(f.epochs)
  config.train.steps = steps_per_epoch * epochs
  setup = trainer.build(config, _TokenizerInfo(tok, int(config.model.pad_token_id)), devices)
  fingerprint = _fingerprint(config, train, labels)
  manager = ckpt_lib.Manager(os.path.join(workdir, "checkpoints"), config.checkpoint)
  restored = manager.restore_latest(setup.abstract_state)
  if restored is None:
    state, pos = setup.init_state(), {"epoch": 0, "batch": 0}
  else:
    state, pos = restored[0], dict(restored[1] or {})
    if "batch" not in pos:  # an earlier version's epoch-end checkpoint: {"epoch": done}
      pos = {"epoch": int(state.step) // steps_per_epoch, "batch": 0}
    if "fingerprint" in pos:
      from launch.cli import ConfigError
      from launch.trainer import fingerprint as fp_lib
      refused, accepted = fp_lib.compare(pos["fingerprint"], fingerprint, fp_lib.parse_allowed(
          config.train.get("allow_config_change", "")))
      if refused:
        manager.close()
        raise ConfigError(fp_lib.refusal(workdir, int(state.step), refused))
      if accepted:
        log.warning("resuming with changed settings (train.allow_config_change): %s",
                    fp_lib.describe(accepted))
    if int(state.step) != int(pos["epoch"]) * steps_per_epoch + int(pos["batch"]):
      from launch.cli import ConfigError
      manager.close()
      raise ConfigError(
          f"{workdir}: the checkpoint of step {int(state.step)} was saved at epoch "
          f"{int(pos['epoch']) + 1} batch {pos['batch']}, which is step "
          f"{int(pos['epoch']) * steps_per_epoch + int(pos['batch'])} with this run's "
          f"{steps_per_epoch} steps per epoch: the training rows or data.global_batch "
          "changed since; use a new --workdir")
    log.info("resuming at epoch %d, batch %d of %d (step %d)", int(pos["epoch"]) + 1,
             int(pos["batch"]), steps_per_epoch, int(state.step))
  writer = metrics_lib.MetricWriter(workdir, config.logging.tensorboard,
                                    is_main=jax.process_index() == 0)
  writer.write_json("run", {"task": f.task, "labels": list(labels), "train_rows": n_train,
                            "eval_rows": len(evals["example_weight"]),
                            "steps": config.train.steps, "data_s": time.perf_counter() - t0,
                            "data": data_report})
  kind = "regression" if f.regression else f.task
  select = fd.SELECTION[kind]
  best_path = os.path.join(workdir, "best.json")
  best = json.load(open(best_path)) if os.path.isfile(best_path) else None
  history = list(pos.get("history", []))
  train_tokens = int(pos.get("train_tokens", 0))
  train_time = float(pos.get("train_s", 0.0))
  epoch_times = list(pos.get("epoch_train_s", []))
  buckets = fd.length_buckets(f.get("length_buckets", "auto"), int(config.data.seq_len))
  pack = None
  if f.get("packing", False):
    unit = shard_lib.batch_unit(setup.mesh, config.mesh.rules,
                                int(config.optimizer.get("grad_accum_steps", 1)))
    pack = {"task": f.task, "rows": fd.row_buckets(gb, unit),
            "pad_id": int(config.model.pad_token_id),
            "seen": set(int(r) for r in pos.get("packed_rows_seen", []))}
  every = int(config.checkpoint.get("every", 0) or 0)
  log_every = int(config.train.log_every)
  skips = guard_lib.SkipTracker(config.train, int(pos.get("skipped_total", 0)))
  stop = preemption_lib.StopFlag()  # multi-process: all stop at one agreed step
  main_thread = threading.current_thread() is threading.main_thread()
  previous_handler = signal.getsignal(signal.SIGTERM) if main_thread else None
  stop.install()
  stopped = None
  try:
    for epoch in range(int(pos["epoch"]), epochs):
      first = int(pos["batch"]) if epoch == int(pos["epoch"]) else 0
      t_epoch, pending = time.perf_counter(), []
      for i, b in enumerate(fd.batches(train, gb, seed=int(config.train.seed) * 1000 + epoch,
                                       buckets=buckets, pack=pack, start=first), first):
        state, sums = setup.train_step(state, shard_lib.global_batch(b, setup.batch_sharding))
        pending.append(sums)
        train_tokens += int(b["attention_mask"].sum())
        step = epoch * steps_per_epoch + i + 1
        if stop_after is not None and step >= stop_after:
          stop.requested = True
        stop.poll(step)
        if (i + 1) % log_every == 0 or i + 1 == steps_per_epoch or stop.requested:
          _log_train(writer, config, skips, jax.device_get(pending), step)
          pending = []
        if stop.requested or (every and step % every == 0 and i + 1 < steps_per_epoch):
          guard_lib.check_pending(pending, config.train, step, step - len(pending))
          spent = time.perf_counter() - t_epoch
          manager.save(step, state, _position(
              epoch, i + 1, history, train_tokens, pack,
              {"train_s": train_time + spent, "epoch_train_s": epoch_times,
               "skipped_total": skips.total}, fingerprint))
        if stop.requested:
          stopped = {"epoch": epoch, "batch": i + 1, "step": step}
          break
      if stopped is not None:
        break
      jax.block_until_ready(state.params)
      epoch_times.append(time.perf_counter() - t_epoch)
      train_time += epoch_times[-1]
      outputs = predict(setup, state.params, evals, gb, buckets)
      metrics, records = fd.score(config, outputs, info, labels)
      flat = {k: v for k, v in metrics.items() if isinstance(v, float)}
      step = (epoch + 1) * steps_per_epoch
      writer.write(step, "eval", dict(flat, epoch=epoch + 1))
      history.append(dict(flat, epoch=epoch + 1))
      log.info("epoch %d/%d eval: %s", epoch + 1, epochs,
               "  ".join(f"{k} {v:.4f}" for k, v in sorted(flat.items())))
      if manager.latest_step() != step:  # else saved there already, by a stop
        manager.save(step, state, _position(epoch + 1, 0, history, train_tokens, pack,
                                            {"train_s": train_time,
                                             "epoch_train_s": epoch_times,
                                             "skipped_total": skips.total}, fingerprint))
      if _better(flat[select], best and best["metrics"][select]):
        best = {"epoch": epoch + 1, "metrics": metrics, "selection_metric": select}
        if jax.process_index() == 0:
          host_params = jax.device_get(state.params)
          guard_lib.assert_finite_params(host_params, step, f"the export {workdir}/best")
          _export(setup, host_params, config.init_from, os.path.join(workdir, "best"))
          _write_atomic(os.path.join(workdir, "predictions.jsonl"),
                        "".join(json.dumps(r) + "\n" for r in records))
          _write_atomic(best_path, json.dumps(best))
  finally:
    manager.close()
    if previous_handler is not None and not stop.multihost:
      signal.signal(signal.SIGTERM, previous_handler)
  if stopped is not None:
    log.info("stopped at epoch %d batch %d/%d (step %d): checkpoint saved; the same command "
             "resumes there", stopped["epoch"] + 1, stopped["batch"], steps_per_epoch,
             stopped["step"])
    writer.close()
    return dict(stopped, stopped=True, workdir=workdir, history=history, best=best,
                data=data_report, state=state)
  skips.check_fraction(config.train.steps, int(state.step))  # a mostly-skipped run: no hf/
  if jax.process_index() == 0:
    hf_dir = os.path.join(workdir, "hf")
    with outdir.atomic_dir(hf_dir, WRITER) as tmp:
      src = os.path.join(workdir, "best")
      for name in os.listdir(src):
        if name != outdir.MARKER and os.path.isfile(os.path.join(src, name)):
          shutil.copy(os.path.join(src, name), os.path.join(tmp, name))
    if f.task == "sequence" and not f.regression and "confusion" in best["metrics"]:
      tm.plot_confusion(np.asarray(best["metrics"]["confusion"]), labels,
                        os.path.join(workdir, "confusion_matrix.png"),
                        f"epoch {best['epoch']}: accuracy {best['metrics']['accuracy']:.3f}")
  result = {"best": best, "history": history, "workdir": workdir, "train_s": train_time,
            "train_tokens": train_tokens, "epoch_train_s": epoch_times,
            "train_tokens_per_s": train_tokens / train_time if train_time else 0.0,
            "data": data_report}
  if jax.process_index() == 0:
    _write_atomic(os.path.join(workdir, "results.json"), json.dumps(result, indent=2))
  writer.close()
  return dict(result, state=state)


def main(argv):
  del argv
  from launch.trainer import hostmem
  hostmem.tune_malloc()  # before JAX's CPU client starts (launch/trainer/hostmem.py)
  from absl import flags
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.INFO)
  for noisy in ("absl", "jax", "orbax", "grain", "etils"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  from launch import cli
  try:
    result = run(flags.FLAGS.config, flags.FLAGS.workdir)
  except (cli.ConfigError, outdir.OutputDirError) as e:  # settings / work directory: exit 2
    cli.fail(" ".join(str(e).split()))
  except (FloatingPointError, badinput.InputDataError) as e:  # diverged / the data: exit 1
    cli.fail(" ".join(str(e).split()), code=1)
  if result.get("stopped"):
    print(f"stopped at epoch {result['epoch'] + 1}, batch {result['batch']} (step "
          f"{result['step']}): checkpoint saved; run the same command to resume")
    return
  b = result["best"]
  print(f"best epoch {b['epoch']}: " + "  ".join(
      f"{k} {v:.4f}" for k, v in sorted(b["metrics"].items()) if isinstance(v, float)))


if __name__ == "__main__":
  from absl import app, flags
  from ml_collections import config_flags
  config_flags.DEFINE_config_file("config", None, "config file[:arg]", lock_config=True)
  flags.DEFINE_string("workdir", None, "run directory")
  flags.mark_flags_as_required(["config", "workdir"])
  from launch import cli
  app.run(main, flags_parser=cli.parse_flags)
