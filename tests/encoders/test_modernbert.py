"""ModernBERT: parity with transformers in float32 (a local window smaller than the
sequence, several periods of local/global layers, padded batches; scanned and not),
export that transformers loads cleanly, parameter counts of base and large, packed rows
equal to their documents run alone, and the attention paths against the reference."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import encoders
from configs import modernbert as mb_configs
from encoders import layers
from encoders import modernbert as mb
from encoders.hf import modernbert as mb_hf

ATOL = 1e-4
# 7 layers: global at 0, 3, 6 (two scanned periods after layer 0); a window of 4 (|i-j| <= 2)
# on sequences of 11; biases on wherever the config allows them, so every rule is used.
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=7, num_attention_heads=4,
            intermediate_size=37, local_attention=4, global_attn_every_n_layers=3,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
            max_position_embeddings=64)
ARCHS = ("ModernBertModel", "ModernBertForMaskedLM")


def tiny_hf(arch, seed=0, **overrides):
  torch.manual_seed(seed)
  cfg = T.ModernBertConfig(**{**TINY, **overrides})
  cfg._attn_implementation = "eager"
  model = getattr(T, arch)(cfg).eval()
  with torch.no_grad():  # norms start at 1/0: perturb them so their mapping is checked
    for name, p in model.named_parameters():
      if "norm" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  return model


def padded_batch(vocab, batch=3, length=11, seed=0):
  rng = np.random.RandomState(seed)
  ids = rng.randint(3, vocab, size=(batch, length))
  mask = np.ones_like(ids)
  for i, n in enumerate([length, length - 4, 3][:batch]):
    mask[i, n:] = 0
  ids[mask == 0] = 0
  return ids, mask


def torch_out(model, ids, mask):
  with torch.no_grad():
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask), output_hidden_states=True)
  res = {"last_hidden_state": out.hidden_states[-1].numpy()}
  if getattr(out, "logits", None) is not None:
    res["mlm_logits"] = out.logits.numpy()
  return res


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("scan", [False, True])
def test_parity_tiny_random(arch, scan, tmp_path):
  hf = tiny_hf(arch, seed=1)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), scan_layers=scan, attention_impl="einsum")
  assert model.config.global_attn_every_n_layers == 3
  if scan:
    assert sorted(params["encoder"]) == ["body", "layer_0"]
  ids, mask = padded_batch(99, seed=2)
  out = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  ref = torch_out(hf, ids, mask)
  real = mask.astype(bool)
  # (a correct window matters: the sequence is longer than the window)
  assert ids.shape[1] > TINY["local_attention"] + 1
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real],
                             ref["last_hidden_state"][real], atol=ATOL, rtol=0)
  if "mlm_logits" in ref:
    np.testing.assert_allclose(np.asarray(out.mlm_logits)[real], ref["mlm_logits"][real],
                               atol=ATOL, rtol=0)
  else:
    assert out.mlm_logits is None
  assert np.abs(ref["last_hidden_state"]).max() > 0.1


def test_parity_with_biases_and_global_every_layer(tmp_path):
  hf = tiny_hf("ModernBertForMaskedLM", seed=3, attention_bias=True, mlp_bias=True,
               norm_bias=True, classifier_bias=True, global_attn_every_n_layers=1,
               num_hidden_layers=3)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), scan_layers=True)
  ids, mask = padded_batch(99, seed=4)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  real = mask.astype(bool)
  ref = torch_out(hf, ids, mask)
  np.testing.assert_allclose(np.asarray(out.mlm_logits)[real], ref["mlm_logits"][real],
                             atol=ATOL, rtol=0)


def test_wrong_window_would_be_caught(tmp_path):
  """The parity check is sensitive to the window: a wider one changes the output."""
  hf = tiny_hf("ModernBertModel", seed=1)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), local_attention=8)
  ids, mask = padded_batch(99, seed=2)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  ref = torch_out(hf, ids, mask)
  assert np.abs(np.asarray(out.last_hidden_state)[0] - ref["last_hidden_state"][0]).max() > 1e-3


@pytest.mark.parametrize("arch", ARCHS)
def test_export_loads_in_transformers_without_missing_or_unexpected_keys(arch, tmp_path):
  hf = tiny_hf(arch, seed=4)
  hf.save_pretrained(tmp_path / "src")
  model, params = encoders.from_hf(str(tmp_path / "src"), scan_layers=True)
  encoders.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = getattr(T, arch).from_pretrained(str(tmp_path / "out"),
                                                  output_loading_info=True,
                                                  attn_implementation="eager")
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  ids, mask = padded_batch(99, seed=6)
  ref, got = torch_out(hf, ids, mask), torch_out(loaded.eval(), ids, mask)
  real = mask.astype(bool)
  for name in ref:
    np.testing.assert_allclose(got[name][real], ref[name][real], atol=1e-6)


def test_import_refuses_layer_types_it_does_not_implement(tmp_path):
  hf = tiny_hf("ModernBertModel", seed=0)
  hf.config.layer_types = ["sliding_attention"] + ["full_attention"] * 6
  hf.save_pretrained(tmp_path)
  with pytest.raises(ValueError, match="layer_types"):
    encoders.from_hf(str(tmp_path))


def _count(cfg):
  shapes = jax.eval_shape(lambda: encoders.init_params(encoders.build(cfg),
                                                       jax.random.PRNGKey(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


@pytest.mark.parametrize("variant,millions", [("base", 149.7), ("large", 395.9)])
def test_parameter_count_matches_transformers(variant, millions):
  cfg = mb.defaults(variant)
  hf_dict, arch = mb_hf.ModernBertMapping().config_to_hf(cfg)
  with torch.device("meta"):
    ref = getattr(T, arch)(T.ModernBertConfig(**hf_dict))
  # transformers counts the tied decoder once (parameters() deduplicates it)
  ours = _count(cfg)
  assert ours == sum(p.numel() for p in ref.parameters())
  assert abs(ours / 1e6 - millions) < 0.05
  # scanning changes the layout, not the count
  scanned = cfg.copy_and_resolve_references()
  scanned.scan_layers = True
  assert _count(scanned) == ours


def _random_model(impl="einsum", **over):
  cfg = mb.defaults("tiny")
  cfg.update(vocab_size=99, num_hidden_layers=4, local_attention=4, attention_impl=impl,
             dtype="float32", **over)
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  # non-trivial norms so a wrong position or mask shows
  params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(1), x.shape),
                        params)
  return model, params


def test_packed_rows_equal_documents_run_alone():
  """Two documents packed in one row (and padding after them) give, per document, what
  the document gives alone: no attention across documents (global or local), rotary
  positions restarting per document."""
  model, params = _random_model()
  rng = np.random.RandomState(0)
  a, b = rng.randint(3, 99, size=9), rng.randint(3, 99, size=6)
  row = np.concatenate([a, b, np.zeros(3, int)])[None]
  seg = np.array([[1] * 9 + [2] * 6 + [0] * 3])
  apply = jax.jit(model.apply)
  packed = apply({"params": params}, jnp.asarray(row), segment_ids=jnp.asarray(seg))
  for doc, sl in ((a, slice(0, 9)), (b, slice(9, 15))):
    alone = apply({"params": params}, jnp.asarray(doc[None]))
    np.testing.assert_allclose(np.asarray(packed.last_hidden_state)[0, sl],
                               np.asarray(alone.last_hidden_state)[0], atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(packed.mlm_logits)[0, sl],
                               np.asarray(alone.mlm_logits)[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("impl", ["cpu", "xla"])
def test_attention_paths_match_the_reference(impl):
  model, params = _random_model("einsum")
  fast, _ = _random_model(impl)
  ids, mask = padded_batch(99, length=13, seed=3)
  seg = np.where(np.arange(13)[None] < 6, 1, 2) * mask
  for kw in (dict(attention_mask=jnp.asarray(mask)), dict(segment_ids=jnp.asarray(seg))):
    ref = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), **kw)
    got = jax.jit(fast.apply)({"params": params}, jnp.asarray(ids), **kw)
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(got.last_hidden_state)[real],
                               np.asarray(ref.last_hidden_state)[real], atol=1e-5)


def test_splash_local_window_matches_the_reference_in_interpret_mode():
  """The splash kernel with the banded local mask and segment ids, run by the Pallas
  interpreter on the CPU, against the einsum reference with the dense windowed mask."""
  rng = np.random.RandomState(0)
  q, k, v = (jnp.asarray(rng.randn(1, 256, 2, 8), jnp.float32) for _ in range(3))
  seg = jnp.asarray(np.where(np.arange(256) < 150, 1, 2)[None].astype(np.int32))
  got = layers.splash_attention(q, k, v, seg, interpret=True, local_window=128)
  mask = layers.SegmentMask(seg, local_window=128).dense()
  ref = layers.attention_scores_einsum(q, k, v, mask)
  np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5)


def test_config_errors_are_named():
  cfg = mb.defaults("tiny")
  cfg.mlp_dropout = 0.1
  with pytest.raises(ValueError, match="mlp_dropout"):
    encoders.init_params(encoders.build(cfg), jax.random.PRNGKey(0))
  cfg = mb.defaults("tiny")
  cfg.local_attention = 5
  with pytest.raises(ValueError, match="local_attention"):
    encoders.init_params(encoders.build(cfg), jax.random.PRNGKey(0))


def test_flops_count_local_layers_as_windowed():
  cfg = mb.defaults("base")
  t = 8192
  every_global = cfg.copy_and_resolve_references()
  every_global.global_attn_every_n_layers = 1
  saved = mb.forward_flops(every_global, t) - mb.forward_flops(cfg, t)
  n_local = sum(not mb.is_global(cfg, i) for i in range(cfg.num_hidden_layers))
  assert n_local == 14
  assert saved == n_local * 4 * t * (t - 129) * cfg.hidden_size


def test_tiny_config_builds():
  cfg = mb_configs.get_config("tiny").model.unlock()
  assert cfg.local_attention < 128 and cfg.num_hidden_layers == 4
  cfg.vocab_size = 99  # the trainer sizes it to the tokenizer
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  out = model.apply({"params": params}, jnp.ones((2, 16), jnp.int32))
  assert out.mlm_logits.shape == (2, 16, cfg.vocab_size)
