"""The one trainer for every objective: mesh, input, model, sharded state, update step,
checkpoints, evals, loop. An objective (objectives/) supplies the modules, loss, metrics
and export; this file never looks inside them.
"""
import dataclasses
import functools
import json
import logging
import os
import time
from typing import Any, Dict, Optional

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

import encoders
import objectives
from launch import checkpoint as ckpt_lib
from launch import data as data_lib
from launch import flops as flops_lib
from launch import metrics as metrics_lib
from launch import optim
from launch import sharding as shard_lib
from objectives import losses

log = logging.getLogger("encoder_zoo")
EVAL_SEED = 1234  # every evaluation masks the held-out rows identically


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: optimizer updates done
  params: Any
  opt_state: Any
  rng: jax.Array  # uint32[2] base key; step keys are fold_in(rng, step)


# ---------------------------------------------------------------------------- setup


@dataclasses.dataclass
class Setup:
  """Everything the loop needs, built once from the config (also used by launch.aot)."""
  config: ml_collections.ConfigDict
  mesh: Any
  objective: objectives.Objective
  tx: optax.GradientTransformation
  schedule: Any
  state_shardings: Any
  abstract_state: Any
  batch_sharding: Any
  init_state: Any  # jitted () -> TrainState
  train_step: Any  # jitted (state, batch) -> (state, metric sums)
  eval_step: Any  # jitted (state, batch) -> metric sums


