"""DeBERTa v1 (transformers' `Deberta*`, model_type "deberta"): parity with transformers in
float32 on tiny random configs (padded batches, clipped relative distances, absolute
positions and token types, the non-legacy MLM head, every relative formulation), export
that transformers loads with no missing or unexpected keys, the fused `in_proj`'s per-head
layout, the released sizes' parameter counts, and the options v1 does not have."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import encoders
from encoders import deberta
from encoders.hf import deberta as deberta_hf
from tests.encoders import hf_helpers as H

ATOL = 1e-4
# microsoft/deberta-base's options: both terms, distances up to max_position_embeddings,
# no absolute positions, no token types.
BASE = dict(relative_attention=True, pos_att_type="c2p|p2c", max_relative_positions=-1,
            position_biased_input=False, type_vocab_size=0)
# A span (6) shorter than the sequence (20), so distances clip; absolute positions, token
# types, E != D (the embedding projection).
CLIPPED = dict(relative_attention=True, pos_att_type="c2p|p2c", max_relative_positions=6,
               position_biased_input=True, type_vocab_size=2, embedding_size=24)
STYLES = {"base": BASE, "clipped": CLIPPED, "c2p_only": dict(BASE, pos_att_type="c2p"),
          "no_relative": dict(BASE, relative_attention=False, position_biased_input=True)}


def tiny_hf(arch, style, seed=0, **overrides):
  torch.manual_seed(seed)
  cfg = T.DebertaConfig(**{**H.TINY, "max_position_embeddings": 64, **STYLES[style],
                           **overrides})
  model = getattr(T, arch)(cfg).eval()
  with torch.no_grad():  # biases and norms away from 0/1, so every mapping is checked
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        p.add_(0.1 * torch.randn_like(p))
  return model


def _compare(out, ref, mask):
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real],
                             ref["last_hidden_state"][real], atol=ATOL, rtol=0)
  if "mlm_logits" in ref:
    assert out.mlm_logits.shape == ref["mlm_logits"].shape
    np.testing.assert_allclose(np.asarray(out.mlm_logits)[real], ref["mlm_logits"][real],
                               atol=ATOL, rtol=0)
  assert np.abs(ref["last_hidden_state"]).max() > 0.1  # not vacuous


@pytest.mark.parametrize("arch,style", [("DebertaModel", "base"),
                                        ("DebertaForMaskedLM", "base"),
                                        ("DebertaForMaskedLM", "clipped"),
                                        ("DebertaModel", "c2p_only"),
                                        ("DebertaModel", "no_relative")])
def test_parity_tiny_random(arch, style, tmp_path):
  hf = tiny_hf(arch, style, seed=1)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), dtype="float32")
  assert model.config.family == "deberta"
  ids, mask, types = H.padded_batch(hf.config, length=20, seed=2)
  assert not mask.all() and (types.any() or style != "clipped")
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  _compare(out, H.torch_outputs(hf, ids, mask, types), mask)


@pytest.mark.parametrize("impl", ["gather", "headmajor"])
def test_parity_of_the_other_relative_formulations(impl, tmp_path):
  hf = tiny_hf("DebertaForMaskedLM", "clipped", seed=3)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), dtype="float32", relative_impl=impl)
  ids, mask, types = H.padded_batch(hf.config, length=20, seed=4)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  _compare(out, H.torch_outputs(hf, ids, mask, types), mask)


def test_non_legacy_mlm_head(tmp_path):
  hf = tiny_hf("DebertaForMaskedLM", "base", seed=5, legacy=False)
  assert hasattr(hf, "lm_predictions")
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), dtype="float32")
  ids, mask, types = H.padded_batch(hf.config, length=20, seed=6)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  _compare(out, H.torch_outputs(hf, ids, mask, types), mask)


def test_in_proj_rows_are_split_per_head(tmp_path):
  """transformers' fused in_proj holds, for head h, its query, key and value rows side by
  side (rows 3Kh .. 3Kh + 3K): each lands in our (D, H, K) kernel of that part and head."""
  hf = tiny_hf("DebertaModel", "base", seed=7)
  hf.save_pretrained(tmp_path)
  _, params = encoders.from_hf(str(tmp_path), dtype="float32")
  w = hf.encoder.layer[1].attention.self.in_proj.weight.detach().numpy()  # (3D, D)
  attn = params["encoder"]["layer_1"]["attention"]
  heads, k = hf.config.num_attention_heads, hf.config.hidden_size // hf.config.num_attention_heads
  for part, name in enumerate(("query", "key", "value")):
    for h in range(heads):
      rows = w[3 * k * h + k * part: 3 * k * h + k * (part + 1)]  # (K, D)
      np.testing.assert_array_equal(np.asarray(attn[name]["kernel"][:, h, :]), rows.T)
  assert "bias" not in attn["key"] and "bias" not in attn["pos_key"]


@pytest.mark.parametrize("style", ["base", "clipped"])
def test_export_loads_in_transformers_without_missing_or_unexpected_keys(style, tmp_path):
  hf = tiny_hf("DebertaForMaskedLM", style, seed=8)
  hf.save_pretrained(tmp_path / "src")
  model, params = encoders.from_hf(str(tmp_path / "src"))
  encoders.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = T.DebertaForMaskedLM.from_pretrained(str(tmp_path / "out"),
                                                      output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert type(loaded.config) is T.DebertaConfig
  ids, mask, types = H.padded_batch(hf.config, length=20, seed=9)
  ref, got = H.torch_outputs(hf, ids, mask, types), H.torch_outputs(loaded.eval(), ids, mask,
                                                                    types)
  for name in ref:
    np.testing.assert_allclose(got[name], ref[name], atol=1e-6)


def _our_count(cfg):
  model = encoders.build(cfg)
  shapes = jax.eval_shape(lambda: encoders.init_params(model, jax.random.PRNGKey(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


# The released microsoft/deberta-{base,large,xlarge} sizes: exact equality with
# transformers' own count of the same config.
@pytest.mark.parametrize("variant", ["base", "large", "xlarge"])
@pytest.mark.parametrize("heads", [(), ("mlm",)])
def test_parameter_count_matches_transformers(variant, heads):
  cfg = deberta.defaults_v1(variant)
  cfg.heads = heads
  hf_dict, arch = deberta_hf.DebertaV1Mapping().config_to_hf(cfg)
  assert arch.startswith("Deberta") and not arch.startswith("DebertaV2")
  with torch.device("meta"):
    ref = getattr(T, arch)(T.DebertaConfig(**hf_dict))
  assert _our_count(cfg) == sum(p.numel() for p in ref.parameters())


def test_v2_options_and_talking_heads_are_refused(tmp_path):
  for change, name in ((dict(position_buckets=8), "position_buckets"),
                       (dict(share_att_key=True), "share_att_key"),
                       (dict(norm_rel_ebd="layer_norm"), "norm_rel_ebd"),
                       (dict(conv_kernel_size=3), "conv_kernel_size")):
    cfg = deberta.defaults_v1("tiny")
    cfg.update(change)
    with pytest.raises(ValueError, match=f"v1.*{name}"):
      encoders.init_params(encoders.build(cfg), jax.random.PRNGKey(0))
  torch.manual_seed(0)
  T.DebertaModel(T.DebertaConfig(**H.TINY, talking_head=True)).save_pretrained(tmp_path)
  with pytest.raises(ValueError, match="talking_head"):
    encoders.from_hf(str(tmp_path))
