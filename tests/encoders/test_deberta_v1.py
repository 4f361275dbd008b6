"""DeBERTa v1 (transformers' `Deberta*`, model_type "deberta"): parity with transformers in
float32 on tiny random configs (padded batches, clipped relative distances, absolute
positions and token types, the non-legacy MLM head, every relative formulation), the
fused `in_proj`'s per-head layout, and the options v1 does not have. Its export and the
released sizes' parameter counts are tested with v2's in test_deberta.py (styles v1_*)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import encoders
from encoders import deberta
from tests.encoders import hf_helpers as H
from tests.encoders.deberta_helpers import compare, tiny_hf



@pytest.mark.parametrize("arch,style", [("DebertaModel", "v1_base"),
                                        ("DebertaForMaskedLM", "v1_base"),
                                        ("DebertaForMaskedLM", "v1_clipped"),
                                        ("DebertaModel", "v1_c2p_only"),
                                        ("DebertaModel", "v1_no_relative")])
def test_parity_tiny_random(arch, style, tmp_path):
  hf = tiny_hf(arch, style, seed=1)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), dtype="float32")
  assert model.config.family == "deberta"
  ids, mask, types = H.padded_batch(hf.config, length=20, seed=2)
  assert not mask.all() and (types.any() or style != "v1_clipped")
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  compare(out, H.torch_outputs(hf, ids, mask, types), mask)


@pytest.mark.parametrize("impl", ["gather", "headmajor"])
def test_parity_of_the_other_relative_formulations(impl, tmp_path):
  hf = tiny_hf("DebertaForMaskedLM", "v1_clipped", seed=3)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), dtype="float32", relative_impl=impl)
  ids, mask, types = H.padded_batch(hf.config, length=20, seed=4)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  compare(out, H.torch_outputs(hf, ids, mask, types), mask)


def test_non_legacy_mlm_head(tmp_path):
  hf = tiny_hf("DebertaForMaskedLM", "v1_base", seed=5, legacy=False)
  assert hasattr(hf, "lm_predictions")
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), dtype="float32")
  ids, mask, types = H.padded_batch(hf.config, length=20, seed=6)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  compare(out, H.torch_outputs(hf, ids, mask, types), mask)


def test_in_proj_rows_are_split_per_head(tmp_path):
  """transformers' fused in_proj holds, for head h, its query, key and value rows side by
  side (rows 3Kh .. 3Kh + 3K): each lands in our (D, H, K) kernel of that part and head."""
  hf = tiny_hf("DebertaModel", "v1_base", seed=7)
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
