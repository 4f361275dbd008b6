"""GTE (v1.5, transformers' GteModel): parity with transformers in float32 on padded batches
(biases on q/k/v/o and down_proj, token types present and absent, linear RoPE scaling), the
MLM head and the sequence / token classification heads, exports that transformers loads
with no missing or unexpected keys; padded and packed rows equal to the unpadded sequences
(what GTE's unpadding guarantees); parameter counts; the shared primitives it added
(`Mlp(act_second=, out_bias=)`, `kernels.rope_positions`)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import encoders
from configs import gte as gte_configs
from encoders import gte, layers
from encoders.hf import gte as gte_hf
from encoders.hf import tasks as tasks_hf
from encoders.layers import kernels

ATOL = 1e-4
# 3 layers, MLP 37, two token types; weights drawn 10x wider than usual so attention is
# sharp and positions (rotary) matter
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=64, pad_token_id=1,
            type_vocab_size=2, initializer_range=0.2)


def tiny_hf(cls, seed=0, **overrides):
  torch.manual_seed(seed)
  cfg = T.GteConfig(**{**TINY, **overrides})
  cfg._attn_implementation = "eager"
  model = getattr(T, cls)(cfg).eval()
  with torch.no_grad():  # norms and biases away from 1/0, so their mapping is checked
    for name, p in model.named_parameters():
      if "norm" in name.lower() or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  return model


def padded_batch(batch=3, length=11, seed=0, types=True):
  rng = np.random.RandomState(seed)
  ids = rng.randint(3, 99, size=(batch, length))
  mask = np.ones_like(ids)
  for i, n in enumerate([length, length - 4, 3][:batch]):
    mask[i, n:] = 0
  ids[mask == 0] = 1
  tt = (np.arange(length)[None] >= 4).astype(np.int64) * mask * int(types)
  return ids, mask, tt


def torch_out(model, ids, mask, types):
  with torch.no_grad():
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                token_type_ids=torch.tensor(types), output_hidden_states=True)
  res = {"last_hidden_state": out.hidden_states[-1].numpy()}
  if getattr(out, "logits", None) is not None:
    res["mlm_logits"] = out.logits.numpy()
  return res


def ours(model, params, ids, mask=None, types=None, **kw):
  out = model.apply({"params": params}, jnp.asarray(ids),
                    None if mask is None else jnp.asarray(mask),
                    None if types is None else jnp.asarray(types), **kw)
  return {k: np.asarray(v) for k, v in (("last_hidden_state", out.last_hidden_state),
                                        ("mlm_logits", out.mlm_logits)) if v is not None}


def assert_parity(got, ref, mask):
  real = mask.astype(bool)
  assert set(got) == set(ref)
  for name in ref:
    np.testing.assert_allclose(got[name][real], ref[name][real], atol=ATOL, rtol=0,
                               err_msg=name)
    assert np.abs(ref[name]).max() > 0.1


@pytest.mark.parametrize("cls,over,scan", [
    ("GteForMaskedLM", {}, False),
    pytest.param("GteModel", {"type_vocab_size": 0}, False, marks=pytest.mark.slow),
    pytest.param("GteForMaskedLM", {"hidden_act": "silu"}, True, marks=pytest.mark.slow),
    pytest.param("GteModel", {"rope_parameters": {"rope_type": "linear", "factor": 2.5,
                                                  "rope_theta": 40.0}}, False,
                 marks=pytest.mark.slow)])
def test_parity_tiny_random(cls, over, scan, tmp_path):
  hf = tiny_hf(cls, seed=1, **over)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), scan_layers=scan)
  assert model.config.family == "gte" and model.config.attention_bias
  ids, mask, types = padded_batch(length=13, seed=2, types=hf.config.type_vocab_size > 1)
  assert not mask.all()
  assert_parity(ours(model, params, ids, mask, types), torch_out(hf, ids, mask, types), mask)


def test_export_loads_in_transformers_without_missing_or_unexpected_keys(tmp_path):
  hf = tiny_hf("GteForMaskedLM", seed=4)
  hf.save_pretrained(tmp_path / "src")
  model, params = encoders.from_hf(str(tmp_path / "src"))
  encoders.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = T.GteForMaskedLM.from_pretrained(
      str(tmp_path / "out"), output_loading_info=True, attn_implementation="eager")
  assert not any(info.values()), info
  ids, mask, types = padded_batch(seed=6)
  ref, got = torch_out(hf, ids, mask, types), torch_out(loaded.eval(), ids, mask, types)
  for name in ref:
    np.testing.assert_allclose(got[name], ref[name], atol=1e-6)


@pytest.mark.parametrize("task,cls", [
    ("sequence", "GteForSequenceClassification"),
    pytest.param("token", "GteForTokenClassification", marks=pytest.mark.slow)])
def test_task_heads_parity_and_export(task, cls, tmp_path):
  labels = ("a", "b", "c")
  hf = tiny_hf(cls, seed=5, id2label=dict(enumerate(labels)),
               label2id={n: i for i, n in enumerate(labels)})
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


def _random_model(**over):
  cfg = gte.defaults("tiny")
  cfg.update(vocab_size=99, pad_token_id=1, num_hidden_layers=2, attention_impl="einsum",
             dtype="float32", hidden_dropout_prob=0.0, **over)
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(1), x.shape),
                        params)
  return model, params


def test_padded_and_packed_rows_equal_the_unpadded_sequences():
  """What GTE's unpadding promises: a sequence's outputs do not depend on the padding
  after it (each padded row equals the sequence run alone, unpadded), nor on the other
  documents packed in its row (segment ids; rotary positions restart per document)."""
  model, params = _random_model()
  ids, mask, _ = padded_batch(length=12, seed=3, types=False)
  padded = ours(model, params, ids, mask)
  for i in (1, 2):  # the padded rows
    n = int(mask[i].sum())
    alone = ours(model, params, ids[i:i + 1, :n])
    for name in alone:
      np.testing.assert_allclose(padded[name][i, :n], alone[name][0], atol=1e-5, rtol=0)
  n0, n1 = int(mask[1].sum()), int(mask[2].sum())
  row = np.concatenate([ids[1, :n0], ids[2, :n1], [1, 1]])[None]
  seg = np.array([[1] * n0 + [2] * n1 + [0, 0]])
  packed = ours(model, params, row, segment_ids=jnp.asarray(seg))
  for name in padded:
    np.testing.assert_allclose(packed[name][0, :n0], padded[name][1, :n0], atol=1e-5,
                               rtol=0)
    np.testing.assert_allclose(packed[name][0, n0:n0 + n1], padded[name][2, :n1], atol=1e-5,
                               rtol=0)


def _count(cfg):
  shapes = jax.eval_shape(lambda: encoders.init_params(encoders.build(cfg),
                                                       jax.random.PRNGKey(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


@pytest.mark.parametrize("variant", ["base", pytest.param("large", marks=pytest.mark.slow),
                                     pytest.param("multilingual-base", marks=pytest.mark.slow)])
def test_parameter_count_matches_transformers(variant):
  cfg = gte.defaults(variant)
  hf_dict, arch = gte_hf.GteMapping().config_to_hf(cfg)
  assert arch == "GteForMaskedLM"
  with torch.device("meta"):
    ref = T.GteForMaskedLM(T.GteConfig(**hf_dict))
  assert _count(cfg) == sum(p.numel() for p in ref.parameters())  # the tied decoder once


def test_mlp_act_second_and_out_bias():
  """The shared Mlp's [up | gate] layout and a bias on W_out alone, against the formula."""
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 8))
  mlp = layers.Mlp(6, 8, "gelu", gated=True, use_bias=False, out_bias=True, act_second=True)
  p = mlp.init(jax.random.PRNGKey(1), x)["params"]
  p = jax.tree.map(lambda v: v + 0.1, nn.unbox(p))
  assert set(p["wi"]) == {"kernel"} and set(p["wo"]) == {"kernel", "bias"}
  up, gate = jnp.split(x @ p["wi"]["kernel"], 2, axis=-1)
  want = (layers.gelu_erf(gate) * up) @ p["wo"]["kernel"] + p["wo"]["bias"]
  np.testing.assert_allclose(mlp.apply({"params": p}, x), want, atol=1e-5)
  first = layers.Mlp(6, 8, "gelu", gated=True, use_bias=False, out_bias=True)
  assert np.abs(first.apply({"params": p}, x) - want).max() > 1e-3  # the order matters


def test_rope_positions_is_linear_position_interpolation():
  pos = jnp.arange(10)[None]
  assert kernels.rope_positions(pos) is pos
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 10, 2, 8))
  scaled = kernels.rotary(x, kernels.rope_positions(pos, 4.0), 100.0)
  # position 4 under factor 4 rotates as position 1 unscaled
  np.testing.assert_allclose(scaled[0, 4], kernels.rotary(x[:, 4:5], jnp.ones((1, 1)),
                                                          100.0)[0, 0], atol=1e-6)
  with pytest.raises(ValueError, match="factor"):
    kernels.rope_positions(pos, 0.0)


def test_tiny_config_builds():
  c = gte_configs.get_config("tiny")
  assert c.is_locked and c.objective.mask_rate == 0.3 and c.data.packing == "documents"
  cfg = c.model.unlock()
  cfg.vocab_size = 99  # the trainer sizes it to the tokenizer
  model = encoders.build(cfg)
  out = jax.eval_shape(lambda: model.init_with_output(jax.random.PRNGKey(0),
                                                      jnp.ones((2, 16), jnp.int32))[0])
  assert out.mlm_logits.shape == (2, 16, 99)
  assert gte_configs.get_config("large").model.num_hidden_layers == 24
