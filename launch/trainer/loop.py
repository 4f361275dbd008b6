"""The training loop: input, setup, resume or init, steps, metrics, evals, checkpoints,
SIGTERM, export. It knows the objective only through its interface (objectives/base.py):
it never names an objective or a batch key."""
import json
import logging
import os
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

import objectives
from encoders import hf as hf_lib
from encoders import outdir
from launch import cli
from launch import data as data_lib
from launch.data import badinput
from launch.trainer import devices as devices_lib
from launch.trainer import checkpoint as ckpt_lib
from launch.trainer import checks
from launch.trainer import compile_cache
from launch.trainer import demo
from launch.trainer import fingerprint as fingerprint_lib
from launch.trainer import guard as guard_lib
from launch.trainer import lock as lock_lib
from launch.trainer import metrics as metrics_lib
from launch.trainer import phases as phases_lib
from launch.trainer import preemption as preemption_lib
from launch.trainer import report
from launch.trainer import sharding as shard_lib
from launch.trainer.state import Setup, build
from launch.trainer.step import eval_key
from objectives import losses

log = logging.getLogger("encoder_zoo")
BASELINE_TRAIN_BATCHES = 50  # training batches the baselines count frequencies on
WORKDIR_WHAT = "work directory"
# What a work directory of this trainer holds (its own writes, and the tokenizer / data
# cache the ablation runner and the tests copy in before a run): a directory holding only
# these, without the ownership marker, is one an earlier version wrote.
TRAINER_ENTRIES = frozenset({
    "config.json", "checkpoints", "tokenizer", "data_cache", "metrics.jsonl", "tensorboard",
    "hf", "compilation_cache", "loss.png", fingerprint_lib.FILE, lock_lib.LOCK_FILE,
    outdir.MARKER, f".{fingerprint_lib.FILE}.tmp"})


def adopt_tokenizer(config, tokenizer):
  """The tokenizer decides the vocabulary and the padding id of a new model. A model
  that comes from a checkpoint (`init_from`) keeps its table: the tokenizer must fit."""
  m = config.model
  if config.get("init_from", ""):
    if tokenizer.vocab_size > m.vocab_size or tokenizer.pad_id != m.pad_token_id:
      raise ValueError(
          f"init_from={config.init_from!r}: the tokenizer (vocab {tokenizer.vocab_size}, "
          f"pad {tokenizer.pad_id}) does not fit the model (vocab_size {m.vocab_size}, "
          f"pad_token_id {m.pad_token_id})")
    return
  if m.vocab_size != tokenizer.vocab_size or m.pad_token_id != tokenizer.pad_id:
    log.info("model.vocab_size %d -> %d and pad_token_id %d -> %d from the tokenizer",
             m.vocab_size, tokenizer.vocab_size, m.pad_token_id, tokenizer.pad_id)
  m.vocab_size = tokenizer.vocab_size
  m.pad_token_id = tokenizer.pad_id


def prepare(config, workdir: str):
  """A private copy of the config with the objective's changes (`init_from`), the data
  pipeline, and the model sized to the tokenizer. -> (config, pipeline)"""
  config = ml_collections.ConfigDict(config.to_dict())  # a private, unlocked copy
  objectives.prepare_config(config)
  try:
    pipeline = data_lib.make_pipeline(config, workdir)
  except badinput.InputDataError:
    raise
  except ValueError as e:  # the data cannot train this run (named): one line at the CLI
    raise badinput.InputDataError(" ".join(str(e).split())) from e
  adopt_tokenizer(config, pipeline.tokenizer)
  return config, pipeline


def evaluate(setup: Setup, state, eval_batches) -> Dict[str, float]:
  total = {}
  for i, b in enumerate(eval_batches):
    sums = setup.eval_step(state, shard_lib.global_batch(b, setup.batch_sharding),
                           jnp.asarray(i, jnp.int32))
    total = losses.add_metrics(total, jax.device_get(sums))
  return losses.finalize_metrics({k: float(v) for k, v in total.items()}) if total else {}


