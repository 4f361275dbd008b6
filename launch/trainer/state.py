"""Setup of a run: mesh, objective, optimizer, the sharded train state and the jitted
steps (also used by launch.bench and launch.aot, which run the same step).

The params of every collection are initialised sharded (logical axes -> mesh through the
config's rules) inside one jitted init, then the objective's after-init hook may replace
some (continued pretraining, a teacher), then the state is made: trained collections in
`params` with an optimizer state mirroring their shardings, frozen ones in `frozen`, kept
out of the optimizer entirely (no state, no decay, no update).
"""
import dataclasses
import functools
import logging
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

import objectives
from encoders import base
from launch.trainer import guard
from launch.trainer import optim
from launch.trainer import sharding as shard_lib
from launch.trainer.step import TrainState, make_eval_step, make_train_step


@dataclasses.dataclass
class Setup:
  """Everything the loop needs, built once from the config."""
  config: ml_collections.ConfigDict
  mesh: Any
  objective: objectives.Objective
  tx: optax.GradientTransformation
  schedule: Any
  param_shardings: Any  # {collection: shardings}, trained and frozen
  state_shardings: Any
  abstract_state: Any
  batch_sharding: Any
  init_state: Any  # () -> TrainState (init, after-init hook, optimizer state)
  train_step: Any  # jitted (state, batch) -> (state, metric sums)
  eval_step: Any  # jitted (state, batch, index) -> metric sums


def _split(objective, boxed_keys):
  trained, frozen = tuple(objective.trained), tuple(objective.frozen)
  if set(trained) & set(frozen):
    raise ValueError(f"collections {sorted(set(trained) & set(frozen))} are both trained "
                     "and frozen")
  if set(trained) | set(frozen) != set(boxed_keys):
    raise ValueError(f"the objective's params have collections {sorted(boxed_keys)}, but "
                     f"it trains {trained} and freezes {frozen}")
  return trained, frozen


def _resolve_attention(config, mesh):
  """`attention_impl: auto` -> the kernel for the mesh's platform and the run's sequence
  length (encoders.base.resolve_attention), logged with its reason."""
  line = base.resolve_attention(config.model, mesh.devices.flat[0].platform,
                                config.get("data", {}).get("seq_len"))
  log = logging.getLogger("encoder_zoo")
  (log.warning if "dropout" in line else log.info)("%s", line)


# TPU compiler options for one generation (by device kind), each with its reason.
GENERATION_OPTIONS = {
    # v6e: with the state split over data (mesh.shard_state_over_data) the compiler turns
    # each weight gradient's reduce-scatter into windowed matmuls that each read the
    # layer's activations again; BERT-base's step is bound by HBM traffic there, and a
    # 2-layer BERT-base step at 64 rows per chip moves 18.7 GB instead of 24.9 GB without
    # them (docs/benchmarks.md).
    "TPU v6 lite": {"xla_tpu_enable_windowed_einsum_for_reduce_scatter": False},
}


def compiler_options(config, platform: str, device_kind: str = ""):
  """The XLA options the train and eval steps are compiled with on `platform`: on TPU the
  scoped-VMEM limit of `train.tpu_scoped_vmem_kib` (0: the compiler's default) and the
  options of the chip's generation (`GENERATION_OPTIONS`); None elsewhere, or when there
  are none."""
  kib = config.get("train", {}).get("tpu_scoped_vmem_kib", 0)
  if isinstance(kib, bool) or not isinstance(kib, int) or kib < 0:
    raise ValueError(f"train.tpu_scoped_vmem_kib must be an integer >= 0 (KiB; 0 = the "
                     f"compiler's default), got {kib!r}")
  if platform != "tpu":
    return None
  options = {"xla_tpu_scoped_vmem_limit_kib": kib} if kib else {}
  options.update(GENERATION_OPTIONS.get(device_kind, {}))
  return options or None


def compiler_options_line(options) -> str:
  """The line a run's log and launch.aot's report give `compiler_options`' result."""
  text = ", ".join(f"{k}={v}" for k, v in (options or {}).items()) or "the compiler's defaults"
  generation = any(k in g for g in GENERATION_OPTIONS.values() for k in (options or {}))
  return (f"TPU compiler options: {text} (train.tpu_scoped_vmem_kib"
          + ("; the chip generation's: launch/trainer/state.py GENERATION_OPTIONS" if generation
             else "") + ")")


