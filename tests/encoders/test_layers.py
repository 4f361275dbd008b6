"""The shared primitives: attention paths agree, packed rows never attend across
documents, remat and sharing keep the numbers."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import encoders
from configs import bert as bert_configs
from encoders import base, layers


def _qkv(seed=0, b=2, t=12, h=2, k=8):
  r = jax.random.split(jax.random.PRNGKey(seed), 3)
  return [jax.random.normal(x, (b, t, h, k)) for x in r]


@pytest.mark.parametrize("window", [None, 4])
def test_xla_attention_matches_einsum(window):
  q, k, v = _qkv()
  lengths = jnp.array([12, 7])
  attn = (jnp.arange(12)[None] < lengths[:, None]).astype(jnp.int32)
  seg = jnp.array([[1] * 5 + [2] * 7, [1] * 3 + [2] * 4 + [0] * 5])
  mask = layers.make_attention_mask(attn, seg, window)
  ref = layers.attention_scores_einsum(q, k, v, mask)
  got = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
  real = attn.astype(bool)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(ref)[real], atol=1e-5)


def test_mask_semantics():
  attn = jnp.array([[1, 1, 1, 1, 0]])
  seg = jnp.array([[1, 1, 2, 2, 0]])
  m = np.asarray(layers.make_attention_mask(attn, seg))[0, 0]
  assert m[0, :2].all() and not m[0, 2:].any()  # doc 1 sees only doc 1
  assert m[2, 2:4].all() and not m[2, :2].any() and not m[2, 4]
  assert not m[:, 4][:4].any()  # nobody attends the padding key


def test_packed_row_equals_documents_run_alone():
  cfg = bert_configs.get_config("tiny").model
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  rng = np.random.RandomState(0)
  doc_a, doc_b = rng.randint(5, 1000, 6), rng.randint(5, 1000, 9)
  packed = np.zeros((1, 20), np.int32)
  packed[0, :6], packed[0, 6:15] = doc_a, doc_b
  seg = np.zeros((1, 20), np.int32)
  seg[0, :6], seg[0, 6:15] = 1, 2
  out = model.apply({"params": params}, jnp.asarray(packed), segment_ids=jnp.asarray(seg))
  alone_a = model.apply({"params": params}, jnp.asarray(doc_a[None]))
  alone_b = model.apply({"params": params}, jnp.asarray(doc_b[None]))
  np.testing.assert_allclose(out.last_hidden_state[0, :6], alone_a.last_hidden_state[0],
                             atol=1e-5)
  np.testing.assert_allclose(out.last_hidden_state[0, 6:15], alone_b.last_hidden_state[0],
                             atol=1e-5)
  np.testing.assert_allclose(out.mlm_logits[0, 6:15], alone_b.mlm_logits[0], atol=1e-4)


def test_positions_restart_per_segment():
  seg = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0]])
  np.testing.assert_array_equal(base.positions_in_segments(seg)[0], [0, 1, 2, 0, 1, 0, 0, 1])


@pytest.mark.parametrize("policy", ["full", "dots_saveable"])
def test_remat_keeps_values_and_grads(policy):
  cfg = bert_configs.get_config("tiny").model.unlock()
  cfg.num_hidden_layers = 1
  ids = jnp.asarray(np.random.RandomState(1).randint(5, 1000, (2, 8)), jnp.int32)
  plain = encoders.build(cfg)
  params = encoders.init_params(plain, jax.random.PRNGKey(0))
  cfg.remat_policy = policy
  remat = encoders.build(cfg)

  def loss(m, p):
    return m.apply({"params": p}, ids).mlm_logits.std()

  np.testing.assert_allclose(loss(remat, params), loss(plain, params), rtol=1e-6)
  g1, g2 = jax.grad(lambda p: loss(plain, p))(params), jax.grad(lambda p: loss(remat, p))(params)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_layer_sharing_reuses_parameters():
  import functools
  import flax.linen as nn
  attn = functools.partial(layers.MultiHeadAttention, num_heads=2, head_dim=4, hidden_size=8)
  mlp = functools.partial(layers.Mlp, 16, 8)
  block = lambda i: functools.partial(layers.EncoderBlock, attn, mlp, layers.LayerNorm)
  enc = layers.Encoder(4, block, layer_to_param=(0, 0, 0, 0))
  x = jnp.ones((1, 3, 8))
  mask = layers.make_attention_mask(jnp.ones((1, 3), jnp.int32))
  params = nn.unbox(enc.init(jax.random.PRNGKey(0), x, mask))["params"]
  assert list(params) == ["layer_0"]


def test_rotary_preserves_norm_and_relative_property():
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 6, 2, 8))
  pos = jnp.arange(6)[None]
  y = layers.rotary(x, pos, 10000.0)
  np.testing.assert_allclose(jnp.linalg.norm(y, axis=-1), jnp.linalg.norm(x, axis=-1),
                             rtol=1e-5)
  # q.k after rotation depends only on the position difference.
  q = jnp.broadcast_to(x[:, :1], x.shape)
  k = jnp.broadcast_to(x[:, 1:2], x.shape)
  rq, rk = layers.rotary(q, pos, 10000.0), layers.rotary(k, pos, 10000.0)
  d1 = (rq[0, 2] * rk[0, 0]).sum(-1)
  d2 = (rq[0, 5] * rk[0, 3]).sum(-1)
  np.testing.assert_allclose(d1, d2, rtol=1e-4)


def test_gated_mlp_shapes():
  import flax.linen as nn
  mlp = layers.Mlp(16, 8, "gelu", gated=True, use_bias=False)
  params = nn.unbox(mlp.init(jax.random.PRNGKey(0), jnp.ones((1, 3, 8))))["params"]
  assert params["wi"]["kernel"].shape == (8, 32) and "bias" not in params["wi"]
