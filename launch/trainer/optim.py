"""Optimizer and learning-rate schedule from the `optimizer` config section.

`make_optimizer(opt_config, total_steps) -> (tx, schedule_fn)`:

(The trainer accumulates gradients inside its step, exactly: launch/trainer/step.py. It
builds `tx` with grad_accum_steps=1; MultiSteps below serves callers that feed one
micro-batch per `tx.update` call.)

- `tx` = [MultiSteps over] chain(clip_by_global_norm, adamw | lamb | stable_adamw).
  stable_adamw: AdamW with per-tensor update clipping (StableAdamW, Wortsman et al.
  2023; launch/trainer/stable_adamw.py), ModernBERT's optimizer.
- Step counting: `total_steps` and the argument of `schedule_fn` count OPTIMIZER
  UPDATES (one update = one global batch = `grad_accum_steps` micro-batches). With
  `grad_accum_steps = k > 1`, `tx` is `optax.MultiSteps(inner, k)`: call `tx.update`
  once per micro-batch; it averages the k gradients and applies one real update on
  every k-th call (the other calls return zero updates and leave the inner state,
  including the schedule's counter, untouched). So the schedule advances once per
  update, never per micro-step. To log the learning rate use
  `schedule_fn(optimizer_step_count(opt_state))`, or from a micro-step counter
  `schedule_fn(micro_step // k)`.
- Clipping (when `clip_norm > 0`) sits inside the accumulation, so it clips the
  averaged full-batch gradient, not each micro-batch's.
- Schedules (all warm up linearly from 0: `lr(s) = peak * s / warmup_steps` for
  `s < warmup_steps`, so the first update uses lr 0 and `lr(warmup_steps) = peak`):
    linear   peak at `warmup_steps` -> 0 at `total_steps`, linearly;
    cosine   peak at `warmup_steps` -> 0 at `total_steps`, half cosine;
    wsd      warmup-stable-decay: peak until `total_steps - round(decay_fraction *
             total_steps)`, then linearly to 0 at `total_steps`;
    constant peak after warmup.
  Past `total_steps` the decaying schedules stay at 0.
- Weight decay (decoupled, scaled by the learning rate as in optax) applies where
  `decay_mask(params)` is True. Rule, by the leaf's path in the params pytree:
  decay a leaf iff it has ndim >= 2, its own name does not contain "bias", its name
  is not a norm parameter ("scale", or any name ending in "_scale"), and no module on
  its path is a norm (a path key containing "norm", case-insensitive, e.g. LayerNorm,
  RMSNorm, final_norm). For Flax modules this means: Dense/DenseGeneral kernels and
  Embed tables are decayed (also when scanned layers add a leading axis); every bias
  (1-D or DenseGeneral's 2-D), every LayerNorm/RMSNorm scale (embeddings' LayerNorm
  included) and every 1-D parameter is not.
"""
from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp
import optax

from launch.trainer.stable_adamw import stable_adamw

__all__ = [
    "make_optimizer",
    "make_schedule",
    "decay_mask",
    "optimizer_step_count",
    "OPTIMIZERS",
    "SCHEDULES",
]

OPTIMIZERS = ("adamw", "lamb", "stable_adamw")
SCHEDULES = ("linear", "cosine", "wsd", "constant")

_DEFAULTS = dict(
    name="adamw",
    learning_rate=1e-4,
    b1=0.9,
    b2=0.999,
    eps=1e-6,
    weight_decay=0.01,
    schedule="linear",
    warmup_steps=0,
    decay_fraction=0.1,
    clip_norm=0.0,
    grad_accum_steps=1,
)


def _get(cfg, key):
  """Reads `key` from a ConfigDict, a mapping or an attribute object."""
  if hasattr(cfg, "get"):
    value = cfg.get(key, None)
  else:
    value = getattr(cfg, key, None)
  return _DEFAULTS[key] if value is None else value


def _path_names(path):
  names = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey):
      names.append(str(k.key))
    elif isinstance(k, jax.tree_util.GetAttrKey):
      if k.name != "value":  # the payload of a Flax partitioning box
        names.append(k.name)
    elif isinstance(k, jax.tree_util.SequenceKey):
      names.append(str(k.idx))
  return names


def _should_decay(path, leaf):
  names = _path_names(path)
  ndim = leaf.ndim if hasattr(leaf, "ndim") else jnp.ndim(leaf)
  if ndim < 2 or not names:
    return False
  name = names[-1].lower()
  if "bias" in name or name == "scale" or name.endswith("_scale"):
    return False
  if any("norm" in n.lower() for n in names):
    return False
  return True


