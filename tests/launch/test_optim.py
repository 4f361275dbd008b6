"""launch.trainer.optim: optimizers, schedules, weight-decay mask, clipping, accumulation."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from launch.trainer.optim import decay_mask, make_optimizer, make_schedule, optimizer_step_count


def opt_config(**overrides):
  c = ml_collections.ConfigDict(dict(
      name="adamw", learning_rate=1e-3, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
      schedule="linear", warmup_steps=10, decay_fraction=0.2, clip_norm=0.0,
      grad_accum_steps=1))
  c.update(overrides)
  return c


def values(schedule, steps):
  return np.array([float(schedule(s)) for s in steps])


PEAK = 1e-3


def test_linear_schedule():
  _, sch = make_optimizer(opt_config(schedule="linear", warmup_steps=10), 110)
  np.testing.assert_allclose(values(sch, [0, 5, 10, 60, 110, 200]),
                             [0, PEAK / 2, PEAK, PEAK / 2, 0, 0], rtol=1e-6, atol=1e-12)
  assert float(sch(9)) < PEAK and float(sch(11)) < PEAK


def test_cosine_schedule():
  _, sch = make_optimizer(opt_config(schedule="cosine", warmup_steps=10), 110)
  np.testing.assert_allclose(
      values(sch, [0, 5, 10, 35, 60, 110, 200]),
      [0, PEAK / 2, PEAK, PEAK * (1 + math.cos(math.pi / 4)) / 2, PEAK / 2, 0, 0],
      rtol=1e-5, atol=1e-12)


def test_wsd_schedule():
  # 100 steps, warmup 10, decay over the last 20% = steps 80..100.
  _, sch = make_optimizer(opt_config(schedule="wsd", warmup_steps=10, decay_fraction=0.2), 100)
  np.testing.assert_allclose(values(sch, [0, 5, 10, 50, 80, 90, 100, 150]),
                             [0, PEAK / 2, PEAK, PEAK, PEAK, PEAK / 2, 0, 0],
                             rtol=1e-6, atol=1e-12)


def test_constant_and_no_warmup():
  _, sch = make_optimizer(opt_config(schedule="constant", warmup_steps=4), 100)
  np.testing.assert_allclose(values(sch, [0, 2, 4, 50, 100]), [0, PEAK / 2] + [PEAK] * 3,
                             rtol=1e-6)
  _, sch = make_optimizer(opt_config(schedule="linear", warmup_steps=0), 100)
  np.testing.assert_allclose(values(sch, [0, 50, 100]), [PEAK, PEAK / 2, 0], rtol=1e-6)


def test_schedule_is_jittable():
  sch = make_schedule(opt_config(schedule="cosine"), 100)
  np.testing.assert_allclose(jax.jit(sch)(jnp.int32(30)), sch(30), rtol=1e-6)


def test_unknown_names_and_bad_values():
  with pytest.raises(ValueError, match="unknown optimizer.name 'sgd'"):
    make_optimizer(opt_config(name="sgd"), 100)
  with pytest.raises(ValueError, match="unknown optimizer.schedule 'step'"):
    make_optimizer(opt_config(schedule="step"), 100)
  with pytest.raises(ValueError, match="warmup_steps"):
    make_optimizer(opt_config(warmup_steps=200), 100)
  with pytest.raises(ValueError, match="wsd"):
    make_optimizer(opt_config(schedule="wsd", warmup_steps=50, decay_fraction=0.6), 100)
  with pytest.raises(ValueError, match="grad_accum_steps"):
    make_optimizer(opt_config(grad_accum_steps=0), 100)
  with pytest.raises(ValueError, match="total_steps"):
    make_optimizer(opt_config(), 0)


def test_common_config_section_works():
  from configs.common import base_config
  tx, sch = make_optimizer(base_config().optimizer, 1000)
  assert float(sch(100)) == pytest.approx(1e-4)
  params = {"kernel": jnp.ones((2, 2))}
  jax.jit(tx.update)(params, tx.init(params), params)


class Tiny(nn.Module):
  @nn.compact
  def __call__(self, ids):
    x = nn.Embed(30, 8, name="word_embeddings")(ids)
    x = nn.LayerNorm(name="embeddings_LayerNorm")(x)
    x = nn.DenseGeneral((2, 4), name="query")(x)  # 2-D bias
    x = x.reshape(x.shape[:-2] + (8,))
    x = nn.Dense(8, name="dense")(x)
    x = nn.RMSNorm(name="final_norm")(x)
    return nn.Dense(30, use_bias=False, name="out")(x)


@pytest.fixture(scope="module")
def tiny_params():
  init = jax.jit(Tiny().init)
  return init(jax.random.key(0), jnp.zeros((1, 3), jnp.int32))["params"]


def test_decay_mask_on_flax_params(tiny_params):
  params = tiny_params
  mask = decay_mask(params)
  # Abstract params (as from jax.eval_shape during sharded init) give the same mask.
  assert decay_mask(jax.eval_shape(lambda: params)) == mask
  assert mask == {
      "word_embeddings": {"embedding": True},
      "embeddings_LayerNorm": {"scale": False, "bias": False},
      "query": {"kernel": True, "bias": False},
      "dense": {"kernel": True, "bias": False},
      "final_norm": {"scale": False},
      "out": {"kernel": True},
  }
  assert params["query"]["bias"].ndim == 2  # excluded by name, not by ndim


def test_decay_mask_scanned_layers_and_boxes():
  # Scanned layers add a leading axis: scales and biases become 2-D, still excluded.
  L, D = 3, 4
  params = {"layers": {
      "attention": {"kernel": jnp.ones((L, D, D)), "bias": jnp.ones((L, D))},
      "LayerNorm_0": {"scale": jnp.ones((L, D)), "bias": jnp.ones((L, D))},
      "ln_scale": jnp.ones((L, D)),
  }}
  assert decay_mask(params) == {"layers": {
      "attention": {"kernel": True, "bias": False},
      "LayerNorm_0": {"scale": False, "bias": False},
      "ln_scale": False,
  }}
  boxed = {"dense": {"kernel": nn.LogicallyPartitioned(jnp.ones((D, D)), ("embed", "mlp")),
                     "bias": nn.LogicallyPartitioned(jnp.ones((D,)), ("mlp",))}}
  m = jax.tree.leaves(decay_mask(boxed))
  assert sorted(m) == [False, True]


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_weight_decay_applies_only_where_masked(tiny_params, name):
  """With zero gradients, only decayed leaves move: update = -lr * wd * param (AdamW)."""
  params = jax.tree.map(lambda p: p + 0.5, tiny_params)  # nonzero biases/scales
  tx, _ = make_optimizer(
      opt_config(name=name, schedule="constant", warmup_steps=0, weight_decay=0.1), 10)
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = jax.jit(tx.update)(zeros, tx.init(params), params)
  mask = decay_mask(params)
  for (path, u), m, p in zip(jax.tree_util.tree_leaves_with_path(updates),
                             jax.tree.leaves(mask), jax.tree.leaves(params)):
    if not m:
      assert np.all(np.asarray(u) == 0), path
    else:
      assert np.all(np.asarray(u) != 0), path
      if name == "adamw":
        np.testing.assert_allclose(u, -PEAK * 0.1 * p, rtol=1e-5)


def test_clipping_uses_global_norm():
  params = {"a": {"kernel": jnp.zeros((2, 2))}, "b": {"kernel": jnp.zeros((3, 1))}}
  grads = {"a": {"kernel": jnp.full((2, 2), 3.0)}, "b": {"kernel": jnp.full((3, 1), 4.0)}}
  norm = float(optax.tree.norm(grads))
  tx, _ = make_optimizer(opt_config(clip_norm=1.0, weight_decay=0.0, warmup_steps=0), 10)
  _, state = jax.jit(tx.update)(grads, tx.init(params), params)
  mu = optax.tree_utils.tree_get(state, "mu")
  # Adam's first moment after one step is (1 - b1) * the clipped gradient.
  expected = jax.tree.map(lambda g: 0.1 * g / norm, grads)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5), mu, expected)
  tx, _ = make_optimizer(opt_config(clip_norm=0.0, weight_decay=0.0, warmup_steps=0), 10)
  _, state = jax.jit(tx.update)(grads, tx.init(params), params)
  mu = optax.tree_utils.tree_get(state, "mu")
  jax.tree.map(lambda a, g: np.testing.assert_allclose(a, 0.1 * g, rtol=1e-5), mu, grads)


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_accumulation_equals_mean_gradient_and_counts_updates(name):
  """k micro-steps with MultiSteps == one step on the mean gradient, for several updates,
  with a schedule that changes every update (so micro-step counting would differ)."""
  k, updates = 3, 3
  rs = np.random.RandomState(0)
  params0 = {"dense": {"kernel": jnp.asarray(rs.randn(4, 3), jnp.float32),
                       "bias": jnp.asarray(rs.randn(3), jnp.float32)}}
  micro_grads = [jax.tree.map(lambda p: jnp.asarray(rs.randn(*p.shape), jnp.float32), params0)
                 for _ in range(k * updates)]
  cfg = dict(name=name, schedule="linear", warmup_steps=0, clip_norm=1.0, weight_decay=0.1)
  total = 4  # lr: 1, .75, .5 x peak on the three updates

  acc_tx, sch = make_optimizer(opt_config(grad_accum_steps=k, **cfg), total)
  ref_tx, ref_sch = make_optimizer(opt_config(grad_accum_steps=1, **cfg), total)
  assert [float(sch(i)) for i in range(4)] == [float(ref_sch(i)) for i in range(4)]

  @jax.jit
  def step(tx_state, params, grads):
    upd, tx_state = acc_tx.update(grads, tx_state, params)
    return tx_state, optax.apply_updates(params, upd), upd

  params, state = params0, acc_tx.init(params0)
  ref_params, ref_state = params0, ref_tx.init(params0)
  for u in range(updates):
    for i in range(k):
      before = params
      state, params, upd = step(state, params, micro_grads[u * k + i])
      if i < k - 1:  # mid-accumulation: no change
        assert all(np.all(np.asarray(x) == 0) for x in jax.tree.leaves(upd))
        jax.tree.map(np.testing.assert_array_equal, params, before)
      assert int(optimizer_step_count(state)) == u + (i == k - 1)
    mean = jax.tree.map(lambda *g: sum(g) / k, *micro_grads[u * k:(u + 1) * k])
    upd, ref_state = jax.jit(ref_tx.update)(mean, ref_state, ref_params)
    ref_params = optax.apply_updates(ref_params, upd)
    assert int(optimizer_step_count(ref_state)) == u + 1
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7),
                 params, ref_params)
  # Something did move (the comparison is not vacuous).
  assert not np.allclose(params["dense"]["kernel"], params0["dense"]["kernel"])
