"""EuroBERT: parity with transformers in float32 on padded batches (base model, MLM head,
sequence classification with late, bos and mean pooling, token classification; 6 query heads
over 2 K/V heads, an odd MLP width; scanned and not), exports that transformers loads with
no missing or unexpected keys, the hub's older config format, parameter counts of the
released sizes, and the tiny config."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import encoders
from configs import eurobert as eb_configs
from encoders import eurobert as eb
from encoders.hf import eurobert as eb_hf
from encoders.hf import tasks as tasks_hf

ATOL = 1e-4
# 6 query heads over 2 K/V heads (head dim 8), an odd MLP width, a rotary theta a wrong
# default would miss, special ids inside the tiny vocabulary.
TINY = dict(vocab_size=99, hidden_size=48, num_hidden_layers=3, num_attention_heads=6,
            num_key_value_heads=2, intermediate_size=37, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, mask_token_id=3, max_position_embeddings=64,
            rope_parameters={"rope_type": "default", "rope_theta": 500.0})


def tiny_hf(cls, seed=0, **overrides):
  torch.manual_seed(seed)
  cfg = T.EuroBertConfig(**{**TINY, **overrides})
  cfg._attn_implementation = "eager"
  model = cls(cfg).eval()
  with torch.no_grad():  # RMSNorm weights start at 1 and biases at 0: perturb them
    for name, p in model.named_parameters():
      if "norm" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  return model


def padded_batch(batch=3, length=11, seed=0):
  rng = np.random.RandomState(seed)
  ids = rng.randint(4, TINY["vocab_size"], size=(batch, length))
  mask = np.ones_like(ids)
  for i, n in enumerate([length, length - 4, 3][:batch]):
    mask[i, n:] = 0
  ids[mask == 0] = 0
  return ids, mask


def torch_out(model, ids, mask):
  with torch.no_grad():
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask))
  key = "last_hidden_state" if hasattr(out, "last_hidden_state") else "logits"
  return getattr(out, key).numpy()


@pytest.mark.parametrize("cls,scan", [(T.EuroBertModel, False), (T.EuroBertForMaskedLM, True)])
def test_parity_tiny_random(cls, scan, tmp_path):
  hf = tiny_hf(cls, seed=1)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), scan_layers=scan, attention_impl="einsum")
  c = model.config
  assert (c.num_attention_heads, c.num_key_value_heads, c.rope_theta) == (6, 2, 500.0)
  assert params["encoder"]["layers" if scan else "layer_0"]["attention"]["key"][
      "kernel"].shape[-2:] == (2, 8)
  ids, mask = padded_batch(seed=2)
  out = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  ref = torch_out(hf, ids, mask)
  got = out.mlm_logits if cls is T.EuroBertForMaskedLM else out.last_hidden_state
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(got)[real], ref[real], atol=ATOL, rtol=0)
  assert np.abs(ref).max() > 0.1


def test_parity_with_biases_on_the_cpu_path(tmp_path):
  """attention_bias and mlp_bias on (every optional rule used), the default kernel."""
  hf = tiny_hf(T.EuroBertForMaskedLM, seed=3, attention_bias=True, mlp_bias=True)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path))
  ids, mask = padded_batch(seed=4)
  out = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.mlm_logits)[real],
                             torch_out(hf, ids, mask)[real], atol=ATOL, rtol=0)


@pytest.mark.parametrize("pooling", ["late", pytest.param("bos", marks=pytest.mark.slow),
                                     "mean"])
def test_sequence_classification_parity_and_export(pooling, tmp_path):
  hf = tiny_hf(T.EuroBertForSequenceClassification, seed=5, classifier_pooling=pooling,
               num_labels=3)
  hf.save_pretrained(tmp_path / "src")
  model, params = tasks_hf.from_hf(str(tmp_path / "src"))
  assert model.task == "sequence" and model.num_labels == 3
  ids, mask = padded_batch(seed=6)
  apply = jax.jit(model.apply)
  out = apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  ref = torch_out(hf, ids, mask)
  np.testing.assert_allclose(np.asarray(out.logits), ref, atol=ATOL, rtol=0)
  assert np.abs(ref).max() > 1e-3
  # more padding changes nothing; packed rows (segment ids) give each example its logits
  wide = np.pad(ids, ((0, 0), (0, 5))), np.pad(mask, ((0, 0), (0, 5)))
  np.testing.assert_allclose(np.asarray(apply({"params": params}, *map(jnp.asarray, wide))
                                        .logits), ref, atol=1e-5, rtol=0)
  n0, n2 = int(mask[0].sum()), int(mask[2].sum())
  row = np.concatenate([ids[0, :n0], ids[2, :n2], [0]])[None]
  seg = np.array([[1] * n0 + [2] * n2 + [0]])
  packed = apply({"params": params}, jnp.asarray(row), jnp.asarray(seg > 0),
                 segment_ids=jnp.asarray(seg)).logits
  np.testing.assert_allclose(np.asarray(packed)[0, [0, n0]], ref[[0, 2]], atol=1e-5, rtol=0)
  tasks_hf.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = T.EuroBertForSequenceClassification.from_pretrained(
      str(tmp_path / "out"), output_loading_info=True, attn_implementation="eager")
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert loaded.config.classifier_pooling == pooling
  np.testing.assert_allclose(torch_out(loaded.eval(), ids, mask), ref, atol=1e-6)


def test_token_classification_parity_and_export(tmp_path):
  hf = tiny_hf(T.EuroBertForTokenClassification, seed=7, num_labels=5)
  hf.save_pretrained(tmp_path / "src")
  model, params = tasks_hf.from_hf(str(tmp_path / "src"))
  assert model.task == "token"
  ids, mask = padded_batch(seed=8)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  ref, real = torch_out(hf, ids, mask), mask.astype(bool)
  np.testing.assert_allclose(np.asarray(out.logits)[real], ref[real], atol=ATOL, rtol=0)
  tasks_hf.to_hf(model, params, str(tmp_path / "out"))
  _, info = T.EuroBertForTokenClassification.from_pretrained(
      str(tmp_path / "out"), output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info


@pytest.mark.parametrize("cls", [T.EuroBertModel, T.EuroBertForMaskedLM])
def test_export_loads_in_transformers_without_missing_or_unexpected_keys(cls, tmp_path):
  hf = tiny_hf(cls, seed=9)
  hf.save_pretrained(tmp_path / "src")
  model, params = encoders.from_hf(str(tmp_path / "src"), scan_layers=True)
  encoders.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = cls.from_pretrained(str(tmp_path / "out"), output_loading_info=True,
                                     attn_implementation="eager")
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert loaded.config.num_key_value_heads == 2
  ids, mask = padded_batch(seed=10)
  real = mask.astype(bool)
  np.testing.assert_allclose(torch_out(loaded.eval(), ids, mask)[real],
                             torch_out(hf, ids, mask)[real], atol=1e-6)


def test_hub_config_format_is_read_as_transformers_reads_it(tmp_path):
  """The released config.json: `rope_theta` at the top level, rope_scaling null, the
  remote-code auto_map, token strings; a legacy `clf_pooling` that disagrees with
  classifier_pooling is refused."""
  import json
  hf = tiny_hf(T.EuroBertForMaskedLM, seed=11)
  hf.save_pretrained(tmp_path)
  path = tmp_path / "config.json"
  cfg = json.loads(path.read_text())
  del cfg["rope_parameters"]
  cfg.update(rope_theta=500.0, rope_scaling=None, auto_map={"AutoModel": "x.y"},
             mask_token="<|mask|>", hidden_dropout=0.0, clf_pooling="late")
  path.write_text(json.dumps(cfg))
  model, _ = encoders.from_hf(str(tmp_path))
  assert model.config.rope_theta == 500.0
  cfg["clf_pooling"] = "bos"
  path.write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match="clf_pooling"):
    encoders.from_hf(str(tmp_path))
  cfg.update(clf_pooling="late", tie_word_embeddings=True)
  path.write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match="tie_word_embeddings"):
    encoders.from_hf(str(tmp_path))


def _count(cfg):
  shapes = jax.eval_shape(lambda: encoders.init_params(encoders.build(cfg),
                                                       jax.random.PRNGKey(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


@pytest.mark.parametrize("variant,millions", [
    pytest.param("210m", 310.3, marks=pytest.mark.slow), ("610m", 755.6),
    pytest.param("2.1b", 2403.1, marks=pytest.mark.slow)])
def test_parameter_count_matches_transformers(variant, millions):
  """The names count the encoder without the untied lm_head (V x D)."""
  cfg = eb.defaults(variant)
  hf_dict, arch = eb_hf.EuroBertMapping().config_to_hf(cfg)
  with torch.device("meta"):
    ref = getattr(T, arch)(T.EuroBertConfig(**hf_dict))
  ours = _count(cfg)
  assert ours == sum(p.numel() for p in ref.parameters())
  assert abs(ours / 1e6 - millions) < 0.05
  name = float(variant.rstrip("mb")) * (1e3 if variant.endswith("b") else 1)
  assert abs((ours - cfg.vocab_size * cfg.hidden_size) / 1e6 - name) / name < 0.02


def test_flops_count_grouped_kv_projections():
  cfg = eb.defaults("610m")
  mha = cfg.copy_and_resolve_references()
  mha.num_key_value_heads = mha.num_attention_heads
  d, t = cfg.hidden_size, 512
  saved = eb.forward_flops(mha, t) - eb.forward_flops(cfg, t)
  # k and v: 2 * 2TD x (18 - 6) heads x 64 per layer
  assert saved == cfg.num_hidden_layers * 4 * t * d * (18 - 6) * 64


def test_config_errors_are_named():
  for key, value, match in (("num_key_value_heads", 3, "num_key_value_heads"),
                            ("attention_dropout", 0.1, "attention_dropout"),
                            ("classifier_pooling", "max", "classifier_pooling"),
                            ("pad_token_id", 128001, "pad_token_id"),
                            ("norm_kind", "batchnorm", "norm kind")):
    cfg = eb.defaults("tiny")
    cfg.update(vocab_size=99, pad_token_id=0)
    cfg[key] = value
    with pytest.raises(ValueError, match=match):  # at init, before any computation
      jax.eval_shape(lambda: encoders.init_params(encoders.build(cfg),
                                                  jax.random.PRNGKey(0)))


def test_tiny_config_builds_and_layernorm_is_a_config_switch():
  cfg = eb_configs.get_config("tiny").model.unlock()
  assert cfg.num_key_value_heads < cfg.num_attention_heads and cfg.norm_kind == "rmsnorm"
  cfg.vocab_size, cfg.pad_token_id = 99, 0  # the trainer sizes them to the tokenizer
  cfg.num_hidden_layers = 1
  ids = jnp.ones((2, 16), jnp.int32)
  outs = []
  for kind in ("rmsnorm", "layernorm"):
    cfg.norm_kind = kind
    model = encoders.build(cfg)
    params = encoders.init_params(model, jax.random.PRNGKey(0))
    out = jax.jit(model.apply)({"params": params}, ids)
    assert out.mlm_logits.shape == (2, 16, 99)
    outs.append(np.asarray(out.last_hidden_state))
  assert np.abs(outs[0] - outs[1]).max() > 1e-3  # the switch reaches the model
  # special ids of the released vocabulary outside a trained one: a config transformers takes
  hf, _ = eb_hf.EuroBertMapping().config_to_hf(cfg)
  assert T.EuroBertConfig(**hf).pad_token_id == 0 and hf.get("bos_token_id") is None
