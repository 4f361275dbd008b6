"""The one training loop: checks, the work directory's claim, resume or init, steps,
metrics, evaluations, checkpoints, SIGTERM, export. Pretraining (pretraining.py), fine-
tuning (finetuning.py) and the ablation runner's stages all run through
`train_and_evaluate`; what differs is a `Job`: the batches, the evaluation and the export.
The loop never names an objective, a task or a batch key."""
import json
import logging
import os
import signal
import threading
from typing import Any, Dict, Iterator, Optional

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from encoders import hf as hf_lib
from encoders import outdir
from launch import cli
from launch.trainer import checkpoint as ckpt_lib
from launch.trainer import compile_cache
from launch.trainer import devices as devices_lib
from launch.trainer import fingerprint as fingerprint_lib
from launch.trainer import guard as guard_lib
from launch.trainer import lock as lock_lib
from launch.trainer import metrics as metrics_lib
from launch.trainer import phases as phases_lib
from launch.trainer import preemption as preemption_lib
from launch.trainer import report
from launch.trainer import sharding as shard_lib
from launch.trainer.state import Setup, build
from objectives import losses

log = logging.getLogger("encoder_zoo")
WORKDIR_WHAT = "work directory"
# What a work directory of this trainer holds (its own writes, and the tokenizer / data
# cache the ablation runner and the tests copy in before a run): a directory holding only
# these, without the ownership marker, is one an earlier version wrote.
TRAINER_ENTRIES = frozenset({
    "config.json", "checkpoints", "tokenizer", "data_cache", "metrics.jsonl", "tensorboard",
    "hf", "compilation_cache", "loss.png", fingerprint_lib.FILE, lock_lib.LOCK_FILE,
    outdir.MARKER, f".{fingerprint_lib.FILE}.tmp"})


class WorkdirRefused(cli.ConfigError, outdir.OutputDirError):
  """The work directory is not this run's to write (a user's, or another tool's)."""


class Job:
  """What a run trains on and does besides its steps. The loop calls, in order:
  `check` (before anything is read or written), `finished`, `legacy` / `adopt` (the
  work directory's claim), `prepare` (data, tokenizer; may set `train.steps`), `start`
  (the built setup), `resume` (a restored checkpoint's data state), `train_iter`, `record`, and per step
  `count_tokens`, `eval_due` / `evaluate`, `checkpoint_due`; at the end `export` and
  `finish`. Checkpoints save `train_iter(...).get_state()`: the job keeps what a resume
  needs (its place in the data, its history) there."""
  writer = WORKDIR_WHAT  # the work directory's marker (outdir.py)
  export_writer = hf_lib.HF_EXPORT  # the marker of its end-of-run export, hf/
  tokenizer = None  # vocabulary size and padding id for the objective (trainer.build)

  def check(self, config, devices) -> ml_collections.ConfigDict:
    raise NotImplementedError

  def finished(self, workdir: str, config) -> Optional[Dict[str, Any]]:
    """A finished run's result (a rerun writes nothing), else None."""
    return None

  def legacy(self, workdir: str) -> bool:
    """Whether a non-empty directory without the marker is an earlier version's run:
    by default one that holds only names of TRAINER_ENTRIES (config.json, checkpoints/)."""
    return set(os.listdir(workdir)) <= TRAINER_ENTRIES

  def adopt(self, workdir: str) -> None:
    """Marks what an earlier version's run directory holds as ours (under the lock): by
    default its export hf/, which the next export may then replace."""
    hf = os.path.join(workdir, "hf")
    if hf_lib.is_model_dir(hf) and not outdir.is_ours(hf):
      outdir.write_marker(hf, hf_lib.HF_EXPORT)

  def prepare(self, config, workdir: str):
    """-> the run's config (a private copy), once its data is ready."""
    raise NotImplementedError

  def start(self, setup: Setup) -> None:
    """Once the setup is built (before any restore): e.g. held-out batches, checked."""

  def resume(self, data_state, step: int, workdir: str) -> None:
    """A restored checkpoint's data state; raises cli.ConfigError if it is not this run's."""

  def train_iter(self, start_state=None) -> Iterator:
    raise NotImplementedError

  def record(self, setup: Setup) -> Dict[str, Any]:
    """The run record's data facts (metrics.jsonl "run")."""
    return {}

  def baselines(self, setup: Setup) -> Dict[str, Any]:
    return {}

  def count_tokens(self, batch) -> Optional[int]:
    """Trained tokens of a host batch (None: global_batch x seq_len)."""
    return None

  def bad_data_skipped(self) -> int:
    return 0

  def eval_due(self, step: int, total: int) -> bool:
    return False

  def evaluate(self, setup: Setup, state, step: int) -> Dict[str, float]:
    return {}

  def checkpoint_due(self, step: int, total: int) -> bool:
    return False

  def export(self, setup: Setup, host_params, path: str) -> None:
    """The end-of-run export into `path` (a temporary directory renamed into place)."""

  def export_check(self, path: str) -> None:
    """Run before the export is written and again at its swap (outdir.atomic_dir)."""
    hf_lib.check_export_target(path)

  def finish(self, setup: Setup, host_params, workdir: str, writer) -> None:
    """After the export (process 0): summaries, plots, what the user is told."""