def build(config, tokenizer, devices=None) -> Setup:
  """Mesh, objective, optimizer, sharded state init, jitted train and eval steps."""
  mesh = shard_lib.make_mesh(config.mesh.shape, devices)
  first = mesh.devices.flat[0]
  options = compiler_options(config, first.platform, getattr(first, "device_kind", ""))
  if options:
    logging.getLogger("encoder_zoo").info("%s", compiler_options_line(options))
  _resolve_attention(config, mesh)
  rules = shard_lib.rules_tuple(config.mesh.rules)
  objective = objectives.get_objective(config, tokenizer)
  opt_cfg = ml_collections.ConfigDict(config.optimizer.to_dict())
  accum = int(opt_cfg.grad_accum_steps)
  opt_cfg.grad_accum_steps = 1  # accumulation happens inside the step (step.gradients)
  tx, schedule = optim.make_optimizer(opt_cfg, config.train.steps)
  tx = guard.wrap(tx, config.train)  # gradient-norm spike detection, when configured
  if config.data.global_batch % (accum * jax.process_count()):
    raise ValueError(f"data.global_batch={config.data.global_batch} must divide into "
                     f"grad_accum_steps={accum} micro-batches on every process")

  init_key, train_key = jax.random.split(jax.random.PRNGKey(config.train.seed))
  with nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(objective.init, init_key)  # params boxed with logical axis names
  trained, frozen = _split(objective, boxed)
  param_shardings = shard_lib.logical_shardings(boxed, mesh, rules)
  abstract_params = nn.unbox(boxed)
  pick = lambda tree, names: {k: tree[k] for k in names}
  abstract_opt = jax.eval_shape(tx.init, pick(abstract_params, trained))
  trained_shardings, view = pick(param_shardings, trained), None
  if config.mesh.get("shard_state_over_data", False) and mesh.shape["data"] > 1:
    model_view = trained_shardings
    trained_shardings = shard_lib.split_over_data(pick(abstract_params, trained),
                                                  model_view, mesh)
    compute = base.dtype_for(config.model.get("dtype", "auto"),
                             mesh.devices.flat[0].platform)
    view = shard_lib.state_view(model_view, compute)
  opt_shardings = shard_lib.mirror_shardings(
      abstract_opt, pick(abstract_params, trained), trained_shardings, mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  state_shardings = TrainState(
      step=replicated, params=trained_shardings,
      frozen=pick(param_shardings, frozen), opt_state=opt_shardings, rng=replicated)

  def with_rules(fn):
    @functools.wraps(fn)
    def wrapped(*args):
      with nn.logical_axis_rules(rules):
        return fn(*args)
    return wrapped

  def init_params():
    return nn.unbox(objective.init(init_key))

  def make_state(params):
    t = pick(params, trained)
    return TrainState(step=jnp.zeros((), jnp.int32), params=t, frozen=pick(params, frozen),
                      opt_state=tx.init(t), rng=train_key)

  abstract_state = jax.eval_shape(make_state, abstract_params)
  abstract_state = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state,
      state_shardings)
  init_params_jit = jax.jit(with_rules(init_params), out_shardings=param_shardings)
  make_state_jit = jax.jit(make_state, in_shardings=(param_shardings,),
                           out_shardings=state_shardings,
                           donate_argnums=() if view else 0)  # split: other buffer sizes

  def init_state():
    params = objective.after_init(init_params_jit(), param_shardings)
    return make_state_jit(params)

  batch_sharding = shard_lib.batch_sharding(mesh, rules)
  train_step = shard_lib.MeshJit(mesh, jax.jit(
      with_rules(make_train_step(objective, tx, schedule, accum, config.train, view)),
      in_shardings=(state_shardings, batch_sharding),
      out_shardings=(state_shardings, replicated), donate_argnums=0,
      compiler_options=options))
  eval_step = shard_lib.MeshJit(mesh, jax.jit(
      with_rules(make_eval_step(objective, view)),
      in_shardings=(state_shardings, batch_sharding, replicated), out_shardings=replicated,
      compiler_options=options))
  return Setup(config, mesh, objective, tx, schedule, param_shardings, state_shardings,
               abstract_state, batch_sharding, init_state, train_step, eval_step)
