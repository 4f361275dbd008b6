"""StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for large-scale
vision-language models", Algorithm 2), the optimizer of ModernBERT (Warner et al. 2024),
as an optax transformation. `optimizer.name = "stable_adamw"` selects it
(launch/trainer/optim.py).

AdamW with AdaFactor's update clipping applied per parameter tensor: for each tensor,

  m = b1 m + (1 - b1) g,        v = b2 v + (1 - b2) g^2,
  m_hat = m / (1 - b1^t),       v_hat = v / (1 - b2^t),
  rms   = sqrt(mean(g^2 / max(v_hat, eps^2)))
  step  = lr / max(1, rms)
  p    <- p - step * (m_hat / (sqrt(v_hat) + eps) + wd * p)

so a tensor whose gradient is large against its running second moment (a loss spike, a
stale v after a quiet stretch) takes a proportionally smaller step, its weight decay
included; with rms <= 1 it is AdamW exactly. This replaces global gradient-norm clipping
(the paper turns that off). The learning rate comes last (`scale_by_learning_rate`), so
the trainer's schedule counter is found as for optax.adamw.
"""
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class ScaleByStableAdamState(NamedTuple):
  count: jax.Array
  mu: Any
  nu: Any


def scale_by_stable_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                         weight_decay: float = 0.0,
                         mask: Any = None
                         ) -> optax.GradientTransformation:
  """The StableAdamW direction before the learning rate (module docstring): per tensor,
  (Adam's update + weight_decay * param where `mask`) / max(1, rms)."""
  if not (0 <= b1 < 1 and 0 <= b2 < 1):
    raise ValueError(f"stable_adamw: b1={b1}, b2={b2} must be in [0, 1)")
  if not eps > 0:
    raise ValueError(f"stable_adamw: eps={eps} must be > 0")

  def init(params):
    zeros = lambda p: jnp.zeros(jnp.shape(p), jnp.float32)
    return ScaleByStableAdamState(jnp.zeros([], jnp.int32), jax.tree.map(zeros, params),
                                  jax.tree.map(zeros, params))

  def update(updates, state, params=None):
    if weight_decay and params is None:
      raise ValueError("stable_adamw with weight decay needs the params in update()")
    count = optax.safe_increment(state.count)
    t = count.astype(jnp.float32)
    c1, c2 = 1 - b1 ** t, 1 - b2 ** t
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g.astype(jnp.float32), state.mu,
                      updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g.astype(jnp.float32)),
                      state.nu, updates)
    if weight_decay:
      decay = mask(params) if callable(mask) else mask
      if decay is None:
        decay = jax.tree.map(lambda _: True, params)
    else:
      decay = jax.tree.map(lambda _: False, updates)

    def leaf(g, m, v, p, d):
      g = g.astype(jnp.float32)
      v_hat = v / c2
      rms = jnp.sqrt(jnp.mean(jnp.square(g) / jnp.maximum(v_hat, eps * eps)))
      u = (m / c1) / (jnp.sqrt(v_hat) + eps)
      if d:
        u = u + weight_decay * p.astype(jnp.float32)
      return (u / jnp.maximum(1.0, rms)).astype(p.dtype)

    ps = params if params is not None else updates  # read only where decay applies
    new = jax.tree.map(leaf, updates, mu, nu, ps, decay)
    return new, ScaleByStableAdamState(count, mu, nu)

  return optax.GradientTransformation(init, update)


def stable_adamw(learning_rate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                 weight_decay: float = 0.0, mask=None) -> optax.GradientTransformation:
  """StableAdamW: `scale_by_stable_adam` then the (scheduled) learning rate."""
  return optax.chain(scale_by_stable_adam(b1, b2, eps, weight_decay, mask),
                     optax.scale_by_learning_rate(learning_rate))
