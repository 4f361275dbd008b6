"""MPNet: parity with transformers in float32 on padded batches (base model, MLM head, the
three task heads) for odd shapes (3 heads, MLP width 37, a bias table wider than the 32
buckets, rows longer than the 128 the buckets tell apart), scanned and not; export that
transformers loads with no missing or unexpected keys; a sentence-transformers directory
(MPNetModel weights under an MPNetForMaskedLM config); the bias shared by all layers;
packed rows; the attention paths with the bias; parameter count, FLOPs, configs."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import encoders
from configs import mpnet as mpnet_configs
from encoders import base, bert, layers, mpnet, tasks
from encoders.hf import mpnet as mpnet_hf
from encoders.hf import tasks as tasks_hf

ATOL = 1e-4
TINY = dict(vocab_size=99, hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
            intermediate_size=37, relative_attention_num_buckets=40,
            max_position_embeddings=200, layer_norm_eps=1e-5)
LONG = 150  # > MAX_DISTANCE: offsets past 128 share the last buckets


def tiny_hf(cls, seed=0, **overrides):
  torch.manual_seed(seed)
  model = cls(T.MPNetConfig(**{**TINY, **overrides})).eval()
  with torch.no_grad():  # biases and norms start at 0/1, the bias table near 0
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
        p.add_(0.1 * torch.randn_like(p))
    getattr(model, "mpnet", model).encoder.relative_attention_bias.weight.normal_(0.0, 1.0)
  return model


def padded_batch(length=LONG, seed=0, lengths=None):
  rng = np.random.RandomState(seed)
  ids = rng.randint(3, TINY["vocab_size"], size=(3, length))
  mask = np.ones_like(ids)
  for i, n in enumerate(lengths or [length, length - 9, 5]):
    mask[i, n:] = 0
  ids[mask == 0] = mpnet.PADDING_IDX
  return ids, mask


def torch_out(model, ids, mask):
  with torch.no_grad():
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask), output_hidden_states=True)
  res = {"last_hidden_state": out.hidden_states[-1].numpy()}
  if getattr(out, "logits", None) is not None:
    res["mlm_logits"] = out.logits.numpy()
  if getattr(out, "pooler_output", None) is not None:
    res["pooler_output"] = out.pooler_output.numpy()
  return res


def assert_close(got, want, mask, atol=ATOL):
  real = mask.astype(bool)
  got, want = np.asarray(got), np.asarray(want)
  if want.ndim == 2:  # pooled (B,D): every row
    np.testing.assert_allclose(got, want, atol=atol, rtol=0)
  else:
    np.testing.assert_allclose(got[real], want[real], atol=atol, rtol=0)
  assert np.abs(want).max() > 1e-2  # not vacuous


@pytest.mark.parametrize("cls,scan", [(T.MPNetModel, False), (T.MPNetForMaskedLM, True)])
def test_parity_tiny_random(cls, scan, tmp_path):
  hf = tiny_hf(cls, seed=1)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path), scan_layers=scan)
  assert params["position_bias"]["embedding"].shape == (40, 3)
  ids, mask = padded_batch(seed=2)
  out = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  ref = torch_out(hf, ids, mask)
  for name, want in ref.items():
    assert_close(getattr(out, name), want, mask)
  assert set(ref) == ({"last_hidden_state", "pooler_output"} if cls is T.MPNetModel
                      else {"last_hidden_state", "mlm_logits"})


def test_the_shared_bias_is_what_parity_checks(tmp_path):
  """Zeroing the bias table, or moving only the buckets of the longest offsets, moves the
  output past ten times the tolerance: the parity above checks the bias, also past 128."""
  hf = tiny_hf(T.MPNetModel, seed=1)
  hf.save_pretrained(tmp_path)
  model, params = encoders.from_hf(str(tmp_path))
  ids, mask = padded_batch(seed=2)
  ref = torch_out(hf, ids, mask)["last_hidden_state"]
  zero = jax.tree.map(lambda x: x, params)
  zero["position_bias"]["embedding"] = jnp.zeros_like(params["position_bias"]["embedding"])
  apply = jax.jit(model.apply)
  out = apply({"params": zero}, jnp.asarray(ids), jnp.asarray(mask))
  assert np.abs(np.asarray(out.last_hidden_state)[0] - ref[0]).max() > 10 * ATOL
  far = np.asarray(params["position_bias"]["embedding"]).copy()
  far[[15, 31]] += 5.0  # the last bucket of each direction: offsets >= 128 (and 46..127)
  tweaked = dict(params, position_bias={"embedding": jnp.asarray(far)})
  out = apply({"params": tweaked}, jnp.asarray(ids), jnp.asarray(mask))
  assert np.abs(np.asarray(out.last_hidden_state)[0] - ref[0]).max() > 10 * ATOL


@pytest.mark.parametrize("task", ["sequence", "token", "qa"])
def test_task_heads_parity_odd_shapes(task, tmp_path):
  auto = {"sequence": T.MPNetForSequenceClassification,
          "token": T.MPNetForTokenClassification, "qa": T.MPNetForQuestionAnswering}[task]
  hf = tiny_hf(auto, seed=3, **({} if task == "qa" else {"num_labels": 5}))
  hf.save_pretrained(tmp_path)
  model, params = tasks_hf.from_hf(str(tmp_path))
  assert model.task == task
  ids, mask = padded_batch(seed=4)
  out = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  with torch.no_grad():
    ref = hf(torch.tensor(ids), attention_mask=torch.tensor(mask))
  if task == "qa":
    assert_close(out.start_logits, ref.start_logits.numpy(), mask)
    assert_close(out.end_logits, ref.end_logits.numpy(), mask)
  else:
    assert_close(out.logits, ref.logits.numpy(), mask)


@pytest.mark.parametrize("cls", [T.MPNetModel, T.MPNetForMaskedLM])
def test_export_loads_in_transformers_without_missing_or_unexpected_keys(cls, tmp_path):
  hf = tiny_hf(cls, seed=4)
  hf.save_pretrained(tmp_path / "src")
  model, params = encoders.from_hf(str(tmp_path / "src"), scan_layers=True)
  encoders.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = cls.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert type(loaded) is cls
  ids, mask = padded_batch(length=20, seed=6)
  ref, got = torch_out(hf, ids, mask), torch_out(loaded.eval(), ids, mask)
  for name in ref:
    np.testing.assert_allclose(got[name], ref[name], atol=1e-6)


def test_sentence_transformers_directory_loads(tmp_path):
  """all-mpnet-base-v2's layout: MPNetModel weights (with the pooler, no `mpnet.` prefix)
  under the config.json of microsoft/mpnet-base (architectures: MPNetForMaskedLM). Loaded
  as the base model, as sentence-transformers does; the MLM head it lacks is named."""
  hf = tiny_hf(T.MPNetModel, seed=5)
  hf.save_pretrained(tmp_path)
  hf_cfg = encoders.hf_config(str(tmp_path))
  hf_cfg["architectures"] = ["MPNetForMaskedLM"]
  (tmp_path / "config.json").write_text(json.dumps(hf_cfg))
  model, params = encoders.from_hf(str(tmp_path), heads=("pooler",))
  ids, mask = padded_batch(length=20, seed=7)
  out = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  ref = torch_out(hf, ids, mask)
  assert_close(out.last_hidden_state, ref["last_hidden_state"], mask)
  assert_close(out.pooler_output, ref["pooler_output"], mask)
  emb = tasks.mean_pool(out.last_hidden_state, jnp.asarray(mask))
  emb = emb / jnp.linalg.norm(emb, axis=-1, keepdims=True)
  want = (ref["last_hidden_state"] * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  want /= np.linalg.norm(want, axis=-1, keepdims=True)
  np.testing.assert_allclose(np.asarray(emb), want, atol=1e-5)
  with pytest.raises(ValueError, match="lm_head"):
    encoders.from_hf(str(tmp_path))


def _random_model(impl="einsum", **over):
  cfg = mpnet.defaults("tiny")
  cfg.update(vocab_size=99, max_position_embeddings=40, attention_impl=impl,
             dtype="float32", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
             **over)
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(1), x.shape),
                        params)
  params["position_bias"]["embedding"] = jax.random.normal(jax.random.PRNGKey(2), (32, 2))
  return model, params


@pytest.mark.slow  # the task-head tests pack MPNet rows in the default suite
def test_packed_rows_equal_documents_run_alone():
  """Two documents in one row (then padding): each gives what it gives alone. Positions
  restart at 2 per document, and the bias depends on offsets only."""
  model, params = _random_model()
  rng = np.random.RandomState(0)
  a, b = rng.randint(3, 99, size=9), rng.randint(3, 99, size=6)
  row = np.concatenate([a, b, np.zeros(3, int)])[None]
  seg = np.array([[1] * 9 + [2] * 6 + [0] * 3])
  apply = jax.jit(model.apply)
  packed = apply({"params": params}, jnp.asarray(row), segment_ids=jnp.asarray(seg))
  for doc, sl in ((a, slice(0, 9)), (b, slice(9, 15))):
    alone = apply({"params": params}, jnp.asarray(doc[None]))
    np.testing.assert_allclose(np.asarray(packed.mlm_logits)[0, sl],
                               np.asarray(alone.mlm_logits)[0], atol=1e-5, rtol=0)


@pytest.mark.slow  # the kernels with a bias: tests/encoders/test_position_bias.py
@pytest.mark.parametrize("impl", ["cpu", "xla"])
def test_attention_paths_add_the_bias_as_the_reference(impl):
  model, params = _random_model("einsum")
  fast, _ = _random_model(impl)
  ids, mask = padded_batch(length=13, seed=3, lengths=[13, 9, 4])
  ids = np.where(mask > 0, ids % 99, 1)
  ref = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  got = jax.jit(fast.apply)({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(got.last_hidden_state)[real],
                             np.asarray(ref.last_hidden_state)[real], atol=1e-5)


@pytest.mark.slow  # the table's own gradient: tests/encoders/test_position_bias.py
def test_the_bias_table_is_trained():
  """The gradient reaches the shared table (through every layer), in the bucket rows the
  offsets of a 13-token row use."""
  model, params = _random_model("cpu")
  ids = jnp.asarray(np.arange(3, 16)[None])

  def loss(p):
    return jnp.sum(model.apply({"params": p}, ids).last_hidden_state ** 2)
  grad = jax.jit(jax.grad(loss))(params)["position_bias"]["embedding"]
  used = np.unique(np.asarray(layers.relative_position_bucket(
      np.arange(13)[None] - np.arange(13)[:, None])))
  g = np.abs(np.asarray(grad)).sum(1)
  assert (g[used] > 0).all() and (g[np.setdiff1d(np.arange(32), used)] == 0).all()


def test_auto_never_picks_splash_for_the_bias():
  cfg = mpnet.defaults("base")
  cfg.attention_probs_dropout_prob = 0.0
  line = base.resolve_attention(cfg, "tpu", 512)
  assert cfg.attention_impl == "xla" and "bias" in line
  cfg = mpnet.defaults("base")
  base.resolve_attention(cfg, "gpu", 512)
  assert cfg.attention_impl == "cudnn"  # cuDNN adds a bias
  # any family: a bias seen at call time keeps "auto" off Splash
  assert layers.attention.choose_impl("tpu", 512, score_bias=True)[0] == "xla"
  assert layers.attention.choose_impl("tpu", 512)[0] == "splash"


def test_config_errors_are_named():
  cfg = mpnet.defaults("tiny")
  cfg.relative_attention_num_buckets = 8
  with pytest.raises(ValueError, match="relative_attention_num_buckets"):
    encoders.init_params(encoders.build(cfg), jax.random.PRNGKey(0))
  hf = dict(TINY, model_type="mpnet", relative_attention_num_buckets=16)
  with pytest.raises(ValueError, match="relative_attention_num_buckets"):
    mpnet_hf.MPNetMapping().config_from_hf(hf, ())
  cfg = mpnet.defaults("tiny")
  cfg.max_position_embeddings = 40
  with pytest.raises(ValueError, match="maximum of 38"):  # 2 positions before the first
    encoders.build(cfg).apply({"params": {}}, jnp.ones((1, 39), jnp.int32))


def test_parameter_count_matches_transformers():
  cfg = mpnet.defaults("base")
  cfg.heads = ("pooler",)
  hf_dict, arch = mpnet_hf.MPNetMapping().config_to_hf(cfg)
  assert arch == "MPNetModel"
  with torch.device("meta"):
    ref = T.MPNetModel(T.MPNetConfig(**hf_dict))
  shapes = jax.eval_shape(lambda: encoders.init_params(encoders.build(cfg),
                                                       jax.random.PRNGKey(0)))
  ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  assert ours == sum(p.numel() for p in ref.parameters())
  assert abs(ours / 1e6 - 109.5) < 0.1


def test_flops_add_the_bias_to_every_layer():
  cfg = mpnet.defaults("base")
  t = 512
  bert_like = bert.forward_flops(cfg, t)
  assert mpnet.forward_flops(cfg, t) - bert_like == 12 * 12 * t * t
  assert encoders.forward_flops(cfg, t) == mpnet.forward_flops(cfg, t)


def test_tiny_config_builds():
  c = mpnet_configs.get_config("tiny")
  assert c.is_locked and c.model.family == "mpnet" and c.objective.name == "mlm"
  cfg = c.model.unlock()
  cfg.vocab_size, cfg.pad_token_id = 99, 0  # the trainer sizes them to the tokenizer
  model = encoders.build(cfg)
  out, _ = jax.eval_shape(lambda: model.init_with_output(jax.random.PRNGKey(0),
                                                         jnp.ones((2, 16), jnp.int32)))
  assert out.mlm_logits.shape == (2, 16, 99)
  assert mpnet_configs.get_config("base").model.num_hidden_layers == 12