def ownership(workdir: str, job: Optional[Job] = None) -> str:
  """Whether the trainer may write `workdir` (nothing is written here): "new" (absent or
  empty), "ours" (the marker), "legacy" (an earlier version's work directory: for
  pretraining only names of TRAINER_ENTRIES, e.g. config.json + checkpoints/) or "remote"
  (gs://: not checked). Raises cli.ConfigError (one line) for anything else: a user's
  directory."""
  job = job or Job()
  if "://" in workdir:
    log.info("work directory %s is not local: its ownership is not checked", workdir)
    return "remote"
  real = os.path.realpath(workdir)  # a link to a directory is that directory: never replaced
  try:
    outdir.check_target(real, WORKDIR_WHAT, writers=(job.writer,))
  except outdir.OutputDirError as e:
    if os.path.isdir(real) and not outdir.is_ours(real) and job.legacy(real):
      return "legacy"
    raise WorkdirRefused(str(e).replace(real, workdir)) from None
  return "ours" if outdir.is_ours(real) else "new"


def resume_check(config, workdir: str, fp: dict) -> dict:
  """A resume (a checkpoint in `workdir`) with settings other than the stored run's is a
  one-line cli.ConfigError listing them (old -> new); reads only. -> the differences that
  `train.allow_config_change` allows ({} for a new run)."""
  step = report.latest_checkpoint_step(workdir)
  if step is None:
    return {}
  record = fingerprint_lib.read(workdir)
  if record is not None:
    old, new = record.get("fingerprint", {}), fp
  else:  # an earlier version's work directory: its config.json
    old = fingerprint_lib.legacy(workdir)
    if old is None:
      log.info("work directory %s has a checkpoint but no run_fingerprint.json or "
               "config.json: its settings are not checked", workdir)
      return {}
    new = {k: v for k, v in fp.items() if k in old}
  allowed = fingerprint_lib.parse_allowed(config.train.get("allow_config_change", ""))
  refused, accepted = fingerprint_lib.compare(old, new, allowed)
  if refused:
    raise cli.ConfigError(fingerprint_lib.refusal(workdir, step, refused))
  if accepted:
    log.info("resuming with changed settings (train.allow_config_change): %s",
             fingerprint_lib.describe(accepted))
  return accepted


def _agree(error):
  """Multi-process: process 0 checked the work directory; every process raises its
  refusal (the others with a pointer to it), so none waits on a collective forever."""
  if jax.process_count() == 1:
    if error is not None:
      raise error
    return
  flag = multihost_utils.broadcast_one_to_all(np.int32(error is not None))
  if error is not None:
    raise error
  if int(flag):
    raise cli.ConfigError("process 0 refused the work directory (its error says why)")


def claim(config, workdir: str, fp: dict, job: Optional[Job] = None):
  """The checks before a run writes anything (process 0; the others agree): ownership,
  then resume settings, then the lock. -> (lock handle, accepted changes)."""
  job = job or Job()
  main = jax.process_index() == 0
  error, handle, accepted, kind = None, lock_lib.Handle(None, None), {}, "new"
  if main:
    try:
      kind = ownership(workdir, job)
      accepted = resume_check(config, workdir, fp)
      os.makedirs(workdir, exist_ok=True)
      handle = lock_lib.acquire(workdir)
      if kind == "legacy":
        log.info("work directory %s holds only what this trainer writes, without its "
                 "marker (an earlier version's): marking it as ours", workdir)
        job.adopt(workdir)
      if kind in ("new", "legacy"):
        outdir.write_marker(workdir, job.writer)
    except Exception as e:  # noqa: BLE001 - any failure: the other processes must hear of it
      lock_lib.release(handle)
      error = e
  _agree(error)
  if not main:
    os.makedirs(workdir, exist_ok=True)
  return handle, accepted


