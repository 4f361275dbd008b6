"""DeBERTa's enhanced mask decoder (`enhanced_mask_decoder`): the MLM logits against a
reference built from transformers' own layers in float32 (the released pretraining code's
decoder: the last DebertaV2Layer run twice more with `query_states`, queries starting at
the absolute position table + that layer's input), on padded batches; the table's import
and export; the loaded-from-HF default (off, the position table of a released checkpoint
ignored as transformers ignores it); the MLM head at masked positions; the FLOP count; and
the settings it needs. (tests/launch/test_aot.py's DeBERTa compile checks that a TPU
training step runs the fused kernel for exactly the layer passes counted here.)"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import encoders
from configs import deberta as deberta_configs
from tests.encoders import hf_helpers as H
from tests.encoders.deberta_helpers import tiny_hf

ATOL = 1e-4
TABLE = "deberta.embeddings.position_embeddings.weight"


def _with_position_table(hf, path, seed=0):
  """Saves `hf` and adds the absolute position table the released checkpoints carry
  (transformers' DebertaV2 has no module for it when position_biased_input=False)."""
  hf.save_pretrained(path)
  tensors = load_file(f"{path}/model.safetensors")
  assert TABLE not in tensors
  g = torch.Generator().manual_seed(seed)
  table = torch.randn(hf.config.max_position_embeddings, hf.config.hidden_size, generator=g)
  tensors[TABLE] = table
  save_file(tensors, f"{path}/model.safetensors", metadata={"format": "pt"})
  return table


def reference_emd_logits(hf, table, ids, mask, types):
  """The decoder from transformers' modules: hidden states of every layer, then the last
  layer twice with query_states (keys and values: that layer's input), then the MLM head."""
  with torch.no_grad():
    ids, mask, types = (torch.tensor(a) for a in (ids, mask, types))
    out = hf.deberta(ids, attention_mask=mask, token_type_ids=types,
                     output_hidden_states=True)
    enc = hf.deberta.encoder
    prev = out.hidden_states[-2]
    ext, rel_pos = enc.get_attention_mask(mask), enc.get_rel_pos(prev)
    rel = enc.get_rel_embedding()
    query = table[torch.arange(ids.shape[1])][None] + prev
    for _ in range(2):
      query = enc.layer[-1](prev, ext, query_states=query, relative_pos=rel_pos,
                            rel_embeddings=rel)[0]
    if hf.legacy:
      logits = hf.cls(query)
    else:
      logits = hf.lm_predictions(query, hf.deberta.embeddings.word_embeddings)
  return out.last_hidden_state.numpy(), logits.numpy()


@pytest.mark.parametrize("legacy", [True, False])
def test_decoder_matches_transformers_layers_run_as_the_released_code_does(legacy, tmp_path):
  hf = tiny_hf("DebertaV2ForMaskedLM", "v3", seed=11, legacy=legacy)
  table = _with_position_table(hf, tmp_path)
  model, params = encoders.from_hf(str(tmp_path), dtype="float32",
                                   enhanced_mask_decoder=True)
  assert params["emd_positions"]["embedding"].shape == tuple(table.shape)
  ids, mask, types = H.padded_batch(hf.config, length=20, seed=12)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  hidden, logits = reference_emd_logits(hf, table, ids, mask, types)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real], hidden[real], atol=ATOL,
                             rtol=0)
  np.testing.assert_allclose(np.asarray(out.mlm_logits)[real], logits[real], atol=ATOL, rtol=0)
  # the decoder changes the logits: without it they are transformers' own
  plain = H.torch_outputs(hf, ids, mask, types)["mlm_logits"]
  assert np.abs(plain[real] - logits[real]).max() > 1e-2
  # masked positions only: the same logits at those positions
  pos = np.array([[1, 5, 9], [0, 2, 14], [0, 1, 2]])
  at = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types),
                   masked_positions=jnp.asarray(pos))
  np.testing.assert_allclose(np.asarray(at.mlm_logits),
                             np.take_along_axis(np.asarray(out.mlm_logits), pos[..., None], 1),
                             atol=1e-5)


def test_import_ignores_the_released_position_table_by_default(tmp_path):
  """transformers drops it (its model has no such module); so does a plain import, which
  then gives transformers' logits."""
  hf = tiny_hf("DebertaV2ForMaskedLM", "v3", seed=13)
  _with_position_table(hf, tmp_path)
  model, params = encoders.from_hf(str(tmp_path), dtype="float32")
  assert not model.config.enhanced_mask_decoder and "emd_positions" not in params
  ids, mask, types = H.padded_batch(hf.config, length=20, seed=14)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.mlm_logits)[real],
                             H.torch_outputs(hf, ids, mask, types)["mlm_logits"][real],
                             atol=ATOL, rtol=0)
  hf.save_pretrained(tmp_path / "no_table")
  with pytest.raises(ValueError, match="position_embeddings"):
    encoders.from_hf(str(tmp_path / "no_table"), enhanced_mask_decoder=True)


def test_export_keeps_the_decoder_and_loads_in_transformers(tmp_path):
  import transformers as T
  hf = tiny_hf("DebertaV2ForMaskedLM", "v3", seed=15)
  _with_position_table(hf, tmp_path / "src")
  model, params = encoders.from_hf(str(tmp_path / "src"), enhanced_mask_decoder=True)
  encoders.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = T.DebertaV2ForMaskedLM.from_pretrained(str(tmp_path / "out"),
                                                        output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  again, params2 = encoders.from_hf(str(tmp_path / "out"))
  assert again.config.enhanced_mask_decoder
  ids, mask, types = H.padded_batch(hf.config, length=20, seed=16)
  a = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  b = again.apply({"params": params2}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  np.testing.assert_allclose(np.asarray(a.mlm_logits), np.asarray(b.mlm_logits), atol=1e-6)


def test_v1_family_runs_the_decoder():
  cfg = deberta_configs.get_config("v1-tiny").model
  assert cfg.family == "deberta" and cfg.enhanced_mask_decoder
  model = encoders.build(cfg)
  params = jax.eval_shape(lambda: encoders.init_params(model, jax.random.PRNGKey(0)))
  assert "emd_positions" in params.get("params", params)


def test_flops_count_the_decoders_passes_and_bad_settings_raise():
  cfg = deberta_configs.get_config("base").model
  assert cfg.enhanced_mask_decoder
  off = cfg.unlock().copy_and_resolve_references()
  off.enhanced_mask_decoder = False
  t = 512
  one_less = off.copy_and_resolve_references()
  one_less.num_hidden_layers = 11
  per_layer = encoders.forward_flops(off, t) - encoders.forward_flops(one_less, t)
  # MLM only: the decoder's two passes replace the last layer's own, which feeds nothing
  assert tuple(cfg.heads) == ("mlm",)
  assert encoders.forward_flops(cfg, t) - encoders.forward_flops(off, t) == per_layer
  pooled = cfg.unlock().copy_and_resolve_references()
  pooled.heads = ("pooler", "mlm")
  off.heads = ("pooler", "mlm")
  assert encoders.forward_flops(pooled, t) - encoders.forward_flops(off, t) == 2 * per_layer
  tiny = deberta_configs.get_config("tiny").model
  for change, match in ((dict(position_biased_input=True), "position_biased_input"),
                        (dict(scan_layers=True), "scan_layers"),
                        (dict(heads=("pooler",)), "mlm head"),
                        (dict(num_hidden_layers=1), "2 layers")):
    bad = tiny.copy_and_resolve_references()
    bad.update(change)
    with pytest.raises(ValueError, match=match):
      encoders.init_params(encoders.build(bad), jax.random.PRNGKey(0))
