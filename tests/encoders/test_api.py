"""The public contract: pure apply under jit/grad/vmap, dropout only when asked, and bad
input refused with a message naming the problem."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import encoders
from configs import bert as bert_configs
from configs import roberta as roberta_configs


@pytest.fixture(scope="module")
def tiny():
  cfg = bert_configs.get_config("tiny").model
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  rng = np.random.RandomState(0)
  ids = jnp.asarray(rng.randint(5, cfg.vocab_size, (2, 16)), jnp.int32)
  mask = jnp.ones((2, 16), jnp.int32).at[1, 10:].set(0)
  return cfg, model, params, ids, mask


def test_output_fields(tiny):
  cfg, model, params, ids, mask = tiny
  out = model.apply({"params": params}, ids, mask)
  assert out.last_hidden_state.shape == (2, 16, cfg.hidden_size)
  assert out.mlm_logits.shape == (2, 16, cfg.vocab_size)
  assert out.nsp_logits.shape == (2, 2)
  assert out.sop_logits is None and out.rtd_logits is None


def test_jit_matches_eager(tiny):
  _, model, params, ids, mask = tiny
  eager = model.apply({"params": params}, ids, mask)
  jitted = jax.jit(lambda p, i, m: model.apply({"params": p}, i, m))(params, ids, mask)
  np.testing.assert_allclose(jitted.mlm_logits, eager.mlm_logits, atol=1e-5)


def test_grad_is_finite_and_nonzero(tiny):
  _, model, params, ids, mask = tiny

  def loss(p):
    return model.apply({"params": p}, ids, mask).mlm_logits.mean()

  grads = jax.jit(jax.grad(loss))(params)
  leaves = jax.tree.leaves(grads)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
  assert float(jnp.abs(grads["encoder"]["layer_0"]["attention"]["query"]["kernel"]).sum()) > 0


def test_vmap_over_stacked_batches(tiny):
  _, model, params, ids, mask = tiny
  stacked_ids, stacked_mask = jnp.stack([ids, ids[::-1]]), jnp.stack([mask, mask[::-1]])
  out = jax.vmap(lambda i, m: model.apply({"params": params}, i, m).last_hidden_state)(
      stacked_ids, stacked_mask)
  single = model.apply({"params": params}, ids[::-1], mask[::-1]).last_hidden_state
  np.testing.assert_allclose(out[1], single, atol=1e-5)


def test_deterministic_unless_dropout_requested(tiny):
  _, model, params, ids, mask = tiny
  a = model.apply({"params": params}, ids, mask).last_hidden_state
  b = model.apply({"params": params}, ids, mask).last_hidden_state
  np.testing.assert_array_equal(a, b)
  d1 = model.apply({"params": params}, ids, mask, deterministic=False,
                   rngs={"dropout": jax.random.PRNGKey(1)}).last_hidden_state
  d2 = model.apply({"params": params}, ids, mask, deterministic=False,
                   rngs={"dropout": jax.random.PRNGKey(2)}).last_hidden_state
  assert not np.allclose(d1, a) and not np.allclose(d1, d2)


@pytest.mark.parametrize("bad,match", [
    (lambda ids: ids.at[0, 3].set(30522), "input_ids contains 30522, outside"),
    (lambda ids: ids.at[1, 0].set(-1), "input_ids contains -1"),
    (lambda ids: ids.astype(jnp.float32), "integer dtype"),
    (lambda ids: jnp.zeros((2, 513), jnp.int32), "exceeds the model's maximum of 512"),
    (lambda ids: ids[0], r"\(batch, length\)"),
])
def test_bad_input_ids(tiny, bad, match):
  _, model, params, ids, _ = tiny
  with pytest.raises(ValueError, match=match):
    model.apply({"params": params}, bad(ids))


def test_bad_companions(tiny):
  _, model, params, ids, mask = tiny
  with pytest.raises(ValueError, match="attention_mask has shape"):
    model.apply({"params": params}, ids, mask[:, :8])
  with pytest.raises(ValueError, match="token_type_ids contains 2"):
    model.apply({"params": params}, ids, mask, jnp.full_like(ids, 2))
  with pytest.raises(ValueError, match="attention_mask contains 3"):
    model.apply({"params": params}, ids, mask * 3)
  with pytest.raises(ValueError, match="token_type_ids must be integer"):
    model.apply({"params": params}, ids, mask, jnp.zeros(ids.shape, jnp.float32))


def test_shape_errors_raise_while_tracing(tiny):
  _, model, params, ids, mask = tiny
  with pytest.raises(ValueError, match="attention_mask has shape"):
    jax.jit(lambda i, m: model.apply({"params": params}, i, m))(ids, mask[:, :4])


def test_roberta_length_limit_accounts_for_offset():
  cfg = roberta_configs.get_config("base").model
  model = encoders.build(cfg)
  ids = jnp.full((1, 513), 5, jnp.int32)
  with pytest.raises(ValueError, match="maximum of 512"):
    jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), ids))
