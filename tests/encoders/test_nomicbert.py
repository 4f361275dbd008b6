"""NomicBERT: parity with transformers in float32 on padded batches (odd shapes: head_dim
not hidden / heads, an MLP width of 37, token types; scanned and not; linear and dynamic
RoPE scaling), the MLM head and the sequence / token classification heads, exports that
transformers loads with no missing or unexpected keys, parameter counts, refusals."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import encoders
from configs import nomicbert as nb_configs
from encoders import nomicbert as nb
from encoders.hf import nomicbert as nb_hf
from encoders.hf import tasks as tasks_hf

ATOL = 1e-4
# head_dim 6 with hidden 32 and 4 heads (q/k/v project to 24), 3 layers, MLP 37; weights
# drawn 10x wider than usual so attention is sharp and positions (rotary) matter
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            head_dim=6, intermediate_size=37, max_position_embeddings=64, pad_token_id=0,
            initializer_range=0.2)


def tiny_hf(arch, seed=0, **overrides):
  torch.manual_seed(seed)
  cfg = T.NomicBertConfig(**{**TINY, **overrides})
  cfg._attn_implementation = "eager"
  model = getattr(T, arch)(cfg).eval()
  with torch.no_grad():  # norms and biases away from 1/0, so their mapping is checked
    for name, p in model.named_parameters():
      if "norm" in name.lower() or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  return model


def padded_batch(batch=3, length=11, seed=0):
  rng = np.random.RandomState(seed)
  ids = rng.randint(3, 99, size=(batch, length))
  mask = np.ones_like(ids)
  for i, n in enumerate([length, length - 4, 3][:batch]):
    mask[i, n:] = 0
  ids[mask == 0] = 0
  types = (np.arange(length)[None] >= 4).astype(np.int64) * mask
  return ids, mask, types


def torch_out(model, ids, mask, types):
  with torch.no_grad():
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                token_type_ids=torch.tensor(types), output_hidden_states=True)
  res = {"last_hidden_state": out.hidden_states[-1].numpy()}
  if getattr(out, "logits", None) is not None:
    res["mlm_logits"] = out.logits.numpy()
  return res


def ours(model, params, ids, mask, types):
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask),
                             jnp.asarray(types))
  return {k: np.asarray(v) for k, v in (("last_hidden_state", out.last_hidden_state),
                                        ("mlm_logits", out.mlm_logits)) if v is not None}


def assert_parity(got, ref, mask):
  real = mask.astype(bool)
  assert set(got) == set(ref)
  for name in ref:
    np.testing.assert_allclose(got[name][real], ref[name][real], atol=ATOL, rtol=0,
                               err_msg=name)
    assert np.abs(ref[name]).max() > 0.1


@pytest.mark.parametrize("arch,scan", [
    ("NomicBertForMaskedLM", False),
    pytest.param("NomicBertModel", False, marks=pytest.mark.slow),
    pytest.param("NomicBertForMaskedLM", True, marks=pytest.mark.slow)])
def test_parity_tiny_random(arch, scan, tmp_path):
  hf = tiny_hf(arch, seed=1)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), scan_layers=scan, attention_impl="einsum")
  assert model.config.family == "nomic_bert" and model.config.head_dim == 6
  ids, mask, types = padded_batch(seed=2)
  assert not mask.all() and types.any()
  assert_parity(ours(model, params, ids, mask, types), torch_out(hf, ids, mask, types), mask)


@pytest.mark.parametrize("rope", [
    {"rope_type": "linear", "factor": 3.0, "rope_theta": 50.0},
    pytest.param({"rope_type": "dynamic", "factor": 2.0, "rope_theta": 50.0},
                 marks=pytest.mark.slow)])
def test_parity_with_rope_scaling(rope, tmp_path):
  """Linear scaling divides the positions; dynamic NTK equals the default up to
  max_position_embeddings (the longest input either takes here: rows of 64)."""
  hf = tiny_hf("NomicBertModel", seed=3, rope_parameters=rope)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path))
  assert (model.config.rope_type, model.config.rope_factor) == (rope["rope_type"],
                                                                 rope["factor"])
  ids, mask, types = padded_batch(length=64, seed=4)
  assert_parity(ours(model, params, ids, mask, types), torch_out(hf, ids, mask, types), mask)
  if rope["rope_type"] == "linear":  # the factor matters: without it the output differs
    unscaled, _ = encoders.from_hf(str(tmp_path), rope_type="default")
    diff = ours(unscaled, params, ids, mask, types)["last_hidden_state"] - torch_out(
        hf, ids, mask, types)["last_hidden_state"]
    assert np.abs(diff[mask.astype(bool)]).max() > 1e-3


def test_export_loads_in_transformers_without_missing_or_unexpected_keys(tmp_path):
  hf = tiny_hf("NomicBertForMaskedLM", seed=4)
  hf.save_pretrained(tmp_path / "src")
  model, params = encoders.from_hf(str(tmp_path / "src"), scan_layers=True)
  encoders.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = T.NomicBertForMaskedLM.from_pretrained(
      str(tmp_path / "out"), output_loading_info=True, attn_implementation="eager")
  assert not any(info.values()), info
  ids, mask, types = padded_batch(seed=6)
  ref, got = torch_out(hf, ids, mask, types), torch_out(loaded.eval(), ids, mask, types)
  for name in ref:
    np.testing.assert_allclose(got[name], ref[name], atol=1e-6)


@pytest.mark.parametrize("task,cls", [
    ("sequence", "NomicBertForSequenceClassification"),
    pytest.param("token", "NomicBertForTokenClassification", marks=pytest.mark.slow)])
def test_task_heads_parity_and_export(task, cls, tmp_path):
  torch.manual_seed(5)
  labels = ("a", "b", "c")
  cfg = T.NomicBertConfig(**TINY, id2label=dict(enumerate(labels)),
                          label2id={n: i for i, n in enumerate(labels)})
  hf = getattr(T, cls)(cfg).eval()
  with torch.no_grad():
    for name, p in hf.named_parameters():
      if "norm" in name.lower() or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  hf.save_pretrained(tmp_path / "src")
  model, params = tasks_hf.from_hf(str(tmp_path / "src"))
  assert model.task == task and model.labels == labels
  ids, mask, types = padded_batch(seed=7)
  with torch.no_grad():
    want = hf(torch.tensor(ids), attention_mask=torch.tensor(mask),
              token_type_ids=torch.tensor(types)).logits.numpy()
  got = np.asarray(model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask),
                               jnp.asarray(types)).logits)
  sel = Ellipsis if task == "sequence" else mask.astype(bool)
  np.testing.assert_allclose(got[sel], want[sel], atol=ATOL, rtol=0)
  assert np.abs(want).max() > 1e-3
  tasks_hf.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = getattr(T, cls).from_pretrained(str(tmp_path / "out"),
                                                 output_loading_info=True)
  assert not any(info.values()), info
  assert loaded.config.id2label == dict(enumerate(labels))


def test_no_question_answering_class_in_transformers():
  from encoders import tasks
  mapping = nb_hf.NomicBertMapping()
  cfg = nb.defaults("tiny")
  assert not hasattr(T, "NomicBertForQuestionAnswering")
  assert mapping.task_architecture(cfg, tasks.get("qa")) is None
  assert mapping.task_architecture(cfg, tasks.get("sequence")) == (
      "NomicBertForSequenceClassification")


def _count(cfg):
  shapes = jax.eval_shape(lambda: encoders.init_params(encoders.build(cfg),
                                                       jax.random.PRNGKey(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


def test_parameter_count_matches_transformers():
  cfg = nb.defaults("base")
  hf_dict, arch = nb_hf.NomicBertMapping().config_to_hf(cfg)
  assert arch == "NomicBertForMaskedLM"
  with torch.device("meta"):
    ref = T.NomicBertForMaskedLM(T.NomicBertConfig(**hf_dict))
  assert _count(cfg) == sum(p.numel() for p in ref.parameters())  # the tied decoder once


@pytest.mark.parametrize("rope,match", [({"rope_type": "yarn", "factor": 2.0}, "yarn"),
                                        ({"rope_type": "linear"}, "factor"),
                                        ({"rope_type": "default", "partial_rotary_factor": 0.5},
                                         "partial_rotary_factor")])
def test_import_refuses_rope_it_does_not_implement(rope, match):
  hf = dict(TINY, model_type="nomic_bert", rope_parameters=rope)
  with pytest.raises(ValueError, match=match):
    nb_hf.NomicBertMapping().config_from_hf(hf, ())


def test_export_refuses_what_transformers_cannot_hold():
  cfg = nb.defaults("tiny")
  cfg.attention_bias = True
  with pytest.raises(ValueError, match="attention_bias"):
    nb_hf.NomicBertMapping().config_to_hf(cfg)


def test_flops_count_the_gated_mlp_and_head_dim():
  cfg = nb.defaults("base")
  t, d, f, layers = 512, 768, 3072, 12
  body = layers * (8 * t * d * d + 4 * t * t * d + 6 * t * d * f)
  assert nb.forward_flops(cfg, t, mlm_positions=0) == body
  cfg.head_dim = 32  # q, k, v, o and attention scale with H * K, not D
  smaller = layers * (8 * t * d * 384 + 4 * t * t * 384 + 6 * t * d * f)
  assert nb.forward_flops(cfg, t, mlm_positions=0) == smaller


def test_tiny_config_builds():
  c = nb_configs.get_config("tiny")
  assert c.is_locked and c.objective.mask_rate == 0.3 and c.data.packing == "documents"
  cfg = c.model.unlock()
  cfg.vocab_size = 99  # the trainer sizes it to the tokenizer
  model = encoders.build(cfg)
  out = jax.eval_shape(lambda: model.init_with_output(jax.random.PRNGKey(0),
                                                      jnp.ones((2, 16), jnp.int32))[0])
  assert out.mlm_logits.shape == (2, 16, 99)
  assert nb_configs.get_config("base").data.seq_len == 2048