def train_and_evaluate(config, workdir: str, job: Job, devices=None,
                       stop_after: Optional[int] = None, phases=None) -> Dict[str, Any]:
  """Runs (or resumes) the run `job` describes (pretraining.PretrainJob: the config's
  data; finetuning.FinetuneJob: labelled rows) in `workdir` on `devices` (default: all);
  `stop_after` ends the run early at that step with a checkpoint, as a preemption would;
  `phases` (phases.py) times the parts of the step body.
  Returns {"state", "eval" (the last evaluation), "setup", "step", "stopped"}.

  Before anything is written: the job's checks, the work directory's ownership (never a
  user's directory), a resume's settings against the stored run's (fingerprint.py) and
  the lock (lock.py: one run per directory). config.json and run_fingerprint.json are
  written once the run is accepted (its state restored)."""
  config = job.check(config, devices)  # one-line errors before anything is written
  if "://" not in workdir:  # Orbax needs absolute local paths; gs:// paths pass through
    workdir = os.path.abspath(workdir)
  done = job.finished(workdir, config)
  if done is not None:  # a rerun of a finished run: say so, write nothing
    return done
  fp = fingerprint_lib.fingerprint(config)
  handle, accepted = claim(config, workdir, fp, job)
  try:
    return _run(config, workdir, devices, stop_after, phases, fp, accepted, job)
  finally:
    lock_lib.release(handle)


def _log_train(writer, config, skips, progress, pending, step, extra):
  """The train metrics of the steps since the last log (`pending`: their device sums):
  under train.nonfinite_policy="stop" a skipped update raises; under "skip" the skipped
  updates are counted (too many in a row raise guard.Diverged), the means are over the
  applied steps, and an interval with every update skipped shows no loss."""
  host = {}
  per_step = jax.device_get(pending)
  for s in per_step:
    host = losses.add_metrics(host, s)
  n = step - progress.last_step
  guard_lib.check(host, config.train, step, step - n)
  n_skipped = skips.observe(step - n + 1, per_step)
  applied = n - n_skipped
  lr, gnorm = float(host.pop("learning_rate")) / n, float(host.pop("grad_norm"))
  metrics = losses.finalize_metrics({k: float(v) for k, v in host.items()})
  if applied:
    metrics["grad_norm"] = gnorm / applied
  else:  # every step skipped: no loss to show (never a 0.0000 that reads as one)
    metrics = {k: v for k, v in metrics.items()
               if k.endswith("_count") or k in guard_lib.COUNTERS}
  if guard_lib.COUNTERS[0] in host:
    metrics.update(skipped_steps=n_skipped, applied_steps=applied, skipped_total=skips.total)
  metrics.update(learning_rate=lr, **extra, **progress.update(step))
  writer.write(step, "train", metrics)


