"""StableAdamW (launch/trainer/stable_adamw.py): two steps computed by hand, one of them
clipped; AdamW exactly when the update RMS stays <= 1; selected by optimizer.name."""
import math

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from launch.trainer import optim
from launch.trainer.stable_adamw import stable_adamw


def test_two_steps_by_hand_the_second_clipped():
  # b1 = b2 = 0.5, lr 0.1, weight decay 0.1 on "w" only, eps negligible.
  tx = stable_adamw(0.1, b1=0.5, b2=0.5, eps=1e-12, weight_decay=0.1,
                    mask={"w": True, "b": False})
  p = {"w": jnp.array([1.0, -2.0]), "b": jnp.array([3.0])}
  s = tx.init(p)
  # Step 1: m_hat = g, v_hat = g^2, so rms = 1 (no clipping) and Adam's step is sign(g).
  u, s = tx.update({"w": jnp.array([1.0, 2.0]), "b": jnp.array([-5.0])}, s, p)
  np.testing.assert_allclose(u["w"], [-0.1 * (1 + 0.1 * 1.0), -0.1 * (1 + 0.1 * -2.0)],
                             rtol=1e-6)
  np.testing.assert_allclose(u["b"], [0.1], rtol=1e-6)  # no decay on "b"
  p = optax.apply_updates(p, u)  # w = [0.89, -2.08], b = [3.1]
  # Step 2, g_w = [8, -16]: m = [4.25, -7.5], m_hat = m / 0.75 = [17/3, -10];
  # v = [32.25, 129], v_hat = v / 0.75 = [43, 172]; g^2 / v_hat = [64/43, 256/172],
  # rms = sqrt(64/43) (both equal), > 1: the whole step of "w" is divided by it.
  # g_b = [1]: m = -0.75, m_hat = -1; v = 6.75, v_hat = 9; rms = 1/3 < 1: not clipped.
  u, s = tx.update({"w": jnp.array([8.0, -16.0]), "b": jnp.array([1.0])}, s, p)
  rms = math.sqrt(64 / 43)
  want_w = [-0.1 * (17 / 3 / math.sqrt(43) + 0.1 * 0.89) / rms,
            -0.1 * (-10 / math.sqrt(172) + 0.1 * -2.08) / rms]
  np.testing.assert_allclose(u["w"], want_w, rtol=1e-5)
  np.testing.assert_allclose(u["b"], [-0.1 * (-1 / 3)], rtol=1e-5)
  assert int(s[0].count) == 2


def test_equals_adamw_while_the_update_rms_stays_at_most_one():
  """Constant gradients: m_hat = g and v_hat = g^2 at every step, rms = 1."""
  kw = {"b1": 0.9, "b2": 0.98, "eps": 1e-6, "weight_decay": 0.01}
  p = {"w": jnp.array([[0.5, -1.0], [2.0, 0.1]]), "b": jnp.array([0.3, -0.2])}
  g = {"w": jnp.array([[0.2, -0.1], [0.05, 0.3]]), "b": jnp.array([1.0, -2.0])}
  ours, ref = stable_adamw(1e-2, mask=optim.decay_mask, **kw), optax.adamw(
      1e-2, mask=optim.decay_mask, **kw)
  pa, pb, sa, sb = p, p, ours.init(p), ref.init(p)
  for _ in range(4):
    ua, sa = ours.update(g, sa, pa)
    ub, sb = ref.update(g, sb, pb)
    pa, pb = optax.apply_updates(pa, ua), optax.apply_updates(pb, ub)
  for k in p:
    np.testing.assert_allclose(pa[k], pb[k], rtol=1e-5, atol=1e-7)


def test_selected_by_config_name_and_used_by_modernbert():
  from configs import modernbert
  c = modernbert.get_config("base")
  assert c.optimizer.name == "stable_adamw" and c.optimizer.clip_norm == 0
  tx, schedule = optim.make_optimizer(c.optimizer, c.train.steps)
  p = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((2,))}}
  s = tx.init(p)
  _, s = tx.update(jax_tree_like(p, 1.0), s, p)
  assert optim.optimizer_step_count(s) == 1 and float(schedule(0)) == 0.0
  assert modernbert.get_config("base,phase=2,remat=full").model.remat_policy == "full"
  assert modernbert.get_config("tiny").optimizer.name == "adamw"  # its documented run
  bad = ml_collections.ConfigDict({"name": "stableadamw"})
  with pytest.raises(ValueError, match="stable_adamw"):
    optim.make_optimizer(bad, 10)


def jax_tree_like(tree, value):
  import jax
  return jax.tree.map(lambda x: jnp.full_like(x, value), tree)


def test_torch_stable_adamw_matches_optax():
  """--compare-hf trains transformers with the config's optimizer; torch has no
  StableAdamW, so the bench's must make ours' updates (three steps, the last clipped)."""
  import torch

  from launch.perf.bench.theirs import torch_stable_adamw
  rng = np.random.RandomState(0)
  w, b = rng.randn(4, 3).astype(np.float32), rng.randn(3).astype(np.float32)
  grads = [(rng.randn(4, 3).astype(np.float32) * s, rng.randn(3).astype(np.float32))
           for s in (0.1, 0.1, 30.0)]  # a spike: the third step of "w" is clipped
  tw, tb = torch.nn.Parameter(torch.tensor(w)), torch.nn.Parameter(torch.tensor(b))
  opt = torch_stable_adamw([{"params": [tw], "weight_decay": 0.01},
                            {"params": [tb], "weight_decay": 0.0}], 1e-2, (0.9, 0.98), 1e-6)
  tx = stable_adamw(1e-2, b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.01,
                    mask={"w": True, "b": False})
  params = {"w": jnp.asarray(w), "b": jnp.asarray(b)}
  state = tx.init(params)
  for gw, gb in grads:
    tw.grad, tb.grad = torch.tensor(gw), torch.tensor(gb)
    opt.step()
    u, state = tx.update({"w": jnp.asarray(gw), "b": jnp.asarray(gb)}, state, params)
    params = optax.apply_updates(params, u)
  np.testing.assert_allclose(tw.detach().numpy(), params["w"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(tb.detach().numpy(), params["b"], rtol=1e-5, atol=1e-6)
