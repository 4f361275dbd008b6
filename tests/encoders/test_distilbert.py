"""DistilBERT: parity with transformers in float32 (learned and sinusoidal positions,
padded batches), a stored sinusoidal table that differs from the computed one loaded and
run as transformers runs it, export that transformers loads with no missing or
unexpected keys, parameter counts, and the family's refusals."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import encoders
from encoders.hf import distilbert as distil_hf

ATOL = 1e-4
TINY = dict(vocab_size=99, dim=32, n_layers=3, n_heads=4, hidden_dim=37,
            max_position_embeddings=40, activation="gelu")


def tiny_hf(arch, sinusoidal, seed=0, **overrides):
  torch.manual_seed(seed)
  cfg = T.DistilBertConfig(**{**TINY, "sinusoidal_pos_embds": sinusoidal, **overrides})
  model = getattr(T, arch)(cfg).eval()
  with torch.no_grad():  # biases and norms away from 0/1, so every mapping is checked
    for name, p in model.named_parameters():
      if name.endswith("bias") or "layer_norm" in name or "LayerNorm" in name:
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
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                output_hidden_states=True)
  res = {"last_hidden_state": out.hidden_states[-1].numpy()}
  if getattr(out, "logits", None) is not None:
    res["mlm_logits"] = out.logits.numpy()
  return res


@pytest.mark.parametrize("sinusoidal", [False, True])
@pytest.mark.parametrize("arch", ["DistilBertModel", "DistilBertForMaskedLM"])
def test_parity_tiny_random(arch, sinusoidal, tmp_path):
  hf = tiny_hf(arch, sinusoidal, seed=1)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path))
  assert model.config.family == "distilbert"
  assert model.config.sinusoidal_pos_embds == sinusoidal
  # a parameter either way, as in transformers v5 (sinusoidal: its initial values)
  base = hf if arch == "DistilBertModel" else hf.distilbert
  np.testing.assert_array_equal(params["embeddings"]["position_embeddings"]["embedding"],
                                base.embeddings.position_embeddings.weight.detach().numpy())
  ids, mask = padded_batch(99, seed=2)
  assert not mask.all()
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  ref = torch_out(hf, ids, mask)
  real = mask.astype(bool)
  assert np.abs(ref["last_hidden_state"]).max() > 0.1
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real],
                             ref["last_hidden_state"][real], atol=ATOL, rtol=0)
  if arch == "DistilBertForMaskedLM":
    np.testing.assert_allclose(np.asarray(out.mlm_logits)[real], ref["mlm_logits"][real],
                               atol=ATOL, rtol=0)
  else:
    assert out.mlm_logits is None and out.pooler_output is None


def test_sinusoidal_table_matches_transformers_and_starts_our_fresh_models():
  hf = tiny_hf("DistilBertModel", True, seed=3)
  table = hf.embeddings.position_embeddings.weight.detach().numpy()
  np.testing.assert_allclose(distil_hf.sinusoidal_table(40, 32), table, atol=1e-6)
  cfg = encoders.family_defaults("distilbert")
  cfg.update(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
             intermediate_size=37, max_position_embeddings=40, sinusoidal_pos_embds=True)
  params = encoders.init_params(encoders.build(cfg), jax.random.PRNGKey(0))
  np.testing.assert_allclose(params["embeddings"]["position_embeddings"]["embedding"], table,
                             atol=1e-6)


def test_stored_sinusoidal_table_that_differs_is_loaded_run_and_exported(tmp_path):
  """transformers v5 trains a sinusoidal table, so a fine-tuned checkpoint's differs from
  the computed one: it is loaded as stored (it was refused before), gives transformers'
  outputs, and export writes it back."""
  hf = tiny_hf("DistilBertForMaskedLM", True, seed=5)
  with torch.no_grad():
    hf.distilbert.embeddings.position_embeddings.weight.add_(
        0.3 * torch.randn_like(hf.distilbert.embeddings.position_embeddings.weight))
  stored = hf.distilbert.embeddings.position_embeddings.weight.detach().numpy().copy()
  assert np.abs(stored - distil_hf.sinusoidal_table(40, 32)).max() > 0.5
  hf.save_pretrained(tmp_path / "src")
  model, params = encoders.from_hf(str(tmp_path / "src"))
  assert model.config.sinusoidal_pos_embds
  np.testing.assert_array_equal(params["embeddings"]["position_embeddings"]["embedding"],
                                stored)
  ids, mask = padded_batch(99, seed=7)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  ref, real = torch_out(hf, ids, mask), mask.astype(bool)
  for name in ("last_hidden_state", "mlm_logits"):
    np.testing.assert_allclose(np.asarray(getattr(out, name))[real], ref[name][real],
                               atol=ATOL, rtol=0)
  encoders.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = T.DistilBertForMaskedLM.from_pretrained(str(tmp_path / "out"),
                                                         output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert loaded.config.sinusoidal_pos_embds
  np.testing.assert_array_equal(
      loaded.distilbert.embeddings.position_embeddings.weight.detach().numpy(), stored)


@pytest.mark.parametrize("sinusoidal", [False, True])
@pytest.mark.parametrize("arch", ["DistilBertModel", "DistilBertForMaskedLM"])
def test_export_loads_in_transformers_without_missing_or_unexpected_keys(arch, sinusoidal,
                                                                         tmp_path):
  hf = tiny_hf(arch, sinusoidal, seed=4)
  hf.save_pretrained(tmp_path / "src")
  model, params = encoders.from_hf(str(tmp_path / "src"))
  encoders.to_hf(model, params, str(tmp_path / "out"))
  with open(tmp_path / "out" / "config.json") as f:
    assert json.load(f)["architectures"] == [arch]
  loaded, info = getattr(T, arch).from_pretrained(str(tmp_path / "out"),
                                                  output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  ids, mask = padded_batch(99, seed=6)
  ref, got = torch_out(hf, ids, mask), torch_out(loaded.eval(), ids, mask)
  for name in ref:
    np.testing.assert_allclose(got[name], ref[name], atol=1e-6)


def test_random_init_roundtrip_and_scan_layers(tmp_path):
  """Our freshly initialised model (scanned) exports, and transformers gives our logits."""
  cfg = encoders.family_defaults("distilbert")
  cfg.update(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=48, max_position_embeddings=24, scan_layers=True,
             dtype="float32", sinusoidal_pos_embds=True)
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  assert "layers" in params["encoder"]
  encoders.to_hf(model, params, str(tmp_path / "out"))
  hf = T.DistilBertForMaskedLM.from_pretrained(str(tmp_path / "out")).eval()
  ids, mask = padded_batch(120, seed=8)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.mlm_logits)[real],
                             torch_out(hf, ids, mask)["mlm_logits"][real], atol=ATOL)


def _our_count(cfg):
  model = encoders.build(cfg)
  shapes = jax.eval_shape(lambda: encoders.init_params(model, jax.random.PRNGKey(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


@pytest.mark.parametrize("sinusoidal", [False, True])
@pytest.mark.parametrize("heads", [(), ("mlm",)])
def test_parameter_count_matches_transformers(heads, sinusoidal):
  """distilbert-base: 66M (Sanh et al. 2019). A sinusoidal table is a parameter in both
  (transformers v5 trains it)."""
  cfg = encoders.family_defaults("distilbert")
  cfg.heads, cfg.sinusoidal_pos_embds = heads, sinusoidal
  hf_dict, arch = distil_hf.DistilBertMapping().config_to_hf(cfg)
  with torch.device("meta"):
    ref = getattr(T, arch)(T.DistilBertConfig(**hf_dict))
  theirs = sum(p.numel() for p in ref.parameters())
  ours = _our_count(cfg)
  assert ours == theirs
  if not heads and not sinusoidal:
    assert abs(ours / 1e6 - 66) < 1


def test_refusals():
  cfg = encoders.family_defaults("distilbert")
  cfg.update(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
             intermediate_size=32, max_position_embeddings=16, dtype="float32")
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  ids = jnp.ones((1, 8), jnp.int32)
  with pytest.raises(ValueError, match="token_type_ids contains 1"):
    model.apply({"params": params}, ids, None, jnp.ones((1, 8), jnp.int32))
  with pytest.raises(ValueError, match="exceeds the model's maximum of 16"):
    model.apply({"params": params}, jnp.ones((1, 17), jnp.int32))
  bad = cfg.copy_and_resolve_references()
  bad.type_vocab_size = 2
  with pytest.raises(ValueError, match="no token types"):
    encoders.init_params(encoders.build(bad), jax.random.PRNGKey(0))


def test_forward_flops_hand_count():
  # L=2, D=4, F=8, T=3, V=10, MLM head only (no pooler): BERT's 912 per layer, 112 per
  # MLM position (tests/encoders/test_flops.py).
  cfg = encoders.family_defaults("distilbert")
  cfg.update(num_hidden_layers=2, hidden_size=4, intermediate_size=8, vocab_size=10)
  assert encoders.forward_flops(cfg, 3) == 2 * 912 + 3 * 112 == 2160
  assert encoders.forward_flops(cfg, 3, mlm_positions=1) == 2 * 912 + 112
