"""The embedding task's in-batch negatives are the global batch on a data-parallel mesh:
the trainer's step gives the same loss and gradients on 8 CPU devices (the batch split
over them) as on one; and the gradient cache (grad_accum_steps > 1) gives the plain
step's gradients."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import objectives
from configs import finetune as finetune_configs
from launch.trainer import state as state_lib
from launch.trainer import step as step_lib
from tests.launch import finetune_helpers as fh

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (fake) devices")


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
  return fh.tiny_bert_dir(str(tmp_path_factory.mktemp("bert") / "bert"),
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _config(bert_dir, data=1, accum=1, negatives=1, symmetric=False, matryoshka=()):
  c = finetune_configs.get_config("embedding").unlock()
  c.init_from = bert_dir
  c.finetune.embedding.negative_columns = ("negative",) * negatives
  c.finetune.embedding.symmetric = symmetric
  c.finetune.embedding.matryoshka_dims = matryoshka
  c.data.seq_len, c.data.global_batch = 16, 16
  c.optimizer.grad_accum_steps = accum
  c.mesh.shape = (data, 1, 1)
  objectives.prepare_config(c)
  return c


def _batch(setup):
  """16 rows of random lengths; the last two only fill the batch (weight 0)."""
  rng = np.random.RandomState(0)
  layout = [[int(n)] for n in rng.randint(3, 16, 14)] + [[], []]
  return setup.objective.batch_spec().synthesize(layout, 16, seed=1)


def _grads(config, devices):
  """(grads, metric sums) of the trainer's gradient function, jitted with the step's
  shardings (params as the optimizer holds them, the batch split over `data`)."""
  setup = state_lib.build(config, None, devices)
  state = setup.init_state()
  batch = _batch(setup)
  accum = int(config.optimizer.grad_accum_steps)

  def fn(params, frozen, b):
    return step_lib.gradients(setup.objective, params, frozen, b, jax.random.PRNGKey(3),
                              accum)
  fn = jax.jit(fn, in_shardings=(setup.state_shardings.params,
                                 setup.state_shardings.frozen, setup.batch_sharding))
  with jax.set_mesh(setup.mesh):
    grads, sums = fn(state.params, state.frozen, jax.device_put(batch, setup.batch_sharding))
  return jax.device_get(grads), jax.device_get(sums)


def _close(got, want, atol):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    assert np.isfinite(x).all(), path
    np.testing.assert_allclose(x, y, atol=atol, rtol=1e-4, err_msg=str(path))


def _same(got, want):
  np.testing.assert_allclose(got[1]["task_loss_sum"], want[1]["task_loss_sum"], rtol=1e-5)
  np.testing.assert_allclose(got[1]["task_correct_sum"], want[1]["task_correct_sum"])
  _close(got[0], want[0], 1e-5)


@pytest.mark.slow  # ~55 s on 2 shared cores: three compiles of the step's gradients
def test_eight_devices_with_the_gradient_cache_give_the_one_device_step(bert_dir):
  """The cache over 2 chunks of the batch split over 8 devices (1 row per device and
  chunk) against the plain step on one device."""
  one = _grads(_config(bert_dir, 1), jax.devices()[:1])
  assert one[1]["task_weight_sum"] == 14
  # the global batch's 14 positives + 14 negatives are every anchor's candidates: a
  # random model's loss is near log(28) (per-device candidates, 2 + 2, would give ~log 4)
  assert 2.5 < one[1]["task_loss_sum"] / 14 < 4.5
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(one[0])) > 1e-4
  _same(_grads(_config(bert_dir, 8, accum=2), jax.devices()[:8]), one)


@pytest.mark.slow
@pytest.mark.parametrize("symmetric,matryoshka", [(False, ()), (True, ()), (False, (32, 8))])
def test_eight_devices_and_the_cache_each_give_the_one_device_step(bert_dir, symmetric,
                                                                   matryoshka):
  kw = dict(symmetric=symmetric, matryoshka=matryoshka)
  one = _grads(_config(bert_dir, 1, **kw), jax.devices()[:1])
  _same(_grads(_config(bert_dir, 8, **kw), jax.devices()[:8]), one)
  _same(_grads(_config(bert_dir, 1, accum=4, **kw), jax.devices()[:1]), one)
