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


def test_round_cotangent_rounds_the_backward_only():
  """The value passes unchanged; the cotangent comes back rounded to the narrower dtype
  (exactly what a bfloat16 cast would give), and a dtype that is not narrower is a no-op."""
  x = jnp.linspace(-3.0, 3.0, 64, dtype=jnp.float32)
  w = jnp.asarray(np.random.RandomState(0).randn(64), jnp.float32)  # not bf16-representable
  f = lambda x: jnp.sum(layers.round_cotangent(x, jnp.bfloat16) * w)
  value, grad = jax.value_and_grad(f)(x)
  np.testing.assert_array_equal(np.asarray(layers.round_cotangent(x, jnp.bfloat16)), x)
  np.testing.assert_allclose(float(value), float(jnp.sum(x * w)), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(grad), np.asarray(w.astype(jnp.bfloat16), np.float32))
  assert not np.array_equal(np.asarray(grad), np.asarray(w))
  assert layers.round_cotangent(x, jnp.float32) is x
  h = x.astype(jnp.bfloat16)
  assert layers.round_cotangent(h, jnp.bfloat16) is h


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
  apply = jax.jit(model.apply)
  out = apply({"params": params}, jnp.asarray(packed), segment_ids=jnp.asarray(seg))
  alone_a = apply({"params": params}, jnp.asarray(doc_a[None]))
  alone_b = apply({"params": params}, jnp.asarray(doc_b[None]))
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
  g1 = jax.jit(jax.grad(lambda p: loss(plain, p)))(params)
  g2 = jax.jit(jax.grad(lambda p: loss(remat, p)))(params)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, atol=1e-6)


def _toy_block(i=0, rate=0.0):
  import functools
  attn = functools.partial(layers.MultiHeadAttention, num_heads=2, head_dim=4, hidden_size=8,
                           impl="einsum", dropout_rate=rate)
  mlp = functools.partial(layers.Mlp, 16 + 4 * i, 8)
  return functools.partial(layers.EncoderBlock, attn, mlp, layers.LayerNorm,
                           dropout_rate=rate)


def _toy_inputs(b=2, t=5):
  mask = jnp.ones((b, t), jnp.int32).at[1, 3:].set(0)
  return layers.AttentionInputs(mask=layers.make_attention_mask(mask))


def _init_apply(stack, x, inputs, params=None, rng=None):
  import flax.linen as nn
  if params is None:
    params = nn.unbox(stack.init(jax.random.PRNGKey(0), x, inputs))["params"]
  rngs = {"dropout": rng} if rng is not None else {}
  return params, stack.apply({"params": params}, x, inputs, rng is None, rngs=rngs)


def test_layer_sharing_reuses_parameters():
  enc = layers.Stack(4, _toy_block, layer_to_param=(0, 0, 0, 0))
  params, _ = _init_apply(enc, jnp.ones((2, 5, 8)), _toy_inputs())
  assert list(params) == ["layer_0"]


@pytest.mark.parametrize("mapping", [  # the first two are slow: (0, 1, 1, 0) covers both
    pytest.param((0, 0, 0, 0), marks=pytest.mark.slow),
    pytest.param((0, 0, 1, 1), marks=pytest.mark.slow), (0, 1, 1, 0)])
def test_scan_over_shared_parameters_matches_the_loop(mapping):
  """ALBERT's sharing under scan: runs of layers that share a set are one nn.scan with the
  set's params broadcast; values, grads and dropout-free outputs equal the plain loop."""
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 8))
  inputs = _toy_inputs()
  loop = layers.Stack(4, _toy_block, layer_to_param=mapping, param_name="group")
  scan = layers.Stack(4, _toy_block, layer_to_param=mapping, param_name="group", scan=True)
  params, ref = _init_apply(loop, x, inputs)
  params2, _ = _init_apply(scan, x, inputs)
  assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, params2)
  assert sorted(params) == [f"group_{j}" for j in sorted(set(mapping))]
  _, got = _init_apply(scan, x, inputs, params)
  np.testing.assert_allclose(got, ref, atol=1e-5)
  loss = lambda m: (lambda p: (m.apply({"params": p}, x, inputs) ** 2).sum())
  g1, g2 = jax.jit(jax.grad(loss(loop)))(params), jax.jit(jax.grad(loss(scan)))(params)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
  # Dropout differs per layer inside a shared scan (the rngs are split per iteration).
  scan_drop = layers.Stack(4, lambda i: _toy_block(i, 0.3), layer_to_param=mapping,
                           param_name="group", scan=True)
  _, a = _init_apply(scan_drop, x, inputs, params, jax.random.PRNGKey(2))
  _, b = _init_apply(scan_drop, x, inputs, params, jax.random.PRNGKey(3))
  assert np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-3


