"""Shared fault injection for the trainer tests."""
import jax
import jax.numpy as jnp
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
