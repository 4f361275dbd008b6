"""ALBERT: parity with transformers in float32 (E != H, several groups of several layers,
padded batches with token types), export that transformers loads cleanly, parameter
counts of the published sizes, scan over the shared groups."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import encoders
from configs import albert as albert_configs
from encoders.hf import albert as albert_hf
from tests.encoders import hf_helpers as H

ATOL = 1e-4


def _compare(out, ref, mask):
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real],
                             ref["last_hidden_state"][real], atol=ATOL, rtol=0)
  for name in ("mlm_logits", "sop_logits", "pooler_output"):
    if name in ref:
      got = getattr(out, name)
      assert got is not None and got.shape == ref[name].shape, name
      np.testing.assert_allclose(np.asarray(got), ref[name], atol=ATOL, rtol=0)
  assert out.nsp_logits is None
  assert np.abs(ref["last_hidden_state"]).max() > 0.1  # not vacuous


@pytest.mark.parametrize("arch", sorted(H.ALBERT_ARCHS))
@pytest.mark.parametrize("scan", [False, True])
def test_parity_tiny_random(arch, scan, tmp_path):
  hf = H.tiny_hf_model(arch, seed=1)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), scan_layers=scan)
  assert model.config.embedding_size != model.config.hidden_size
  assert sorted(params["encoder"]) == ["group_0", "group_1"]
  ids, mask, types = H.padded_batch(hf.config, seed=2)
  assert types.any() and not mask.all()
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  _compare(out, H.torch_outputs(hf, ids, mask, types), mask)


@pytest.mark.parametrize("arch", sorted(H.ALBERT_ARCHS))
def test_export_loads_in_transformers_without_missing_or_unexpected_keys(arch, tmp_path):
  hf = H.tiny_hf_model(arch, seed=4)
  hf.save_pretrained(tmp_path / "src")
  model, params = encoders.from_hf(str(tmp_path / "src"))
  encoders.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = getattr(T, arch).from_pretrained(str(tmp_path / "out"),
                                                  output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  ids, mask, types = H.padded_batch(hf.config, seed=6)
  ref, got = H.torch_outputs(hf, ids, mask, types), H.torch_outputs(loaded.eval(), ids, mask,
                                                                    types)
  for name in ref:
    np.testing.assert_allclose(got[name], ref[name], atol=1e-6)


def test_tiny_config_trains_shared_layers_and_counts_flops():
  cfg = albert_configs.get_config("tiny").model
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  assert list(params["encoder"]) == ["group_0"]  # one group shared by all applications
  out = model.apply({"params": params}, jnp.ones((2, 16), jnp.int32))
  assert out.sop_logits.shape == (2, 2) and out.mlm_logits.shape == (2, 16, cfg.vocab_size)


def _our_count(cfg):
  model = encoders.build(cfg)
  shapes = jax.eval_shape(lambda: encoders.init_params(model, jax.random.PRNGKey(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


# Lan et al. 2020, Table 1: 12M, 18M, 60M, 235M parameters (the base models, no heads).
@pytest.mark.parametrize("variant,paper_millions",
                         [("base", 12), ("large", 18), ("xlarge", 60), ("xxlarge", 235)])
@pytest.mark.parametrize("heads", [("pooler",), ("mlm", "sop")])
def test_parameter_count_matches_transformers(variant, paper_millions, heads):
  cfg = albert_configs.get_config(variant).model.unlock()
  cfg.heads = heads
  hf_dict, arch = albert_hf.AlbertMapping().config_to_hf(cfg)
  with torch.device("meta"):
    ref = getattr(T, arch)(T.AlbertConfig(**hf_dict))
  ours = _our_count(cfg)
  assert ours == sum(p.numel() for p in ref.parameters())
  if heads == ("pooler",):
    assert abs(ours / 1e6 - paper_millions) < 0.1 * paper_millions