@pytest.mark.parametrize("num_layers", [6, 7])
def test_scan_over_a_period_of_different_blocks_matches_unrolled(num_layers):
  """A repeating period of different blocks (ModernBERT's global, local, local) scans as
  one unit; the L % period layers left over run after it; stacking converts the params."""
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 8))
  inputs = _toy_inputs()
  block = lambda i: _toy_block(i % 3)  # three different MLP widths
  plain = layers.Stack(num_layers, block)
  scan = layers.Stack(num_layers, block, scan=True, period=3)
  params, ref = _init_apply(plain, x, inputs)
  stacked = layers.stack_layer_params(params, num_layers, period=3)
  assert stacked["layers"]["layer_1"]["mlp"]["wi"]["kernel"].shape == (2, 8, 20)
  assert ("layer_6" in stacked) == (num_layers == 7)
  _, got = _init_apply(scan, x, inputs, stacked)
  np.testing.assert_allclose(got, ref, atol=1e-5)
  back = layers.unstack_layer_params(stacked, period=3)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)


def test_dropout_counters_never_repeat_past_one_word():
  """Each element gets a distinct (low, high) counter pair even when the tensor has more
  elements than one counter word (2^32; a small word here), and below one word the
  counter is the flat index (the counter of jax.random.bits)."""
  from encoders.layers import dropout
  low, high = dropout.counters((3, 5, 7), word=40)  # 105 elements > 40: batch dim goes high
  pairs = set(zip(np.asarray(low).ravel().tolist(), np.asarray(high).ravel().tolist()))
  assert len(pairs) == 105 and int(np.asarray(low).max()) < 40
  low, high = dropout.counters((3, 5, 7))
  np.testing.assert_array_equal(np.asarray(low).ravel(), np.arange(105))
  assert not np.asarray(high).any()
  # BERT-large attention dropout at 1k rows x 512 tokens: 2^32 elements, batch goes high.
  assert dropout.counter_split((1024, 16, 512, 512)) == 1
  from jax.extend.random import threefry2x32_p
  key = jnp.array([7, 9], jnp.uint32)
  i = jnp.arange(24, dtype=jnp.uint32)
  want = threefry2x32_p.bind(key[0], key[1], i, jnp.zeros_like(i))[0].reshape(4, 6)
  np.testing.assert_array_equal(layers.random_bits(key, (4, 6)), want)


def test_dropout_keeps_its_rate_with_the_mask_behind_a_barrier():
  """Kept values are scaled by 1/keep_prob, the keep rate is keep_prob, and the mask is
  materialised behind an optimization barrier: fused into its consumers, the 20-round
  cipher made the v6e compile of a BERT-base step run past 30 minutes."""
  from encoders.layers import dropout
  x = jnp.ones((64, 1024), jnp.float32)
  mod = dropout.Dropout(0.25)
  run = lambda x, k: mod.apply({}, x, deterministic=False, rngs={"dropout": k})
  y = np.asarray(run(x, jax.random.PRNGKey(3)))
  kept = y != 0
  np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
  assert abs(kept.mean() - 0.75) < 0.01  # 65,536 draws: standard error 0.0017
  assert "optimization_barrier" in str(jax.make_jaxpr(run)(x, jax.random.PRNGKey(3)))


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