def decay_mask(params):
  """Pytree of bools, like `params`: True where weight decay applies (module doc).

  Only paths and ndim are read, so abstract params (`jax.eval_shape`) work too.
  """
  return jax.tree_util.tree_map_with_path(_should_decay, params)


def make_schedule(opt_config, total_steps):
  """The learning-rate schedule, a function of the optimizer-update count."""
  name = str(_get(opt_config, "schedule")).lower()
  if name not in SCHEDULES:
    raise ValueError(f"unknown optimizer.schedule {name!r}; known: {', '.join(SCHEDULES)}")
  if not isinstance(total_steps, numbers.Integral) or total_steps < 1:
    raise ValueError(f"total_steps must be a positive int, got {total_steps!r}")
  total = int(total_steps)
  peak = float(_get(opt_config, "learning_rate"))
  if not peak >= 0.0:
    raise ValueError(f"optimizer.learning_rate must be >= 0, got {peak}")
  warmup = int(_get(opt_config, "warmup_steps"))
  if warmup < 0:
    raise ValueError(f"optimizer.warmup_steps must be >= 0, got {warmup}")
  if warmup > total:
    raise ValueError(
        f"optimizer.warmup_steps ({warmup}) is larger than the run's {total} optimizer "
        f"updates; lower warmup_steps or raise the step count")

  decay_start, decay_len = warmup, total - warmup
  if name == "wsd":
    fraction = float(_get(opt_config, "decay_fraction"))
    if not 0.0 <= fraction <= 1.0:
      raise ValueError(f"optimizer.decay_fraction must be in [0, 1], got {fraction}")
    decay_len = int(round(fraction * total))
    decay_start = total - decay_len
    if decay_start < warmup:
      raise ValueError(
          f"wsd schedule: warmup_steps ({warmup}) + decay steps ({decay_len} = "
          f"decay_fraction {fraction} x {total}) exceed the {total} optimizer updates")

  def schedule(step):
    s = jnp.asarray(step, jnp.float32)
    warm = peak * s / warmup if warmup > 0 else jnp.full_like(s, peak)
    if name == "constant":
      after = jnp.full_like(s, peak)
    else:
      frac = jnp.clip((s - decay_start) / max(decay_len, 1), 0.0, 1.0)
      if name == "cosine":
        after = peak * 0.5 * (1.0 + jnp.cos(math.pi * frac))
      else:  # linear, wsd
        after = peak * (1.0 - frac)
    return jnp.where(s < warmup, warm, after)

  return schedule


def make_optimizer(opt_config, total_steps):
  """Builds `(tx, schedule_fn)` from the `optimizer` config (see the module doc).

  `total_steps` is the number of optimizer updates in the run (not micro-steps).
  """
  name = str(_get(opt_config, "name")).lower()
  if name not in OPTIMIZERS:
    raise ValueError(f"unknown optimizer.name {name!r}; known: {', '.join(OPTIMIZERS)}")
  schedule = make_schedule(opt_config, total_steps)
  b1 = float(_get(opt_config, "b1"))
  b2 = float(_get(opt_config, "b2"))
  eps = float(_get(opt_config, "eps"))
  weight_decay = float(_get(opt_config, "weight_decay"))
  if weight_decay < 0:
    raise ValueError(f"optimizer.weight_decay must be >= 0, got {weight_decay}")
  clip_norm = float(_get(opt_config, "clip_norm"))
  accum = int(_get(opt_config, "grad_accum_steps"))
  if accum < 1:
    raise ValueError(f"optimizer.grad_accum_steps must be >= 1, got {accum}")

  if name == "adamw":
    base = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                       mask=decay_mask)
  elif name == "stable_adamw":  # per-tensor update clipping (launch/trainer/stable_adamw.py)
    base = stable_adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                        mask=decay_mask)
  else:
    base = optax.lamb(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                      mask=decay_mask)
  tx = optax.chain(optax.clip_by_global_norm(clip_norm), base) if clip_norm > 0 else base
  if accum > 1:
    tx = optax.MultiSteps(tx, every_k_schedule=accum, use_grad_mean=True)
    tx = tx.gradient_transformation()
  return tx, schedule


def optimizer_step_count(opt_state):
  """Number of optimizer updates applied so far (micro-steps are not counted)."""
  if isinstance(opt_state, optax.MultiStepsState):
    return opt_state.gradient_step
  found = _find_schedule_count(opt_state)
  if found is None:
    raise ValueError("opt_state holds no schedule counter; was it made by make_optimizer?")
  return found


def _find_schedule_count(state):
  if isinstance(state, optax.ScaleByScheduleState):
    return state.count
  if isinstance(state, optax.MultiStepsState):
    return state.gradient_step
  if isinstance(state, (tuple, list)):
    for s in state:
      found = _find_schedule_count(s)
      if found is not None:
        return found
  return None