def _run(config, workdir, devices, stop_after, phases, fp, accepted, job) -> Dict[str, Any]:
  compile_cache.enable(config.train.get("compilation_cache_dir", ""), workdir)
  config = job.prepare(config, workdir)
  setup = build(config, job.tokenizer, devices)
  objective = setup.objective
  spec = objective.batch_spec()
  job.start(setup)
  is_main = jax.process_index() == 0

  manager = ckpt_lib.Manager(os.path.join(workdir, "checkpoints"), config.checkpoint)
  try:
    restored = manager.restore_latest(setup.abstract_state)
    if restored is None:
      state, data_state = setup.init_state(), None
      log.info("starting a new run in %s", workdir)
    else:
      state, data_state = restored
      job.resume(data_state, int(state.step), workdir)  # refuses another run's checkpoint
      log.info("resumed from step %d", int(state.step))
  except BaseException:
    manager.close()
    raise
  train_iter = job.train_iter(data_state)
  if is_main:  # the run is accepted: now its settings are recorded
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump(json.loads(config.to_json_best_effort()), f, indent=2)
    fingerprint_lib.write(workdir, fp, accepted)
  writer = metrics_lib.MetricWriter(workdir, config.logging.tensorboard, is_main=is_main)

  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
  n_frozen = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.frozen))
  total_steps = int(config.train.steps)
  tokens_per_step = config.data.global_batch * config.data.seq_len
  step_flops = config.data.global_batch * objective.flops_per_example(config.data.seq_len)
  n_dev = setup.mesh.devices.size
  dtype = getattr(next(iter(objective.modules.values())).config, "dtype", "float32")
  peak = devices_lib.peak_flops(setup.mesh.devices.flat[0], dtype) * \
      devices_lib.peak_devices(setup.mesh.devices.flat)
  first = int(state.step)
  if first == 0 and is_main:
    writer.write_json("run", {"params": n_params, "frozen_params": n_frozen,
                              "devices": n_dev, "mesh": dict(setup.mesh.shape),
                              "objective": objective.describe(), "peak_flops": peak,
                              "step_flops": step_flops, "steps": total_steps,
                              "bad_data_skipped": job.bad_data_skipped(),
                              **job.record(setup)})
    base = job.baselines(setup)
    if base:
      writer.write_json("baseline", base)
  log.info("params %.2fM (+%.2fM frozen), %d devices, mesh %s, %d steps",
           n_params / 1e6, n_frozen / 1e6, n_dev, dict(setup.mesh.shape), total_steps)

  progress = metrics_lib.Progress(total_steps, first, tokens_per_step, step_flops, peak)
  prior = metrics_lib.skipped_before(workdir, first) if is_main and first else 0
  if jax.process_count() > 1:  # metrics.jsonl is process 0's: every process uses its count
    prior = int(multihost_utils.broadcast_one_to_all(np.int32(prior)))
  skips = guard_lib.SkipTracker(config.train, prior)
  stop = preemption_lib.StopFlag()  # multi-process: all stop at one agreed step
  in_main_thread = threading.current_thread() is threading.main_thread()
  previous_handler = signal.getsignal(signal.SIGTERM) if in_main_thread else None
  stop.install()
  last = min(total_steps, stop_after) if stop_after is not None else total_steps
  ph = phases or phases_lib.NULL
  pending, last_eval, step, tokens = [], {}, first, None
  try:
    for step in range(first + 1, last + 1):
      with ph("input"):
        local = next(train_iter)
        n_tok = job.count_tokens(local)
        if n_tok is not None:
          tokens = (tokens or 0) + n_tok
        local = spec.select(local)
        objective.check_batch(local)
      with ph("host_to_device"):
        batch = shard_lib.global_batch(local, setup.batch_sharding)
      with ph("step"):
        state, sums = setup.train_step(state, batch)
      ph.step_dispatched(step)
      pending.append(sums)  # device arrays; fetched only when logging (no per-step sync)
      # One reading of the flag per step: a SIGTERM that lands later in this step is
      # seen at the next one, never between the save decision and the exit.
      stop_now = stop.poll(step)
      stopping = stop_now or step == last
      if step % config.train.log_every == 0 or step == total_steps or (stopping and pending):
        with ph("device_wait"):
          jax.block_until_ready(pending)
        ph.start("metrics")
        if tokens is not None:
          progress.tokens_per_step = tokens / max(step - progress.last_step, 1)
          tokens = None
        _log_train(writer, config, skips, progress, pending, step,
                   {"bad_data_skipped": job.bad_data_skipped()})
        pending = []
        ph.stop("metrics")
      if job.eval_due(step, total_steps):
        with ph("eval"):
          last_eval = job.evaluate(setup, state, step)
          if last_eval:
            writer.write(step, "eval", last_eval)
      if (step % int(config.checkpoint.get("every", 0) or total_steps + 1) == 0
          or job.checkpoint_due(step, total_steps) or stopping):
        guard_lib.check_pending(pending, config.train, step, progress.last_step)
        with ph("checkpoint"):
          manager.save(step, state, train_iter.get_state())
      if stop_now:
        log.info("stop requested: checkpoint of step %d saved, exiting", step)
        break
  finally:
    with ph("checkpoint"):
      manager.close()
    if previous_handler is not None and not stop.multihost:
      signal.signal(signal.SIGTERM, previous_handler)
  ph.finish()
  result = {"state": state, "eval": last_eval, "setup": setup, "step": step,
            "stopped": step < total_steps}
  if step < total_steps:
    writer.close()
    return result
  skips.check_fraction(total_steps, step)  # a mostly-skipped run is not exported
  # Every process takes part in the gather; process 0 writes.
  host_params = multihost_utils.process_allgather({**state.params, **state.frozen},
                                                  tiled=True)
  if is_main:
    hf_dir = os.path.join(workdir, "hf")
    guard_lib.assert_finite_params(host_params, step, f"the export {hf_dir}")
    if "://" in hf_dir:
      job.export(setup, host_params, hf_dir)
    else:  # the whole export (weights, tokenizer, an RTD generator...) or nothing
      with outdir.atomic_dir(hf_dir, job.export_writer, check=job.export_check) as tmp:
        job.export(setup, host_params, tmp)
    writer.write_json("summary", {"step": step, "skipped_steps": skips.total,
                                  "bad_data_skipped": job.bad_data_skipped(),
                                  **job.record(setup)})
    job.finish(setup, host_params, workdir, writer)
  writer.close()
  return result
