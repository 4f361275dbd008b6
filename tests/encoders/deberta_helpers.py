"""Shared helpers of the DeBERTa tests: tiny random transformers models in each style
(v3, v2 and v1 options) and the float32 comparison with ours."""
import numpy as np
import torch
import transformers as T

from tests.encoders import hf_helpers as H

ATOL = 1e-4
# v3 style: T=20 > 2 * position_buckets / 2, so long distances land in log buckets.
V3 = dict(relative_attention=True, position_buckets=8, norm_rel_ebd="layer_norm",
          share_att_key=True, pos_att_type="p2c|c2p", position_biased_input=False,
          max_relative_positions=-1, type_vocab_size=0)
# v2 style: no buckets and a span (6) shorter than the sequence, so distances clip.
V2 = dict(relative_attention=True, position_buckets=-1, max_relative_positions=6,
          share_att_key=False, pos_att_type="p2c|c2p", position_biased_input=True,
          conv_kernel_size=3, conv_act="gelu", type_vocab_size=2, embedding_size=24,
          norm_rel_ebd="none")
# DeBERTa v1 (DebertaConfig; tests/encoders/test_deberta_v1.py): microsoft/deberta-base's
# options (both terms, distances up to max_position_embeddings, no absolute positions, no
# token types); a span (6) shorter than the sequence (20), so distances clip, with
# absolute positions, token types and E != D; c2p alone; no relative terms.
V1_BASE = dict(relative_attention=True, pos_att_type="c2p|p2c", max_relative_positions=-1,
               position_biased_input=False, type_vocab_size=0)
V1_CLIPPED = dict(relative_attention=True, pos_att_type="c2p|p2c", max_relative_positions=6,
                  position_biased_input=True, type_vocab_size=2, embedding_size=24)
STYLES = {"v3": V3, "v2": V2, "v1_base": V1_BASE, "v1_clipped": V1_CLIPPED,
          "v1_c2p_only": dict(V1_BASE, pos_att_type="c2p"),
          "v1_no_relative": dict(V1_BASE, relative_attention=False, position_biased_input=True)}


def tiny_hf(arch, style, seed=0, **overrides):
  """A tiny random `arch` in `style` (its config class is the architecture's own:
  DebertaV2Config, or DebertaConfig for v1's Deberta* and the v1_* styles)."""
  torch.manual_seed(seed)
  cls = getattr(T, arch)
  cfg = cls.config_class(**{**H.TINY, "max_position_embeddings": 64, **STYLES[style],
                            **overrides})
  model = cls(cfg).eval()
  with torch.no_grad():  # biases and norms away from 0/1, so every mapping is checked
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        p.add_(0.1 * torch.randn_like(p))
  return model


def compare(out, ref, mask):
  """Our output against transformers' (`ref`: torch_outputs) on the real tokens."""
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real],
                             ref["last_hidden_state"][real], atol=ATOL, rtol=0)
  if "mlm_logits" in ref:
    assert out.mlm_logits.shape == ref["mlm_logits"].shape
    np.testing.assert_allclose(np.asarray(out.mlm_logits)[real], ref["mlm_logits"][real],
                               atol=ATOL, rtol=0)
  assert np.abs(ref["last_hidden_state"]).max() > 0.1  # not vacuous
