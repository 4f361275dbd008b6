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
from launch import data as data_lib
from launch import devices as devices_lib
from launch.trainer import checkpoint as ckpt_lib
from launch.trainer import checks
from launch.trainer import compile_cache
from launch.trainer import demo
from launch.trainer import guard as guard_lib
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
  pipeline = data_lib.make_pipeline(config, workdir)
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


def train_and_evaluate(config, workdir: str, devices=None,
                       stop_after: Optional[int] = None,
                       phases=None) -> Dict[str, Any]:
  """Runs (or resumes) a pretraining job in `workdir` on `devices` (default: all);
  `stop_after` ends the run early at that step with a checkpoint, as a preemption would;
  `phases` (launch/trainer/phases.py) times the parts of the step body.
  Returns {"state", "eval" (final held-out metrics), "setup", "step"}."""
  config = checks.check(config, devices)  # one-line errors before anything is written
  if "://" not in workdir:  # Orbax needs absolute local paths; gs:// paths pass through
    workdir = os.path.abspath(workdir)
  done = report.finished(workdir, int(config.train.steps))
  if done is not None:  # a rerun of a finished run: say so, write nothing
    return {"state": None, "eval": report.say_complete(workdir, done), "setup": None,
            "step": done}
  os.makedirs(workdir, exist_ok=True)
  compile_cache.enable(config.train.get("compilation_cache_dir", ""), workdir)
  config, pipeline = prepare(config, workdir)
  setup = build(config, pipeline.tokenizer, devices)
  objective = setup.objective
  spec = objective.batch_spec()
  writer = metrics_lib.MetricWriter(workdir, config.logging.tensorboard,
                                    is_main=jax.process_index() == 0)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump(json.loads(config.to_json_best_effort()), f, indent=2)

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
  if first == 0 and jax.process_index() == 0:
    writer.write_json("run", {"params": n_params, "frozen_params": n_frozen,
                              "devices": n_dev, "mesh": dict(setup.mesh.shape),
                              "data": pipeline.stats, "objective": objective.describe(),
                              "peak_flops": peak, "step_flops": step_flops})
    if eval_batches:
      writer.write_json("baseline", baselines(setup, pipeline, eval_batches))
  log.info("params %.2fM (+%.2fM frozen), %d devices, mesh %s, %d train rows",
           n_params / 1e6, n_frozen / 1e6, n_dev, dict(setup.mesh.shape),
           pipeline.num_train_rows)

  progress = metrics_lib.Progress(config.train.steps, first, tokens_per_step, step_flops, peak)
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
      for s in jax.device_get(pending):
        host = losses.add_metrics(host, s)
      n = step - progress.last_step
      guard_lib.check(host, config.train, step, step - n)  # train.nonfinite_policy=stop
      lr, gnorm = float(host.pop("learning_rate")) / n, float(host.pop("grad_norm")) / n
      train_metrics = losses.finalize_metrics({k: float(v) for k, v in host.items()})
      train_metrics.update(learning_rate=lr, grad_norm=gnorm, **progress.update(step))
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
  from jax.experimental import multihost_utils
  # Every process takes part in the gather; process 0 writes.
  host_params = multihost_utils.process_allgather({**state.params, **state.frozen},
                                                  tiled=True)
  if jax.process_index() == 0:
    objective.export(host_params, os.path.join(workdir, "hf"), pipeline.tokenizer)
    if config.logging.plot:
      metrics_lib.plot(workdir)
  writer.close()
  if jax.process_index() == 0:
    print("\n".join(demo.lines(objective, host_params, pipeline)), flush=True)
    report.say_artifacts(workdir, config, pipeline.tokenizer.id_to_token(
        pipeline.tokenizer.mask_id))
  return {"state": state, "eval": last_eval, "setup": setup, "step": step}
