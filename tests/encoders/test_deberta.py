"""DeBERTa v2/v3: parity with transformers in float32 on tiny random configs in both styles
(v3: shared keys, log buckets, normed relative table, no absolute positions; v2: separate
position projections, convolution, absolute positions, E != D, token types), padded
batches; the fast relative formulation against the reference; export that transformers
loads cleanly; parameter counts of the v3 sizes; packing and input errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T
from transformers.models.deberta_v2 import modeling_deberta_v2 as hf_deberta

import encoders
from configs import deberta as deberta_configs
from encoders.hf import deberta as deberta_hf
from encoders.layers import relative
from tests.encoders import hf_helpers as H
from tests.encoders.deberta_helpers import compare, tiny_hf


@pytest.mark.parametrize("arch", ["DebertaV2Model", "DebertaV2ForMaskedLM"])
@pytest.mark.parametrize("style", ["v3", "v2"])
def test_parity_tiny_random(arch, style, tmp_path):
  hf = tiny_hf(arch, style, seed=1)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), dtype="float32")
  assert model.config.relative_impl == "shift"
  ids, mask, types = H.padded_batch(hf.config, length=20, seed=2)
  assert not mask.all() and (types.any() or style == "v3")
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  compare(out, H.torch_outputs(hf, ids, mask, types), mask)


@pytest.mark.parametrize("style,impl,scan", [("v3", "gather", False), ("v3", "shift", True),
                                             ("v2", "headmajor", False)])
def test_parity_reference_path_and_scan(style, impl, scan, tmp_path):
  hf = tiny_hf("DebertaV2ForMaskedLM", style, seed=3)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), dtype="float32", relative_impl=impl,
                                   scan_layers=scan)
  if scan:
    assert "layers" in params["encoder"]
  ids, mask, types = H.padded_batch(hf.config, length=20, seed=4)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  compare(out, H.torch_outputs(hf, ids, mask, types), mask)


@pytest.mark.parametrize("buckets,max_position", [(256, 512), (8, 64), (32, 100), (4, 7)])
def test_log_buckets_match_transformers(buckets, max_position):
  rel = np.arange(-3 * max_position, 3 * max_position)
  want = hf_deberta.make_log_bucket_position(torch.tensor(rel), buckets, max_position)
  np.testing.assert_array_equal(relative.log_bucket_position(rel, buckets, max_position),
                                want.numpy().astype(np.int64))


@pytest.mark.parametrize("t,span,buckets,max_position,terms,block", [
    (1, 4, -1, 4, ("c2p", "p2c"), 0), (2, 4, -1, 4, ("p2c",), 0),
    (9, 3, -1, 3, ("c2p", "p2c"), 3), (20, 4, 8, 64, ("c2p",), 5),
    (33, 16, 16, 512, ("c2p", "p2c"), 0), (32, 16, 16, 512, ("c2p", "p2c"), 8)])
def test_shift_formulation_equals_gather_reference(t, span, buckets, max_position, terms,
                                                   block):
  ks = jax.random.split(jax.random.PRNGKey(t), 4)
  q, k = (jax.random.normal(x, (2, t, 3, 5)) for x in ks[:2])
  pk, pq = (jax.random.normal(x, (2 * span, 3, 5)) for x in ks[2:])
  rows = (span, buckets, max_position)

  def scores(impl):
    return lambda q, k, pk, pq: relative.relative_scores(q, k, pk, pq, terms, rows, impl,
                                                         block)

  ref = jax.jit(scores("gather"))(q, k, pk, pq)
  fast = jax.jit(scores("shift"))(q, k, pk, pq)
  assert fast.shape == (2, 3, t, t)
  np.testing.assert_allclose(np.asarray(fast), np.asarray(ref), atol=1e-5, rtol=1e-5)
  # their gradients too (the train step differentiates through the shift)
  def grads(impl):
    return jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(scores(impl)(*a))),
                            argnums=(0, 1, 2, 3)))
  for a, b in zip(grads("shift")(q, k, pk, pq), grads("gather")(q, k, pk, pq)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("t,terms,block", [(12, ("c2p", "p2c"), 4), (9, ("p2c",), 0),
                                           (16, ("c2p",), 0)])
def test_headmajor_attention_equals_reference(t, terms, block):
  """The head-major fused path (values and gradients) equals the gather reference's bias
  fed to the reference attention, on a padded batch."""
  from encoders.layers import kernels
  ks = jax.random.split(jax.random.PRNGKey(t), 5)
  q, k, v = (jax.random.normal(x, (2, t, 3, 5)) for x in ks[:3])
  pk, pq = (jax.random.normal(x, (16, 3, 5)) for x in ks[3:])
  rows = (8, 8, 32)
  real = np.arange(t)[None, :] < np.array([[t], [t - 3]])
  mask = jnp.asarray(real[:, None, None, :] & np.ones((2, 1, t, 1), bool))

  def ref(q, k, v, pk, pq):
    bias = relative.relative_scores(q, k, pk, pq, terms, rows, "gather")
    return kernels.attention_scores_einsum(q, k, v, mask, bias, 0.3)

  def fused(q, k, v, pk, pq):
    return relative.headmajor_attention(q, k, v, pk, pq, terms, rows, block, mask, 0.3)

  args = (q, k, v, pk, pq)
  np.testing.assert_allclose(np.asarray(jax.jit(fused)(*args)),
                             np.asarray(jax.jit(ref)(*args)), atol=1e-5, rtol=1e-5)
  def g(f):
    return jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a))), argnums=(0, 1, 2, 3, 4)))

  for a, b in zip(g(fused)(*args), g(ref)(*args)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4)


def test_relative_shift_places_offsets():
  t = 5
  offsets = np.arange(2 * t - 1) - (t - 1)  # column m holds offset j - i = m - (T-1)
  full = jnp.broadcast_to(jnp.asarray(offsets, jnp.float32), (t, 2 * t - 1))
  i = np.arange(t)
  np.testing.assert_array_equal(np.asarray(relative.relative_shift(full)),
                                i[None, :] - i[:, None])


@pytest.mark.parametrize("arch,style", [("DebertaV2ForMaskedLM", "v3"),
                                        ("DebertaV2ForMaskedLM", "v2"),
                                        ("DebertaForMaskedLM", "v1_base"),
                                        ("DebertaForMaskedLM", "v1_clipped")])
def test_export_loads_in_transformers_without_missing_or_unexpected_keys(arch, style,
                                                                         tmp_path):
  hf = tiny_hf(arch, style, seed=5)
  hf.save_pretrained(tmp_path / "src")
  model, params = encoders.from_hf(str(tmp_path / "src"))
  encoders.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = getattr(T, arch).from_pretrained(str(tmp_path / "out"),
                                                  output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert type(loaded.config) is type(hf.config)
  ids, mask, types = H.padded_batch(hf.config, length=20, seed=6)
  ref, got = H.torch_outputs(hf, ids, mask, types), H.torch_outputs(loaded.eval(), ids, mask,
                                                                    types)
  for name in ref:
    np.testing.assert_allclose(got[name], ref[name], atol=1e-6)


def _our_count(cfg):
  model = encoders.build(cfg)
  shapes = jax.eval_shape(lambda: encoders.init_params(model, jax.random.PRNGKey(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


# The released DeBERTa-v3 backbones (128k vocabulary) and microsoft/deberta-{base,large,
# xlarge} (v1): exact equality with transformers' own count of the same config.
@pytest.mark.parametrize("variant", ["xsmall", "small", "base", "large", "v1-base",
                                     "v1-large", "v1-xlarge"])
@pytest.mark.parametrize("heads", [(), ("mlm",)])
def test_parameter_count_matches_transformers(variant, heads):
  cfg = deberta_configs.get_config(variant).model.unlock()
  cfg.heads = heads
  cfg.enhanced_mask_decoder = False  # transformers has no decoder (test_deberta_emd.py)
  mapping = deberta_hf.DebertaV1Mapping if variant.startswith("v1-") else \
      deberta_hf.DebertaMapping
  hf_dict, arch = mapping().config_to_hf(cfg)
  with torch.device("meta"):
    ref = getattr(T, arch)(getattr(T, arch).config_class(**hf_dict))
  assert _our_count(cfg) == sum(p.numel() for p in ref.parameters())


@pytest.mark.parametrize("emd", [False, True])
def test_packed_rows_match_separate_documents(emd):
  """Two documents packed in one row (segment ids) give each document's own outputs:
  attention, relative positions, v2's convolution and the enhanced mask decoder's
  positions never cross the boundary."""
  cfg = deberta_configs.get_config("tiny").model.unlock()
  cfg.update(conv_kernel_size=3, position_biased_input=not emd, max_position_embeddings=64,
             dtype="float32", vocab_size=50, hidden_size=32, embedding_size=32,
             intermediate_size=64, position_buckets=4, enhanced_mask_decoder=emd)
  model = encoders.build(cfg)
  params = jax.jit(lambda k: encoders.init_params(model, k))(jax.random.PRNGKey(0))
  a, b = np.arange(3, 10), np.arange(20, 26)
  packed = np.concatenate([a, b, [0, 0]])[None]
  seg = np.concatenate([np.ones_like(a), 2 * np.ones_like(b), [0, 0]])[None]
  apply = jax.jit(lambda ids, seg: model.apply({"params": params}, ids, segment_ids=seg))
  out = apply(jnp.asarray(packed), jnp.asarray(seg))
  for doc, sl in ((a, slice(0, 7)), (b, slice(7, 13))):
    alone = apply(jnp.asarray(doc[None]), jnp.ones((1, len(doc)), jnp.int32))
    np.testing.assert_allclose(np.asarray(out.last_hidden_state[0, sl]),
                               np.asarray(alone.last_hidden_state[0]), atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.mlm_logits[0, sl]),
                               np.asarray(alone.mlm_logits[0]), atol=1e-5)


def test_bad_settings_raise_value_errors():
  cfg = deberta_configs.get_config("tiny").model.unlock()
  for change, match in ((dict(conv_kernel_size=3, scan_layers=True), "scan_layers"),
                        (dict(pos_att_type=("c2p", "p2p")), "pos_att_type"),
                        (dict(relative_impl="roll"), "relative_impl")):
    bad = cfg.copy_and_resolve_references()
    bad.update(change)
    with pytest.raises(ValueError, match=match):
      encoders.init_params(encoders.build(bad), jax.random.PRNGKey(0))
  splash = cfg.copy_and_resolve_references()
  splash.attention_impl = "splash"
  with pytest.raises(ValueError, match="splash"):
    encoders.init_params(encoders.build(splash), jax.random.PRNGKey(0), length=128)


def test_forward_flops_count_the_relative_terms():
  cfg = deberta_configs.get_config("base").model.unlock()
  cfg.enhanced_mask_decoder = False  # its two passes: test_deberta_emd.py
  no_rel = cfg.copy_and_resolve_references()
  no_rel.relative_attention = False
  t = 512
  extra = encoders.forward_flops(cfg, t) - encoders.forward_flops(no_rel, t)
  # two terms x 2 * T * min(2S, 2T-1) * D per layer
  assert extra == 12 * 2 * 2 * t * min(2 * 256, 2 * t - 1) * 768
