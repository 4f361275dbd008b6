"""The update step and the eval step, for any objective (objectives/base.py).

Exact gradient accumulation: the objective's transform runs on the whole global batch,
its `normalizers` are taken from the whole transformed batch, and each micro-batch
differentiates `objective.combine(term sums, global normalizers)`. The micro-batch
gradients then add up to the full-batch gradient (up to float summation order), whatever
the split; metrics stay sums. With data parallelism the step is one global program, so
the same holds across devices.

A loss that is not a sum over examples (a contrastive loss over the whole batch) cannot
be split that way. An objective whose `loss_parts()` gives (embed, loss of the
embeddings) gets the gradient cache instead (Gao et al. 2021): the batch embedded in
`accum` chunks without gradients, the loss and its gradient w.r.t. the embeddings over
the whole batch, then each chunk re-encoded and back-propagated with its cached
gradient. Exact, with the activation memory of one chunk.
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
  parts = getattr(objective, "loss_parts", lambda: None)()
  if parts is not None and accum > 1:
    return cached_gradients(objective, parts, trained, frozen, batch, rng, accum, view,
                            norms)

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


def _chunks(batch, accum):
  rows = jax.tree.leaves(batch)[0].shape[0]
  if rows % accum:
    raise ValueError(f"{rows} rows do not split into {accum} micro-batches")
  return jax.tree.map(lambda x: x.reshape((accum, x.shape[0] // accum) + x.shape[1:]),
                      batch)


def cached_gradients(objective, parts, trained, frozen, batch, rng, accum, view, norms):
  """The gradient cache (module docstring): `parts` = (embed(params, batch, rng) ->
  per-row arrays, loss(those arrays for the whole batch, batch) -> (terms, metrics))."""
  embed, head = parts
  split = _chunks(batch, accum)
  keys = jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(accum))
  encode = lambda p, mb, key: embed({**view(p), **frozen}, mb, key)
  reps = jax.lax.map(lambda xs: encode(jax.lax.stop_gradient(trained), *xs), (split, keys))
  reps = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), reps)

  def loss_fn(r):
    terms, metrics = head(r, batch)
    return objective.combine(terms, norms), metrics
  (_, metrics), g_reps = jax.value_and_grad(loss_fn, has_aux=True)(reps)
  g_split = _chunks(g_reps, accum)

  def body(g_acc, xs):
    mb, key, g = xs
    _, pull = jax.vjp(lambda p: encode(p, mb, key), trained)
    return jax.tree.map(jnp.add, g_acc, pull(g)[0]), None

  grads, _ = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, trained), (split, keys, g_split))
  return grads, metrics


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