def baselines(setup: Setup, pipeline, eval_batches) -> Dict[str, Any]:
  """The objective's trivial predictors, scored on the eval's own examples and masks."""
  it = pipeline.train_iter()
  n = min(BASELINE_TRAIN_BATCHES, pipeline.steps_per_epoch)
  train_batches = [next(it) for _ in range(n)]
  items = [(b, eval_key(i)) for i, b in enumerate(eval_batches)]
  return setup.objective.baselines(train_batches, items)


def ownership(workdir: str) -> str:
  """Whether the trainer may write `workdir` (nothing is written here): "new" (absent or
  empty), "ours" (the marker), "legacy" (an earlier version's work directory: only names
  of TRAINER_ENTRIES, e.g. config.json + checkpoints/) or "remote" (gs://: not checked).
  Raises cli.ConfigError (one line) for anything else: a user's directory."""
  if "://" in workdir:
    log.info("work directory %s is not local: its ownership is not checked", workdir)
    return "remote"
  real = os.path.realpath(workdir)  # a link to a directory is that directory: never replaced
  try:
    outdir.check_target(real, WORKDIR_WHAT, writers=(WORKDIR_WHAT,))
  except outdir.OutputDirError as e:
    if (os.path.isdir(real) and not outdir.is_ours(real)
        and set(os.listdir(real)) <= TRAINER_ENTRIES):
      return "legacy"
    raise cli.ConfigError(str(e).replace(real, workdir)) from None
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
  from jax.experimental import multihost_utils
  flag = multihost_utils.broadcast_one_to_all(np.int32(error is not None))
  if error is not None:
    raise error
  if int(flag):
    raise cli.ConfigError("process 0 refused the work directory (its error says why)")


def claim(config, workdir: str, fp: dict):
  """The checks before a run writes anything (process 0; the others agree): ownership,
  then resume settings, then the lock. -> (lock handle, accepted changes)."""
  main = jax.process_index() == 0
  error, handle, accepted, kind = None, lock_lib.Handle(None, None), {}, "new"
  if main:
    try:
      kind = ownership(workdir)
      accepted = resume_check(config, workdir, fp)
      os.makedirs(workdir, exist_ok=True)
      handle = lock_lib.acquire(workdir)
      if kind == "legacy":
        log.info("work directory %s holds only what this trainer writes, without its "
                 "marker (an earlier version's): marking it as ours", workdir)
        hf = os.path.join(workdir, "hf")
        if hf_lib.is_model_dir(hf) and not outdir.is_ours(hf):  # the trainer's own export:
          outdir.write_marker(hf, hf_lib.HF_EXPORT)  # the next export may replace it
      if kind in ("new", "legacy"):
        outdir.write_marker(workdir, WORKDIR_WHAT)
    except Exception as e:  # noqa: BLE001 - any failure: the other processes must hear of it
      lock_lib.release(handle)
      error = e
  _agree(error)
  if not main:
    os.makedirs(workdir, exist_ok=True)
  return handle, accepted


def train_and_evaluate(config, workdir: str, devices=None,
                       stop_after: Optional[int] = None,
                       phases=None) -> Dict[str, Any]:
  """Runs (or resumes) a pretraining job in `workdir` on `devices` (default: all);
  `stop_after` ends the run early at that step with a checkpoint, as a preemption would;
  `phases` (launch/trainer/phases.py) times the parts of the step body.
  Returns {"state", "eval" (final held-out metrics), "setup", "step"}.

  Before anything is written: the config's checks (checks.py), the work directory's
  ownership (never a user's directory), a resume's settings against the stored run's
  (fingerprint.py) and the lock (lock.py: one trainer per directory). config.json and
  run_fingerprint.json are written once the run is accepted (its state restored)."""
  config = checks.check(config, devices)  # one-line errors before anything is written
  if "://" not in workdir:  # Orbax needs absolute local paths; gs:// paths pass through
    workdir = os.path.abspath(workdir)
  done = report.finished(workdir, int(config.train.steps))
  if done is not None:  # a rerun of a finished run: say so, write nothing
    return {"state": None, "eval": report.say_complete(workdir, done), "setup": None,
            "step": done}
  fp = fingerprint_lib.fingerprint(config)
  handle, accepted = claim(config, workdir, fp)
  try:
    return _run(config, workdir, devices, stop_after, phases, fp, accepted)
  finally:
    lock_lib.release(handle)