def test_attention_reads_its_mask_kind_and_query_stream_from_the_inputs():
  """One struct carries every layer's attention inputs: a local layer takes the windowed
  mask, a separate query stream changes only the queries (keys and values stay from x)."""
  import flax.linen as nn
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 9, 8))
  query = jax.random.normal(jax.random.PRNGKey(1), (1, 9, 8))
  valid = jnp.ones((1, 9), jnp.int32)
  inputs = layers.AttentionInputs(mask=layers.make_attention_mask(valid),
                                  local_mask=layers.make_attention_mask(valid, None, 4))
  glob = layers.MultiHeadAttention(2, 4, 8, impl="einsum")
  local = layers.MultiHeadAttention(2, 4, 8, impl="einsum", mask_kind="local")
  params = nn.unbox(glob.init(jax.random.PRNGKey(2), x, inputs))["params"]

  def manual(mask, q_in):
    q, k, v = glob.apply({"params": params}, x, q_in, method=glob.project)
    ctx = layers.attention_scores_einsum(q, k, v, mask)
    return glob.apply({"params": params}, ctx, method=lambda m, c: m.out(c))

  np.testing.assert_allclose(local.apply({"params": params}, x, inputs),
                             manual(inputs.local_mask, x), atol=1e-5)
  with_query = inputs.replace(query=query)
  np.testing.assert_allclose(glob.apply({"params": params}, x, with_query),
                             manual(inputs.mask, query), atol=1e-5)
  assert not np.allclose(glob.apply({"params": params}, x, inputs),
                         local.apply({"params": params}, x, inputs), atol=1e-3)
  with pytest.raises(ValueError, match="local"):
    local.apply({"params": params}, x, layers.AttentionInputs(mask=inputs.mask))


def test_sinusoidal_position_init_is_the_scaled_table_and_stays_learned():
  emb = layers.Embeddings(vocab_size=11, embedding_size=16, max_position_embeddings=32,
                          init_std=0.02, position_init="sinusoidal")
  ids = jnp.zeros((1, 4), jnp.int32)
  params = emb.init(jax.random.PRNGKey(0), ids, jnp.arange(4)[None])["params"]
  table = np.asarray(nn_unbox(params["position_embeddings"]["embedding"]))
  want = 0.02 * np.sqrt(2.0) * np.asarray(layers.sinusoidal_table(32, 16))
  np.testing.assert_allclose(table, want, rtol=1e-6, atol=1e-7)
  assert abs(np.sqrt((table ** 2).mean()) - 0.02) < 0.002  # the same RMS as N(0, 0.02)
  # neighbours start similar (the point of the init); N(0, std) rows start unrelated
  cos = (table[:-1] * table[1:]).sum(1) / (np.linalg.norm(table[:-1], axis=1)
                                           * np.linalg.norm(table[1:], axis=1))
  assert cos.mean() > 0.5
  bad = layers.Embeddings(vocab_size=11, embedding_size=16, max_position_embeddings=32,
                          position_init="sine")
  with pytest.raises(ValueError, match="position_init='sine'"):
    bad.init(jax.random.PRNGKey(0), ids, jnp.arange(4)[None])


def test_bert_position_init_reaches_the_model():
  cfg = encoders.family_defaults("bert")
  cfg.update(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
             intermediate_size=32, max_position_embeddings=24, position_init="sinusoidal")
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  table = np.asarray(params["embeddings"]["position_embeddings"]["embedding"])
  want = 0.02 * np.sqrt(2.0) * np.asarray(layers.sinusoidal_table(24, 16))
  np.testing.assert_allclose(table, want, rtol=1e-6, atol=1e-7)


def test_distilbert_position_init_reaches_the_model():
  """DistilBERT shares BERT's model section, position_init included; it must not be
  silently dropped (a learned table starts from the sinusoidal init when asked)."""
  cfg = encoders.family_defaults("distilbert")
  cfg.update(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
             intermediate_size=32, max_position_embeddings=24, position_init="sinusoidal")
  params = encoders.init_params(encoders.build(cfg), jax.random.PRNGKey(0))
  table = np.asarray(params["embeddings"]["position_embeddings"]["embedding"])
  want = 0.02 * np.sqrt(2.0) * np.asarray(layers.sinusoidal_table(24, 16))
  np.testing.assert_allclose(table, want, rtol=1e-6, atol=1e-7)


def nn_unbox(x):
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  return nn.unbox(x)
