"""The update step and the eval step, for any objective (objectives/base.py).

Exact gradient accumulation: the objective's transform runs on the whole global batch,
its `normalizers` are taken from the whole transformed batch, and each micro-batch
differentiates `objective.combine(term sums, global normalizers)`. The micro-batch
gradients then add up to the full-batch gradient (up to float summation order), whatever
the split; metrics stay sums. With data parallelism the step is one global program, so
the same holds across devices.
"""
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from launch.trainer import guard
from objectives import losses

EVAL_SEED = 1234  # eval batch i is transformed with fold_in(PRNGKey(EVAL_SEED), i)


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: optimizer updates done
  params: Any  # the trained collections {name: params}: the optimizer's
  frozen: Any  # the frozen collections {name: params}: no optimizer state, no update
  opt_state: Any
  rng: jax.Array  # uint32[2] base key; step keys are fold_in(rng, step)


def eval_key(index):
  """The transform key of eval batch `index`: different per batch, the same every run
  (and for the baselines, which score exactly the eval's masks)."""
  return jax.random.fold_in(jax.random.PRNGKey(EVAL_SEED), index)


def gradients(objective, trained, frozen, batch, rng, accum: int, view=None):
  """(grads of the trained collections, metric sums) of a transformed global batch,
  in `accum` micro-batches (exact: see the module docstring). `view`: under
  `mesh.shard_state_over_data`, view(loss, params) -> what the model reads of the trained
  params (sharding.state_view), differentiated through."""
  norms = objective.normalizers(batch)
  if view is None:
    view = lambda p: p
  else:
    view = view(lambda p: objective.loss({**p, **frozen}, batch, rng, True)[0], trained)

  def micro(mb, micro_rng):
    def loss_fn(p):
      terms, metrics = objective.loss({**view(p), **frozen}, mb, micro_rng, True)
      return objective.combine(terms, norms), metrics
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(trained)
    return grads, metrics

  if accum == 1:
    return micro(batch, rng)
  rows = jax.tree.leaves(batch)[0].shape[0]
  if rows % accum:
    raise ValueError(f"{rows} rows do not split into {accum} micro-batches")
  split = jax.tree.map(lambda x: x.reshape((accum, x.shape[0] // accum) + x.shape[1:]),
                       batch)
  zeros = jax.tree.map(jnp.zeros_like, trained)
  _, m0 = jax.eval_shape(lambda: micro(jax.tree.map(lambda x: x[0], split), rng))
  m0 = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), m0)

  def body(carry, xs):
    g_acc, m_acc = carry
    i, mb = xs
    g, m = micro(mb, jax.random.fold_in(rng, i))
    return (jax.tree.map(jnp.add, g_acc, g), losses.add_metrics(m_acc, m)), None

  (grads, sums), _ = jax.lax.scan(body, (zeros, m0), (jnp.arange(accum), split))
  return grads, sums


def make_train_step(objective, tx, schedule, accum: int, train_cfg=None, view=None):
  def train_step(state: TrainState, batch):
    transform_rng, rng = jax.random.split(jax.random.fold_in(state.rng, state.step))
    batch = objective.transform(batch, transform_rng)
    grads, sums = gradients(objective, state.params, state.frozen, batch, rng, accum, view)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    sums = dict(sums, grad_norm=optax.tree.norm(grads), learning_rate=schedule(state.step))
    if train_cfg is not None:  # NaN/inf or spike: undo and count the update (guard.py)
      params, opt_state, sums = guard.select(train_cfg, state.params, state.opt_state,
                                             params, opt_state, sums)
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), sums
  return train_step


def make_eval_step(objective, view=None):
  def eval_step(state: TrainState, batch, index):
    key = eval_key(index)
    batch = objective.transform(batch, key, train=False)  # held-out masking rate
    params = state.params
    if view is not None:
      params = view(lambda p: objective.loss({**p, **state.frozen}, batch, key, False)[0],
                    params)(params)
    _, sums = objective.loss({**params, **state.frozen}, batch, key, False)
    return sums
  return eval_step
