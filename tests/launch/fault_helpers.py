"""Shared fault injection for the trainer tests."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from launch.trainer import step as step_lib


def poison_gradients(monkeypatch, is_bad):
  """Train steps whose call number n (1-based) has `is_bad(n)` get NaN gradients (the
  flag comes from the host through an ordered io_callback, so it follows the calls)."""
  from jax.experimental import io_callback
  calls = {"n": 0}

  def flag():
    calls["n"] += 1
    return np.float32(np.nan if is_bad(calls["n"]) else 1.0)

  orig = step_lib.gradients

  def poisoned(*args):
    grads, metrics = orig(*args)
    f = io_callback(flag, jax.ShapeDtypeStruct((), jnp.float32), ordered=True)
    return jax.tree.map(lambda g: g * f, grads), metrics

  monkeypatch.setattr(step_lib, "gradients", poisoned)


CKPT = ml_collections.ConfigDict({"keep": 3, "use_async": True})


def tiny_state(value):
  """A TrainState whose step and one (64, 64) param hold `value` (checkpoint tests)."""
  return step_lib.TrainState(step=jnp.int32(value), params={"w": jnp.full((64, 64), value,
                                                                          jnp.float32)},
                             frozen={}, opt_state=(), rng=jnp.zeros(2, jnp.uint32))
