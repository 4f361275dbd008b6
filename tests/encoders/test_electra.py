"""ELECTRA: parity with transformers in float32 (E != H and E == H, padded batches with
token types), export that transformers loads cleanly, parameter counts of the published
sizes (generators and discriminators), bad configs refused."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import encoders
from configs import electra as electra_configs
from encoders.hf import electra as electra_hf
from objectives import rtd
from tests.encoders import hf_helpers as H

ATOL = 1e-4
ARCHS = ("ElectraModel", "ElectraForMaskedLM", "ElectraForPreTraining")


def _tiny(arch, seed, embedding_size=16, **overrides):
  torch.manual_seed(seed)
  cfg = T.ElectraConfig(**{**H.TINY, "embedding_size": embedding_size, **overrides})
  model = getattr(T, arch)(cfg).eval()
  with torch.no_grad():  # perturb biases and norms so every tensor's mapping is checked
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        p.add_(0.1 * torch.randn_like(p))
  return model


def _torch_outputs(model, ids, mask, types):
  with torch.no_grad():
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                token_type_ids=torch.tensor(types), output_hidden_states=True)
  ref = {"last_hidden_state": out.hidden_states[-1].numpy()}
  if isinstance(model, T.ElectraForMaskedLM):
    ref["mlm_logits"] = out.logits.numpy()
  elif isinstance(model, T.ElectraForPreTraining):
    ref["rtd_logits"] = out.logits.numpy()
  return ref


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("embedding_size", [16, 32])  # E != H (projection) and E == H
def test_parity_tiny_random(arch, embedding_size, tmp_path):
  hf = _tiny(arch, seed=1, embedding_size=embedding_size)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path))
  assert ("projection" in params["embeddings"]) == (embedding_size != 32)
  ids, mask, types = H.padded_batch(hf.config, seed=2)
  assert types.any() and not mask.all()
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  ref = _torch_outputs(hf, ids, mask, types)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real],
                             ref["last_hidden_state"][real], atol=ATOL, rtol=0)
  assert np.abs(ref["last_hidden_state"]).max() > 0.1  # not vacuous
  for name in ("mlm_logits", "rtd_logits"):
    got = getattr(out, name)
    if name in ref:
      assert got is not None and got.shape == ref[name].shape, name
      np.testing.assert_allclose(np.asarray(got)[real], ref[name][real], atol=ATOL, rtol=0)
    else:
      assert got is None, name


@pytest.mark.parametrize("arch", ARCHS)
def test_export_loads_in_transformers_without_missing_or_unexpected_keys(arch, tmp_path):
  hf = _tiny(arch, seed=4)
  hf.save_pretrained(tmp_path / "src")
  model, params = encoders.from_hf(str(tmp_path / "src"))
  encoders.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = getattr(T, arch).from_pretrained(str(tmp_path / "out"),
                                                  output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  ids, mask, types = H.padded_batch(hf.config, seed=6)
  ref, got = _torch_outputs(hf, ids, mask, types), _torch_outputs(loaded.eval(), ids, mask,
                                                                  types)
  for name in ref:
    np.testing.assert_allclose(got[name], ref[name], atol=1e-6)


def test_both_heads_refuse_export_and_unknown_config_is_refused(tmp_path):
  cfg = electra_configs.get_config("tiny").model.unlock()
  cfg.heads = ("mlm", "rtd")
  with pytest.raises(ValueError, match="two models"):
    electra_hf.ElectraMapping().config_to_hf(cfg)
  hf = _tiny("ElectraModel", seed=0, position_embedding_type="relative_key")
  hf.config.position_embedding_type = "relative_key"
  hf.save_pretrained(tmp_path)
  with pytest.raises(ValueError, match="position_embedding_type"):
    encoders.from_hf(str(tmp_path))


def _our_count(cfg):
  model = encoders.build(cfg)
  shapes = jax.eval_shape(lambda: encoders.init_params(model, jax.random.PRNGKey(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


def _hf_count(cfg):
  hf_dict, arch = electra_hf.ElectraMapping().config_to_hf(cfg)
  with torch.device("meta"):
    ref = getattr(T, arch)(T.ElectraConfig(**hf_dict))
  return sum(p.numel() for p in ref.parameters())


# Clark et al. 2020, Table 1 / 8: ELECTRA-Small 14M, -Base 110M, -Large 335M parameters.
@pytest.mark.parametrize("variant,paper_millions", [("small", 14), ("base", 110),
                                                    ("large", 335)])
def test_parameter_counts_match_transformers(variant, paper_millions):
  config = electra_configs.get_config(variant).unlock()
  config.model.vocab_pad_multiple = 1  # the TPU recipe's padding rows are not parameters
  disc = config.model
  gen = rtd.generator_config(disc, config.objective)
  for cfg in (disc, gen):
    assert _our_count(cfg) == _hf_count(cfg), cfg.heads
  assert abs(_our_count(disc) / 1e6 - paper_millions) < 0.05 * paper_millions
  assert gen.hidden_size < disc.hidden_size and gen.embedding_size == disc.embedding_size


def test_flops_count_projection_and_heads():
  cfg = electra_configs.get_config("small").model
  with_rtd = encoders.forward_flops(cfg, 128)
  bare = cfg.unlock()
  bare.heads = ()
  t, d, e = 128, cfg.hidden_size, cfg.embedding_size
  assert with_rtd - encoders.forward_flops(bare, 128) == 2 * t * d * d + 2 * t * d
  layers_only = cfg.num_hidden_layers * (8 * t * d * d + 4 * t * t * d + 4 * t * d * 4 * d)
  assert encoders.forward_flops(bare, 128) == layers_only + 2 * t * e * d
