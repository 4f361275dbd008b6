"""The speed paths keep the numbers: vocabulary padding (padding rows never predicted),
scan over layers (HF import/export through stacked params), the Splash attention kernel
(run in the Pallas interpreter here; it compiles for TPU in tests/launch/test_aot.py),
and the MLM head on gathered positions."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import encoders
from configs import bert as bert_configs
from encoders import base, layers
from tests.encoders import hf_helpers as H

ATOL = 1e-4


def _logits(model, params, ids, mask, types):
  return model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask),
                     jnp.asarray(types))


def _assert_export_reloads(model, params, hf, tmp_path, batch, ref):
  """`encoders.to_hf` output loads in transformers and gives the reference MLM logits."""
  encoders.to_hf(model, params, str(tmp_path / "out"))
  back = type(hf).from_pretrained(str(tmp_path / "out")).eval()
  np.testing.assert_allclose(H.torch_outputs(back, *batch)["mlm_logits"],
                             ref["mlm_logits"], atol=1e-6)


# ---------------------------------------------------------------------------- vocab padding


@pytest.mark.parametrize("arch", ["BertForPreTraining", "RobertaForMaskedLM"])
def test_vocab_padding_parity_and_padding_never_predicted(arch, tmp_path):
  hf = H.tiny_hf_model(arch, seed=1)
  hf.save_pretrained(tmp_path / "in")
  model, params = encoders.from_hf(str(tmp_path / "in"), vocab_pad_multiple=128)
  v = hf.config.vocab_size
  assert base.padded_vocab_size(model.config) == 128
  assert params["embeddings"]["word_embeddings"]["embedding"].shape[0] == 128
  assert params["mlm"]["bias"].shape == (128,)
  ids, mask, types = H.padded_batch(hf.config)
  ref = H.torch_outputs(hf, ids, mask, types)
  out = _logits(model, params, ids, mask, types)
  assert out.mlm_logits.shape[-1] == v
  np.testing.assert_allclose(np.asarray(out.mlm_logits), ref["mlm_logits"], atol=ATOL)

  # Rows past the vocabulary cannot win: make them enormous, nothing changes.
  poisoned = jax.tree.map(lambda x: x, params)
  emb = poisoned["embeddings"]["word_embeddings"]["embedding"]
  poisoned["embeddings"]["word_embeddings"]["embedding"] = emb.at[v:].set(1e4)
  poisoned["mlm"]["bias"] = poisoned["mlm"]["bias"].at[v:].set(1e9)
  out2 = _logits(model, poisoned, ids, mask, types)
  np.testing.assert_array_equal(np.asarray(out2.mlm_logits), np.asarray(out.mlm_logits))
  assert int(np.asarray(out2.mlm_logits).argmax(-1).max()) < v

  # Export cuts the padding off again: transformers loads it and agrees.
  _assert_export_reloads(model, params, hf, tmp_path, (ids, mask, types), ref)


def test_vocab_padding_gets_no_gradient_from_the_mlm_loss():
  cfg = bert_configs.get_config("tiny").model.unlock()
  cfg.vocab_size, cfg.vocab_pad_multiple, cfg.num_hidden_layers = 1000, 128, 1
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  ids = jnp.asarray(np.random.RandomState(0).randint(5, 1000, (2, 8)), jnp.int32)

  def loss(p):
    logits = model.apply({"params": p}, ids).mlm_logits
    return -jax.nn.log_softmax(logits)[..., 7].mean()

  g = jax.jit(jax.grad(loss))(params)
  assert float(jnp.abs(g["embeddings"]["word_embeddings"]["embedding"][1000:]).max()) == 0.0
  assert float(jnp.abs(g["mlm"]["bias"][1000:]).max()) == 0.0


# ---------------------------------------------------------------------------- scan layers


@pytest.mark.parametrize("arch", ["BertForPreTraining", "RobertaForMaskedLM"])
def test_scan_layers_hf_parity_and_roundtrip(arch, tmp_path):
  hf = H.tiny_hf_model(arch, seed=2)
  hf.save_pretrained(tmp_path / "in")
  model, params = encoders.from_hf(str(tmp_path / "in"), scan_layers=True)
  stacked = params["encoder"]["layers"]
  assert "layer_0" not in params["encoder"]
  assert stacked["attention"]["query"]["kernel"].shape[0] == hf.config.num_hidden_layers
  ids, mask, types = H.padded_batch(hf.config, seed=4)
  ref = H.torch_outputs(hf, ids, mask, types)
  out = _logits(model, params, ids, mask, types)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real],
                             ref["last_hidden_state"][real], atol=ATOL)
  np.testing.assert_allclose(np.asarray(out.mlm_logits), ref["mlm_logits"], atol=ATOL)
  _assert_export_reloads(model, params, hf, tmp_path, (ids, mask, types), ref)


def test_scan_layers_with_remat_matches_unrolled_values_and_grads():
  cfg = bert_configs.get_config("tiny").model.unlock()
  cfg.dtype = "float32"
  plain = encoders.build(cfg)
  params = encoders.init_params(plain, jax.random.PRNGKey(0))
  cfg.scan_layers, cfg.remat_policy = True, "dots_saveable"
  scanned = encoders.build(cfg)
  sparams = layers.stack_layer_params(params, cfg.num_hidden_layers)
  assert jax.tree.structure(sparams) == jax.tree.structure(
      encoders.init_params(scanned, jax.random.PRNGKey(0)))
  ids = jnp.asarray(np.random.RandomState(1).randint(5, 1000, (2, 8)), jnp.int32)

  def loss(m, p):
    return m.apply({"params": p}, ids).mlm_logits.std()

  np.testing.assert_allclose(loss(scanned, sparams), loss(plain, params), rtol=1e-6)
  g_plain = layers.stack_layer_params(jax.jit(jax.grad(lambda p: loss(plain, p)))(params), 2)
  g_scan = jax.jit(jax.grad(lambda p: loss(scanned, p)))(sparams)
  for a, b in zip(jax.tree.leaves(g_plain), jax.tree.leaves(g_scan)):
    np.testing.assert_allclose(a, b, atol=1e-6)
  back = layers.unstack_layer_params(sparams)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
    np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------- cpu attention


def test_cpu_attention_matches_the_reference_with_and_without_dropout():
  r = jax.random.split(jax.random.PRNGKey(3), 3)
  q, k, v = [jax.random.normal(x, (2, 12, 2, 8)) for x in r]
  seg = jnp.array([[1] * 5 + [2] * 7, [1] * 3 + [2] * 4 + [0] * 5])
  mask = layers.make_attention_mask((seg > 0).astype(jnp.int32), seg, 4)
  bias = jax.random.normal(jax.random.PRNGKey(4), (1, 2, 12, 12))
  real = np.asarray(seg) > 0
  for b in (None, bias):
    ref = layers.attention_scores_einsum(q, k, v, mask, b)
    got = layers.attention_head_major(q, k, v, mask, b)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(ref)[real], atol=1e-5)
  # Model level, training mode: the same dropout rng drops the same probabilities.
  cfg = bert_configs.get_config("tiny").model.unlock()
  cfg.dtype, cfg.num_hidden_layers = "float32", 1
  ref_model = encoders.build(cfg)
  params = encoders.init_params(ref_model, jax.random.PRNGKey(0))
  cfg.attention_impl = "cpu"
  cpu_model = encoders.build(cfg)
  ids = jnp.asarray(np.random.RandomState(0).randint(5, 1000, (2, 16)), jnp.int32)
  mask2 = jnp.ones((2, 16), jnp.int32).at[1, 11:].set(0)
  run = lambda m: m.apply({"params": params}, ids, mask2, deterministic=False,
                          rngs={"dropout": jax.random.PRNGKey(7)}).last_hidden_state
  np.testing.assert_allclose(run(cpu_model), run(ref_model), atol=1e-5)


# ---------------------------------------------------------------------------- splash


def _packed_segments(b=2, t=128):
  seg = np.zeros((b, t), np.int32)
  seg[0, :50], seg[0, 50:101], seg[0, 101:120] = 1, 2, 3  # three documents + padding
  seg[1, :] = 1  # one full row
  return jnp.asarray(seg)


def test_splash_kernel_matches_einsum_on_packed_rows():
  r = jax.random.split(jax.random.PRNGKey(0), 3)
  q, k, v = [jax.random.normal(x, (2, 128, 2, 64)) for x in r]
  seg = _packed_segments()
  real = np.asarray(seg) > 0
  dense = layers.make_attention_mask((seg > 0).astype(jnp.int32), seg)
  splash = functools.partial(layers.splash_attention, interpret=True)
  got = splash(q, k, v, seg)
  ref = layers.attention_scores_einsum(q, k, v, dense)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(ref)[real], atol=1e-5)

  w = jnp.asarray(real, jnp.float32)[:, :, None, None]
  g_got = jax.jit(jax.grad(lambda q, k, v: (splash(q, k, v, seg) * w).sum(), (0, 1, 2)))(
      q, k, v)
  g_ref = jax.jit(jax.grad(
      lambda q, k, v: (layers.attention_scores_einsum(q, k, v, dense) * w).sum(), (0, 1, 2)))(
          q, k, v)
  for a, b in zip(g_got, g_ref):
    np.testing.assert_allclose(np.asarray(a)[real], np.asarray(b)[real], atol=1e-4)


def test_splash_model_path_keeps_packed_documents_apart(monkeypatch):
  from encoders.layers import kernels
  monkeypatch.setattr(kernels, "splash_attention",
                      functools.partial(kernels.splash_attention, interpret=True))
  cfg = bert_configs.get_config("tiny").model.unlock()
  cfg.dtype, cfg.num_hidden_layers, cfg.attention_probs_dropout_prob = "float32", 1, 0.0
  xla = encoders.build(cfg)
  params = encoders.init_params(xla, jax.random.PRNGKey(0))
  cfg.attention_impl = "splash"
  splash = encoders.build(cfg)
  seg = _packed_segments()
  ids = jnp.asarray(np.random.RandomState(0).randint(5, 1000, seg.shape), jnp.int32)
  real = np.asarray(seg) > 0
  a = xla.apply({"params": params}, ids, segment_ids=seg).last_hidden_state
  b = splash.apply({"params": params}, ids, segment_ids=seg).last_hidden_state
  np.testing.assert_allclose(np.asarray(b)[real], np.asarray(a)[real], atol=1e-4)
  # The second document alone gives the same states as inside the packed row.
  alone = splash.apply({"params": params},
                       jnp.zeros((1, 128), jnp.int32).at[0, :51].set(ids[0, 50:101]),
                       attention_mask=jnp.zeros((1, 128), jnp.int32).at[0, :51].set(1))
  np.testing.assert_allclose(np.asarray(alone.last_hidden_state)[0, :51],
                             np.asarray(b)[0, 50:101], atol=1e-4)


def test_splash_refuses_what_it_cannot_do():
  q = jnp.zeros((1, 96, 2, 64))
  with pytest.raises(ValueError, match="multiple of 128"):
    layers.splash_attention(q, q, q, jnp.ones((1, 96), jnp.int32), interpret=True)
  cfg = bert_configs.get_config("tiny").model.unlock()
  cfg.attention_impl, cfg.num_hidden_layers = "splash", 1
  model = encoders.build(cfg)
  ids = jnp.ones((1, 128), jnp.int32) * 7
  params = jax.eval_shape(lambda: encoders.init_params(model, jax.random.PRNGKey(0), 1, 128))
  with pytest.raises(ValueError, match="dropout"):
    jax.eval_shape(lambda p: model.apply({"params": p}, ids, deterministic=False,
                                         rngs={"dropout": jax.random.PRNGKey(0)}), params)
  attn = layers.MultiHeadAttention(2, 4, 8, impl="splash")
  x = jnp.ones((1, 128, 8))
  with pytest.raises(ValueError, match="SegmentMask"):
    attn.init(jax.random.PRNGKey(0), x,
              layers.AttentionInputs(mask=layers.make_attention_mask(jnp.ones((1, 128)))))


# ---------------------------------------------------------------------------- MLM positions


def test_mlm_head_on_gathered_positions_equals_full_head():
  cfg = bert_configs.get_config("tiny").model.unlock()
  cfg.dtype = "float32"
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  ids = jnp.asarray(np.random.RandomState(2).randint(5, 1000, (2, 16)), jnp.int32)
  pos = jnp.asarray([[1, 4, 9, 0], [2, 3, 15, 0]], jnp.int32)
  full = model.apply({"params": params}, ids).mlm_logits
  some = model.apply({"params": params}, ids, masked_positions=pos).mlm_logits
  assert some.shape == (2, 4, cfg.vocab_size)
  np.testing.assert_allclose(some, jnp.take_along_axis(full, pos[..., None], axis=1),
                             atol=1e-5)
