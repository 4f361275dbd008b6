"""NaN/inf and gradient-spike policy (launch/trainer/guard.py): skip-and-count or stop, and
no checkpoint holding NaN."""
import os

import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from launch import trainer as train
from launch.trainer import checkpoint as ckpt_lib
from launch.trainer import guard
from launch.trainer import metrics as metrics_lib
from launch.trainer import step as step_lib
from tests.launch import fault_helpers
from tests.launch.train_helpers import copy_workdir, first_devices, small_config
from tests.launch.train_helpers import tokenizer_cache  # noqa: F401  (a fixture)


def _cfg(**kw):
  return ml_collections.ConfigDict({"nonfinite_policy": "skip", "grad_spike_factor": 0.0,
                                    "grad_spike_warmup": 3, **kw})


def test_select_undoes_a_nonfinite_update_and_counts_it():
  old, new = {"w": jnp.ones(3)}, {"w": jnp.full(3, 2.0)}
  sums = {"mlm_loss_sum": jnp.float32(np.nan), "grad_norm": jnp.float32(1.0),
          "learning_rate": jnp.float32(0.1)}
  p, _, s = guard.select(_cfg(), old, (), new, (), sums)
  np.testing.assert_array_equal(p["w"], old["w"])
  assert float(s["skipped_nonfinite"]) == 1 and float(s["mlm_loss_sum"]) == 0
  assert float(s["learning_rate"]) == np.float32(0.1)
  p, _, s = guard.select(_cfg(), old, (), new, (), dict(sums, mlm_loss_sum=jnp.float32(3)))
  np.testing.assert_array_equal(p["w"], new["w"])
  assert float(s["skipped_nonfinite"]) == 0
  p, _, _ = guard.select(_cfg(nonfinite_policy="off"), old, (), new, (), sums)
  np.testing.assert_array_equal(p["w"], new["w"])
  with pytest.raises(ValueError, match="nonfinite_policy"):
    guard.settings(_cfg(nonfinite_policy="ignore"))


def test_spike_detection_after_warmup():
  cfg = _cfg(grad_spike_factor=4.0)
  tx = guard.wrap(optax.sgd(1.0), cfg)
  params = {"w": jnp.zeros(2)}
  state = tx.init(params)
  flags = []
  for norm in [1.0, 1.2, 0.9, 1.1, 10.0, 1.0]:
    grads = {"w": jnp.array([norm, 0.0])}
    updates, new_state = tx.update(grads, state, params)
    new_params = optax.apply_updates(params, updates)
    sums = {"grad_norm": optax.tree.norm(grads), "learning_rate": jnp.float32(1)}
    params, state, sums = guard.select(cfg, params, state, new_params, new_state, sums)
    flags.append(float(sums["skipped_spike"]))
  assert flags == [0, 0, 0, 0, 1, 0]
  np.testing.assert_allclose(params["w"], [-(1 + 1.2 + 0.9 + 1.1 + 1.0), 0], rtol=1e-6)
  assert guard.wrap(optax.sgd(1.0), _cfg()) is not None  # factor 0: tx itself


def test_stop_policy_message_names_the_steps():
  with pytest.raises(FloatingPointError, match=r"step 7.*steps 5\.\.7.*1 with a NaN"):
    guard.check({"skipped_nonfinite": 1.0}, _cfg(nonfinite_policy="stop"), 7, 4)
  guard.check({"skipped_nonfinite": 1.0}, _cfg(), 7, 4)  # skip: no error


def test_checkpoint_with_nan_is_never_written(tmp_path):
  state = step_lib.TrainState(step=jnp.int32(1), params={"w": jnp.array([1.0, np.nan])},
                              frozen={}, opt_state=(), rng=jnp.zeros(2, jnp.uint32))
  mngr = ckpt_lib.Manager(str(tmp_path / "ck"), ml_collections.ConfigDict(
      {"keep": 2, "use_async": False}))
  with pytest.raises(FloatingPointError, match="refusing to write the checkpoint of step 1"):
    mngr.save(1, state, {"grain": {}})
  mngr.close()
  assert mngr.latest_step() is None


def _poison_step(monkeypatch, bad_call):
  """The `bad_call`-th train step (1-based) gets NaN gradients."""
  fault_helpers.poison_gradients(monkeypatch, lambda n: n == bad_call)


@pytest.mark.slow  # ~1 min under load; the select/check/save unit tests stay default
def test_nan_step_skipped_and_counted(tmp_path, tokenizer_cache, monkeypatch):
  _poison_step(monkeypatch, 2)
  wd = copy_workdir(tmp_path, "skip", tokenizer_cache)
  out = train.train_and_evaluate(small_config(train__nonfinite_policy="skip"), wd,
                                 first_devices(1))
  rec = {r["step"]: r for r in metrics_lib.read(wd) if r.get("split") == "train"}
  assert [rec[s]["skipped_nonfinite"] for s in range(1, 7)] == [0, 1, 0, 0, 0, 0]
  assert [rec[s]["skipped_total"] for s in range(1, 7)] == [0, 1, 1, 1, 1, 1]
  # the skipped step shows no loss (never a 0.0 mean of nothing); the others are finite
  assert "mlm_loss" not in rec[2] and rec[2]["applied_steps"] == 0
  assert all(np.isfinite(rec[s]["mlm_loss"]) for s in rec if s != 2)
  assert bool(guard._all_finite(out["state"].params))
  assert os.path.isfile(os.path.join(wd, "hf", "model.safetensors"))


@pytest.mark.slow
def test_nan_step_stops_before_any_checkpoint_holds_it(tmp_path, tokenizer_cache,
                                                      monkeypatch):
  _poison_step(monkeypatch, 2)
  wd = copy_workdir(tmp_path, "stop", tokenizer_cache)
  config = small_config(train__nonfinite_policy="stop", train__log_every=5,
                        checkpoint__every=1, checkpoint__use_async=False)
  with pytest.raises(FloatingPointError, match="training stopped at step 2"):
    train.train_and_evaluate(config, wd, first_devices(1))
  steps = sorted(int(d) for d in os.listdir(os.path.join(wd, "checkpoints")) if d.isdigit())
  assert steps == [1]