def _bad_data_skipped(pipeline) -> int:
  """The bad input the data pipeline skipped so far (`stats["bad_data"]`, kind ->
  count, where the source reports it)."""
  stats = getattr(pipeline, "stats", None) or {}
  bad = stats.get("bad_data") if hasattr(stats, "get") else None
  if callable(getattr(pipeline, "bad_data", None)):  # with the shard readers' own counts
    bad = pipeline.bad_data()
  total = 0
  for counts in (bad, stats.get("preprocess_bad_data") if hasattr(stats, "get") else None):
    if isinstance(counts, dict):
      total += int(sum(v for v in counts.values() if isinstance(v, (int, float))))
    elif isinstance(counts, (int, float)):
      total += int(counts)
  return total


def _run(config, workdir, devices, stop_after, phases, fp, accepted) -> Dict[str, Any]:
  compile_cache.enable(config.train.get("compilation_cache_dir", ""), workdir)
  config, pipeline = prepare(config, workdir)
  setup = build(config, pipeline.tokenizer, devices)
  objective = setup.objective
  spec = objective.batch_spec()

  manager = ckpt_lib.Manager(os.path.join(workdir, "checkpoints"), config.checkpoint)
  restored = manager.restore_latest(setup.abstract_state)
  if restored is None:
    state = setup.init_state()
    train_iter = pipeline.train_iter()
    log.info("starting a new run in %s", workdir)
  else:
    state, data_state = restored
    train_iter = pipeline.train_iter(start_state=data_state)
    log.info("resumed from step %d", int(state.step))
  is_main = jax.process_index() == 0
  if is_main:  # the run is accepted: now its settings are recorded
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump(json.loads(config.to_json_best_effort()), f, indent=2)
    fingerprint_lib.write(workdir, fp, accepted)
  writer = metrics_lib.MetricWriter(workdir, config.logging.tensorboard, is_main=is_main)

  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
  n_frozen = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.frozen))
  eval_batches = [spec.select(b) for b in pipeline.eval_batches(config.train.eval_batches)]
  for b in eval_batches:
    objective.check_batch(b)
  tokens_per_step = config.data.global_batch * config.data.seq_len
  step_flops = config.data.global_batch * objective.flops_per_example(config.data.seq_len)
  n_dev = setup.mesh.devices.size
  first_dev = setup.mesh.devices.flat[0]
  dtype = getattr(next(iter(objective.modules.values())).config, "dtype", "float32")
  peak = devices_lib.peak_flops(first_dev, dtype) * devices_lib.peak_devices(
      setup.mesh.devices.flat)
  first = int(state.step)
  if first == 0 and is_main:
    writer.write_json("run", {"params": n_params, "frozen_params": n_frozen,
                              "devices": n_dev, "mesh": dict(setup.mesh.shape),
                              "data": pipeline.stats, "objective": objective.describe(),
                              "bad_data_skipped": _bad_data_skipped(pipeline),
                              "peak_flops": peak, "step_flops": step_flops})
    if eval_batches:
      writer.write_json("baseline", baselines(setup, pipeline, eval_batches))
  log.info("params %.2fM (+%.2fM frozen), %d devices, mesh %s, %d train rows",
           n_params / 1e6, n_frozen / 1e6, n_dev, dict(setup.mesh.shape),
           pipeline.num_train_rows)

  progress = metrics_lib.Progress(config.train.steps, first, tokens_per_step, step_flops, peak)
  prior = metrics_lib.skipped_before(workdir, first) if is_main and first else 0
  if jax.process_count() > 1:  # metrics.jsonl is process 0's: every process uses its count
    from jax.experimental import multihost_utils
    prior = int(multihost_utils.broadcast_one_to_all(np.int32(prior)))
  skips = guard_lib.SkipTracker(config.train, prior)  # updates skipped, in a row and in all
  pending = []
  total_steps = config.train.steps
  last_eval = {}
  stop = preemption_lib.StopFlag()  # multi-process: all stop at one agreed step
  stop.install()
  last = min(total_steps, stop_after) if stop_after is not None else total_steps
  step = first
  ph = phases or phases_lib.NULL
  for step in range(first + 1, last + 1):
    with ph("input"):
      local = spec.select(next(train_iter))
      objective.check_batch(local)
    with ph("host_to_device"):
      batch = shard_lib.global_batch(local, setup.batch_sharding)
    with ph("step"):
      state, sums = setup.train_step(state, batch)
    ph.step_dispatched(step)
    pending.append(sums)  # device arrays; fetched only when logging (no per-step sync)
    stop.poll(step)
    if step % config.train.log_every == 0 or step == total_steps:
      with ph("device_wait"):
        jax.block_until_ready(pending)
      ph.start("metrics")
      host = {}
      per_step = jax.device_get(pending)
      for s in per_step:
        host = losses.add_metrics(host, s)
      n = step - progress.last_step
      guard_lib.check(host, config.train, step, step - n)  # train.nonfinite_policy=stop
      n_skipped = skips.observe(step - n + 1, per_step)  # skip: max_consecutive_skips
      applied = n - n_skipped  # the means are over the applied steps (skipped ones: 0s)
      lr, gnorm = float(host.pop("learning_rate")) / n, float(host.pop("grad_norm"))
      train_metrics = losses.finalize_metrics({k: float(v) for k, v in host.items()})
      if applied:
        train_metrics["grad_norm"] = gnorm / applied
      else:  # every step skipped: no loss to show (never a 0.0000 that reads as one)
        train_metrics = {k: v for k, v in train_metrics.items()
                         if k.endswith("_count") or k in guard_lib.COUNTERS}
      if guard_lib.COUNTERS[0] in host:
        train_metrics.update(skipped_steps=n_skipped, applied_steps=applied,
                             skipped_total=skips.total)
      train_metrics.update(learning_rate=lr, bad_data_skipped=_bad_data_skipped(pipeline),
                           **progress.update(step))
      writer.write(step, "train", train_metrics)
      pending = []
      ph.stop("metrics")
    if eval_batches and (step % config.train.eval_every == 0 or step == total_steps):
      with ph("eval"):
        last_eval = evaluate(setup, state, eval_batches)
        writer.write(step, "eval", last_eval)
    if step % config.checkpoint.every == 0 or step == last or stop.requested:
      guard_lib.check_pending(pending, config.train, step, progress.last_step)
      with ph("checkpoint"):
        manager.save(step, state, train_iter.get_state())
    if stop.requested:
      log.info("stop requested: checkpoint of step %d saved, exiting", step)
      break
  with ph("checkpoint"):
    manager.close()
  ph.finish()
  if step < total_steps:
    writer.close()
    return {"state": state, "eval": last_eval, "setup": setup, "step": step}
  skips.check_fraction(total_steps, step)  # a mostly-skipped run is not exported
  from jax.experimental import multihost_utils
  # Every process takes part in the gather; process 0 writes.
  host_params = multihost_utils.process_allgather({**state.params, **state.frozen},
                                                  tiled=True)
  if is_main:
    hf_dir = os.path.join(workdir, "hf")
    guard_lib.assert_finite_params(host_params, step, f"the export {hf_dir}")
    if "://" in hf_dir:
      objective.export(host_params, hf_dir, pipeline.tokenizer)
    else:  # the whole export (weights, tokenizer, an RTD generator...) or nothing
      with outdir.atomic_dir(hf_dir, hf_lib.HF_EXPORT, check=hf_lib.check_export_target) as tmp:
        objective.export(host_params, tmp, pipeline.tokenizer)
    writer.write_json("summary", {"step": step, "skipped_steps": skips.total,
                                  "bad_data_skipped": _bad_data_skipped(pipeline),
                                  "data": pipeline.stats})
    if config.logging.plot:
      metrics_lib.plot(workdir)
  writer.close()
  if is_main:
    print("\n".join(demo.lines(objective, host_params, pipeline)), flush=True)
    report.say_artifacts(workdir, config, pipeline.tokenizer.id_to_token(
        pipeline.tokenizer.mask_id))
  return {"state": state, "eval": last_eval, "setup": setup, "step": step}