def build(config, tokenizer, devices=None) -> Setup:
  """Mesh, objective, optimizer, sharded state init, jitted train and eval steps."""
  mesh = shard_lib.make_mesh(config.mesh.shape, devices)
  rules = shard_lib.rules_tuple(config.mesh.rules)
  objective = objectives.get_objective(config, tokenizer)
  opt_cfg = ml_collections.ConfigDict(config.optimizer.to_dict())
  accum = int(opt_cfg.grad_accum_steps)
  opt_cfg.grad_accum_steps = 1  # accumulation happens inside the step (see train_step)
  tx, schedule = optim.make_optimizer(opt_cfg, config.train.steps)
  if config.data.global_batch % (accum * jax.process_count()):
    raise ValueError(f"data.global_batch={config.data.global_batch} must divide into "
                     f"grad_accum_steps={accum} micro-batches on every process")

  seed_key = jax.random.PRNGKey(config.train.seed)
  init_key, train_key = jax.random.split(seed_key)
  with nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(objective.init, init_key)  # params boxed with logical axis names
  param_shardings = shard_lib.logical_shardings(boxed, mesh, rules)
  abstract_params = nn.unbox(boxed)
  abstract_opt = jax.eval_shape(tx.init, abstract_params)
  opt_shardings = shard_lib.mirror_shardings(abstract_opt, abstract_params, param_shardings,
                                             mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  state_shardings = TrainState(step=replicated, params=param_shardings,
                               opt_state=opt_shardings, rng=replicated)

  def make_state():
    params = nn.unbox(objective.init(init_key))
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params), rng=train_key)

  with nn.logical_axis_rules(rules):
    abstract_state = jax.eval_shape(make_state)
  abstract_state = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state,
      state_shardings)

  def with_rules(fn):
    @functools.wraps(fn)
    def wrapped(*args):
      with nn.logical_axis_rules(rules):
        return fn(*args)
    return wrapped

  init_state = jax.jit(with_rules(make_state), out_shardings=state_shardings)
  batch_sharding = shard_lib.batch_sharding(mesh, rules)

  def train_step(state: TrainState, batch):
    transform_rng, rng = jax.random.split(jax.random.fold_in(state.rng, state.step))
    batch = objective.transform(batch, transform_rng)

    def micro(params, micro_batch, micro_rng):
      def loss_fn(p):
        return objective.loss(p, micro_batch, micro_rng, True)
      (loss, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
      return grads, sums

    if accum == 1:
      grads, sums = micro(state.params, batch, rng)
    else:
      split = jax.tree.map(
          lambda x: x.reshape((accum, x.shape[0] // accum) + x.shape[1:]), batch)
      zeros = jax.tree.map(jnp.zeros_like, state.params)

      def body(carry, xs):
        g_acc, m_acc = carry
        i, mb = xs
        g, m = micro(state.params, mb, jax.random.fold_in(rng, i))
        return (jax.tree.map(jnp.add, g_acc, g), losses.add_metrics(m_acc, m)), None

      _, m0 = jax.eval_shape(lambda: micro(state.params, jax.tree.map(lambda x: x[0], split),
                                           rng))
      m0 = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), m0)
      (grads, sums), _ = jax.lax.scan(body, (zeros, m0), (jnp.arange(accum), split))
      grads = jax.tree.map(lambda g: g / accum, grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    sums = dict(sums, grad_norm=optax.tree.norm(grads), learning_rate=schedule(state.step))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), sums

  def eval_step(state: TrainState, batch):
    key = jax.random.PRNGKey(EVAL_SEED)
    batch = objective.transform(batch, key)
    _, sums = objective.loss(state.params, batch, key, False)
    return sums

  train_step = shard_lib.MeshJit(mesh, jax.jit(
      with_rules(train_step), in_shardings=(state_shardings, batch_sharding),
      out_shardings=(state_shardings, replicated), donate_argnums=0))
  eval_step = shard_lib.MeshJit(mesh, jax.jit(
      with_rules(eval_step), in_shardings=(state_shardings, batch_sharding),
      out_shardings=replicated))
  return Setup(config, mesh, objective, tx, schedule, state_shardings, abstract_state,
               batch_sharding, init_state, train_step, eval_step)


def adopt_tokenizer(config, tokenizer):
  """The tokenizer decides the vocabulary and the padding id of the model."""
  m = config.model
  if m.vocab_size != tokenizer.vocab_size or m.pad_token_id != tokenizer.pad_id:
    log.info("model.vocab_size %d -> %d and pad_token_id %d -> %d from the tokenizer",
             m.vocab_size, tokenizer.vocab_size, m.pad_token_id, tokenizer.pad_id)
  m.vocab_size = tokenizer.vocab_size
  m.pad_token_id = tokenizer.pad_id


def check_batch(config, batch: Dict[str, np.ndarray]):
  """Host-side validation of a batch before it reaches the device (no silent clamping)."""
  encoders.validate_inputs(config.model, batch["input_ids"], None, batch["token_type_ids"],
                           batch["segment_ids"])


# ---------------------------------------------------------------------------- evaluation


def evaluate(setup: Setup, state, eval_batches) -> Dict[str, float]:
  total = {}
  for b in eval_batches:
    sums = setup.eval_step(state, shard_lib.global_batch(b, setup.batch_sharding))
    total = losses.add_metrics(total, jax.device_get(sums))
  return losses.finalize_metrics({k: float(v) for k, v in total.items()}) if total else {}


def majority_baseline(setup: Setup, pipeline, eval_batches) -> Dict[str, float]:
  """Accuracy of always predicting the most frequent training token, at exactly the
  positions the model is scored on (the eval masks), on the same held-out rows."""
  counts = np.zeros(pipeline.tokenizer.vocab_size, np.int64)
  it = pipeline.train_iter()
  for _ in range(min(50, pipeline.steps_per_epoch)):
    b = next(it)
    ids = b["input_ids"][~b["special_tokens_mask"]]
    counts += np.bincount(ids, minlength=counts.size)[:counts.size]
  top = int(counts.argmax())
  hits = total = 0
  for b in eval_batches:
    m = setup.objective.transform(b, jax.random.PRNGKey(EVAL_SEED))
    w = np.asarray(m["mlm_weights"]) > 0
    hits += int((np.asarray(m["mlm_labels"])[w] == top).sum())
    total += int(w.sum())
  return {"majority_token": top, "majority_token_text": pipeline.tokenizer.decode([top]),
          "majority_accuracy": hits / max(total, 1)}


# ---------------------------------------------------------------------------- the loop


class _StopFlag:
  """Set by SIGTERM (spot/preemptible VMs get one before they go): the loop finishes the
  current step, saves a checkpoint and returns; rerunning the command resumes."""

  def __init__(self):
    self.requested = False

  def install(self):
    import signal
    import threading
    if threading.current_thread() is threading.main_thread():
      signal.signal(signal.SIGTERM, lambda *_: setattr(self, "requested", True))


def train_and_evaluate(config, workdir: str, devices=None,
                       stop_after: Optional[int] = None) -> Dict[str, Any]:
  """Runs (or resumes) a pretraining job in `workdir` on `devices` (default: all);
  `stop_after` ends the run early at that step with a checkpoint, as a preemption would.
  Returns {"state", "eval" (final held-out metrics), "setup", "step"}."""
  if "://" not in workdir:  # Orbax needs absolute local paths; gs:// paths pass through
    workdir = os.path.abspath(workdir)
  os.makedirs(workdir, exist_ok=True)
  config = ml_collections.ConfigDict(config.to_dict())  # a private, unlocked copy
  pipeline = data_lib.make_pipeline(config, workdir)
  adopt_tokenizer(config, pipeline.tokenizer)
  setup = build(config, pipeline.tokenizer, devices)
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
  eval_batches = pipeline.eval_batches(config.train.eval_batches)
  tokens_per_step = config.data.global_batch * config.data.seq_len
  step_flops = 3 * config.data.global_batch * setup.objective.forward_flops(
      config.data.seq_len)
  n_dev = setup.mesh.devices.size
  first_dev = setup.mesh.devices.flat[0]
  # CPU "devices" (fake or not) share one machine: its measured matmul rate is the peak.
  peak = flops_lib.peak_flops(first_dev, setup.objective.model.config.dtype) * (
      1 if first_dev.platform == "cpu" else n_dev)
  first = int(state.step)
  if first == 0 and jax.process_index() == 0:
    writer.write_json("run", {"params": n_params, "devices": n_dev,
                              "mesh": dict(setup.mesh.shape), "data": pipeline.stats,
                              "peak_flops": peak, "step_flops": step_flops})
    if eval_batches and "mlm" in config.objective.name:
      writer.write_json("baseline", majority_baseline(setup, pipeline, eval_batches))
  log.info("params %.2fM, %d devices, mesh %s, %d train rows", n_params / 1e6, n_dev,
           dict(setup.mesh.shape), pipeline.num_train_rows)

  progress = metrics_lib.Progress(config.train.steps, first, tokens_per_step, step_flops, peak)
  pending = []
  total_steps = config.train.steps
  last_eval = {}
  stop = _StopFlag()
  stop.install()
  last = min(total_steps, stop_after) if stop_after is not None else total_steps
  step = first
  for step in range(first + 1, last + 1):
    local = next(train_iter)
    check_batch(config, local)
    state, sums = setup.train_step(state, shard_lib.global_batch(local, setup.batch_sharding))
    pending.append(sums)  # device arrays; fetched only when logging (no per-step sync)
    if step % config.train.log_every == 0 or step == total_steps:
      host = {}
      for s in jax.device_get(pending):
        host = losses.add_metrics(host, s)
      n = step - progress.last_step
      lr, gnorm = float(host.pop("learning_rate")) / n, float(host.pop("grad_norm")) / n
      train_metrics = losses.finalize_metrics({k: float(v) for k, v in host.items()})
      train_metrics.update(learning_rate=lr, grad_norm=gnorm, **progress.update(step))
      writer.write(step, "train", train_metrics)
      pending = []
    if eval_batches and (step % config.train.eval_every == 0 or step == total_steps):
      last_eval = evaluate(setup, state, eval_batches)
      writer.write(step, "eval", last_eval)
    if step % config.checkpoint.every == 0 or step == last or stop.requested:
      manager.save(step, state, train_iter.get_state())
    if stop.requested:
      log.info("stop requested: checkpoint of step %d saved, exiting", step)
      break
  manager.close()
  if step < total_steps:
    writer.close()
    return {"state": state, "eval": last_eval, "setup": setup, "step": step}
  from jax.experimental import multihost_utils
  host_params = multihost_utils.process_allgather(state.params, tiled=True)  # all processes
  if jax.process_index() == 0:
    setup.objective.export(host_params, os.path.join(workdir, "hf"))
    if hasattr(pipeline.tokenizer, "save"):
      pipeline.tokenizer.save(os.path.join(workdir, "hf"))
    if config.logging.plot:
      metrics_lib.plot(workdir)
  writer.close()
  return {"state": state, "eval": last_eval, "setup": setup, "step": step}
