"""BERT / RoBERTa parity with the transformers PyTorch implementation in float32."""
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import encoders
from tests.encoders import hf_helpers as H

ATOL = 1e-4


def _ours(model, params, ids, mask, types):
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  return out


def _assert_parity(out, ref, mask):
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real],
                             ref["last_hidden_state"][real], atol=ATOL, rtol=0)
  for name in ("mlm_logits", "nsp_logits", "pooler_output"):
    if name in ref:
      got = getattr(out, name)
      assert got is not None, f"{name} missing"
      assert got.shape == ref[name].shape
      np.testing.assert_allclose(np.asarray(got), ref[name], atol=ATOL, rtol=0)
    elif name != "pooler_output":
      assert getattr(out, name) is None


@pytest.mark.parametrize("arch,prefixed", [(a, False) for a in sorted(H.ARCHS)] +
                         [("BertModel", True), ("RobertaModel", True)])
def test_parity_tiny_random(arch, prefixed, tmp_path):
  hf = H.tiny_hf_model(arch)
  hf.save_pretrained(tmp_path)
  if prefixed:  # a base model's tensors under the "bert."/"roberta." prefix
    from safetensors.numpy import load_file, save_file
    f = tmp_path / "model.safetensors"
    prefix = hf.config.model_type
    save_file({f"{prefix}.{k}": v for k, v in load_file(f).items()}, f,
              metadata={"format": "pt"})
  model, params = encoders.from_hf(str(tmp_path))
  ids, mask, types = H.padded_batch(hf.config)
  ref = H.torch_outputs(hf, ids, mask, types)
  _assert_parity(_ours(model, params, ids, mask, types), ref, mask)
  assert np.abs(ref["last_hidden_state"]).max() > 0.1  # the comparison is not vacuous


@pytest.mark.parametrize("impl", ["einsum", "xla", "cpu", "auto"])
def test_parity_attention_impls(impl, tmp_path):
  hf = H.tiny_hf_model("BertForPreTraining", seed=3)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), attention_impl=impl)
  ids, mask, types = H.padded_batch(hf.config, seed=5)
  _assert_parity(_ours(model, params, ids, mask, types), H.torch_outputs(hf, ids, mask, types),
                 mask)


@pytest.mark.parametrize("arch", ["BertForPreTraining", "RobertaForMaskedLM", "BertModel"])
def test_export_round_trip(arch, tmp_path):
  hf = H.tiny_hf_model(arch, seed=1)
  hf.save_pretrained(tmp_path / "in")
  model, params = encoders.from_hf(str(tmp_path / "in"))
  encoders.to_hf(model, params, str(tmp_path / "out"))
  cls = H.ARCHS[arch][0]
  reloaded, info = cls.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
  assert not info["mismatched_keys"]
  ids, mask, types = H.padded_batch(hf.config, seed=2)
  ref = H.torch_outputs(reloaded.eval(), ids, mask, types)
  _assert_parity(_ours(model, params, ids, mask, types), ref, mask)


def test_export_from_fresh_init(tmp_path):
  """A model initialised here (not loaded) exports to a directory transformers loads."""
  import jax
  from configs import bert as bert_config
  cfg = bert_config.get_config("tiny").model
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  encoders.to_hf(model, params, str(tmp_path / "out"))
  hf, info = T.BertForPreTraining.from_pretrained(str(tmp_path / "out"),
                                                  output_loading_info=True)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
  ids, mask, types = H.padded_batch(hf.config, length=16, seed=4)
  ref = H.torch_outputs(hf.eval(), ids, mask, types)
  _assert_parity(_ours(model, params, ids, mask, types), ref, mask)


def test_masked_positions_match_full_logits(tmp_path):
  hf = H.tiny_hf_model("BertForMaskedLM")
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path))
  ids, mask, types = H.padded_batch(hf.config)
  full = model.apply({"params": params}, ids, mask, types).mlm_logits
  pos = np.array([[0, 5, 2], [1, 1, 6], [0, 2, 1]])
  part = model.apply({"params": params}, ids, mask, types, masked_positions=pos).mlm_logits
  assert part.shape == (3, 3, hf.config.vocab_size)
  np.testing.assert_allclose(part, np.take_along_axis(np.asarray(full), pos[..., None], 1),
                             atol=1e-6)
