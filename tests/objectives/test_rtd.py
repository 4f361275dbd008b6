"""Replaced-token detection on two backbones (ELECTRA and BERT): labels (a sample equal to
the original is "original"), sampling inside the step without gradient, the loss
normalised over real tokens, the three embedding-sharing modes (GDES: the discriminator's
loss never reaches the shared table), metrics, FLOPs, export that transformers loads."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import objectives
from configs import bert as bert_configs
from configs import electra as electra_configs
from launch.perf import synthetic
from objectives import losses, rtd

WORD = ("embeddings", "word_embeddings", "embedding")


def _config(family="electra", sharing="tied", width=0.5, depth=1.0, **objective):
  if family == "electra":
    c = electra_configs.get_config("tiny").unlock()
    c.model.embedding_size = 48  # E != H: the generator and discriminator both project
  else:
    c = bert_configs.get_config("tiny").unlock()
    c.model.heads = ("rtd",)
    electra_configs.rtd_objective(c)
  c.model.num_hidden_layers, c.model.vocab_size = 2, 300
  c.model.hidden_size, c.model.num_attention_heads, c.model.intermediate_size = 64, 2, 128
  c.data.seq_len = 32
  c.objective.sharing = sharing
  c.objective.generator_width = width
  c.objective.generator_depth = depth
  for k, v in objective.items():
    c.objective[k] = v
  return c


def _objective(c):
  return objectives.get_objective(c, synthetic.SyntheticTokenizer.for_model(c.model))


def _setup(c, seed=0):
  obj = _objective(c)
  import flax.linen as nn
  params = nn.unbox(obj.init(jax.random.PRNGKey(seed)))
  batch = synthetic.full_batch(obj, 4, c.data.seq_len, seed=seed)
  batch["segment_ids"][0, -7:] = 0  # padding at the end of one row
  batch["special_tokens_mask"][0, -7:] = True
  batch["input_ids"][0, -7:] = 0
  return obj, params, {k: jnp.asarray(v) for k, v in batch.items()}


def test_generator_is_a_fraction_of_the_discriminator():
  c = _config(width=0.25, depth=0.5)
  g = rtd.generator_config(c.model, c.objective)
  assert (g.hidden_size, g.num_attention_heads, g.intermediate_size, g.num_hidden_layers) == (
      16, 1, 32, 1)
  assert g.embedding_size == 48 and g.heads == ("mlm",) and g.family == "electra"
  c.objective.generator_width = 1.5
  with pytest.raises(ValueError, match="generator_width"):
    rtd.generator_config(c.model, c.objective)


def test_generator_of_a_grouped_query_discriminator():
  # K/V heads scale with the query heads; a model section naming as many K/V heads as
  # heads (plain attention, as the docs' small AOT commands do) stays buildable
  c = _config(width=0.25, depth=0.5)
  c.model.num_attention_heads, c.model.num_key_value_heads = 8, 4
  c.model.hidden_size, c.model.intermediate_size = 128, 256
  g = rtd.generator_config(c.model, c.objective)
  assert (g.num_attention_heads, g.num_key_value_heads, g.hidden_size) == (2, 1, 32)
  c.model.num_attention_heads, c.model.num_key_value_heads = 2, 2
  c.model.hidden_size = 64
  g = rtd.generator_config(c.model, c.objective)
  assert (g.num_attention_heads, g.num_key_value_heads) == (1, 1)
  c.model.num_attention_heads, c.model.num_key_value_heads = 12, 4
  c.model.hidden_size = 96
  c.objective.generator_width = 0.5  # 6 heads over 2 K/V heads: fine
  assert rtd.generator_config(c.model, c.objective).num_key_value_heads == 2
  c.objective.generator_width = 1 / 3  # 4 heads over 1 K/V head: fine
  assert rtd.generator_config(c.model, c.objective).num_key_value_heads == 1
  c.model.num_attention_heads, c.model.num_key_value_heads = 10, 5
  c.model.hidden_size = 100
  c.objective.generator_width = 0.6  # 6 heads over 3 K/V heads
  assert rtd.generator_config(c.model, c.objective).num_key_value_heads == 3
  c.model.num_key_value_heads = 2
  c.objective.generator_width = 0.7  # 7 heads over round(1.4) = 1: fine
  assert rtd.generator_config(c.model, c.objective).num_key_value_heads == 1
  c.objective.generator_width = 0.9  # 9 heads over round(1.8) = 2: refused
  c.model.hidden_size = 90
  with pytest.raises(ValueError, match="key/value heads"):
    rtd.generator_config(c.model, c.objective)


def test_bad_settings_are_refused():
  for key, value, match in (("sharing", "both", "sharing"), ("temperature", 0.0, "temperature"),
                            ("disc_weight", -1.0, "disc_weight"),
                            ("rtd_positions", "some", "rtd_positions")):
    with pytest.raises(ValueError, match=match):
      _objective(_config(**{key: value}))
  # BERT's embedding width is its hidden size: a narrower generator cannot share tables.
  with pytest.raises(ValueError, match="generator_width=1"):
    _objective(_config("bert", "gdes", width=0.5))
  c = _config()
  c.model.heads = ("mlm", "rtd")
  with pytest.raises(ValueError, match="does not train"):
    _objective(c)


def test_a_sample_equal_to_the_original_counts_as_original():
  obj, params, batch = _setup(_config())
  b = jax.jit(obj.transform)(batch, jax.random.PRNGKey(1))
  pos, w = np.asarray(b["masked_positions"]), np.asarray(b["mlm_weights"]) > 0
  assert w.sum() > 0 and (~w).sum() > 0  # real entries and padding entries (at position 0)
  orig = np.asarray(b["original_ids"])
  labels = np.take_along_axis(orig, pos, axis=1)
  # Logits certain of the original token: nothing is replaced.
  onehot = jax.nn.one_hot(labels, 300) * 1e4
  same = obj.corrupt(jax.random.PRNGKey(2), onehot, b)
  np.testing.assert_array_equal(np.asarray(same), orig)
  # Certain of another token: exactly the real masked positions change (not position 0
  # of the padding entries).
  other = (labels + 1) % 300
  diff = np.asarray(obj.corrupt(jax.random.PRNGKey(2), jax.nn.one_hot(other, 300) * 1e4, b))
  changed = diff != orig
  want = np.zeros_like(changed)
  rows = np.nonzero(w)[0]
  want[rows, pos[w]] = True
  np.testing.assert_array_equal(changed, want)
  np.testing.assert_array_equal(diff[rows, pos[w]], other[w])


def test_corrupt_writes_the_samples_back_without_a_scatter():
  """On TPU v5p XLA offloads a large int32 scatter to the SparseCore, which its cost model
  cannot price: ELECTRA-base's step at global batch 256 had no step-time estimate. The
  samples go back to their positions by a comparison instead."""
  obj, _, batch = _setup(_config())
  b = jax.jit(obj.transform)(batch, jax.random.PRNGKey(1))
  logits = jnp.zeros(b["masked_positions"].shape + (300,), jnp.float32)
  jaxpr = str(jax.make_jaxpr(obj.corrupt)(jax.random.PRNGKey(2), logits, b))
  assert "scatter" not in jaxpr


def test_loss_is_mlm_plus_weighted_bce_over_real_tokens():
  c = _config(disc_weight=50.0)
  obj, params, batch = _setup(c)
  b = jax.jit(obj.transform)(batch, jax.random.PRNGKey(3))
  terms, sums = jax.jit(lambda p, b: obj.loss(p, b, jax.random.PRNGKey(4), False))(params, b)
  norms = obj.normalizers(b)
  real = float((np.asarray(batch["segment_ids"]) > 0).sum())
  assert float(norms["rtd"]) == real == sums["rtd_weight_sum"] < batch["input_ids"].size
  assert float(norms["mlm"]) == float(sums["mlm_weight_sum"]) > 0
  total = float(obj.combine(terms, norms))
  want = float(sums["mlm_loss_sum"]) / float(norms["mlm"]) + 50 * float(terms["rtd"]) / real
  np.testing.assert_allclose(total, want, rtol=1e-6)
  m = losses.finalize_metrics({k: float(v) for k, v in sums.items()})
  # At init some masked tokens are replaced, and accuracy is measured on real tokens.
  assert 0 < m["rtd_fraction_replaced"] <= 0.2
  np.testing.assert_allclose(m["rtd_all_original_accuracy"], 1 - m["rtd_fraction_replaced"])
  assert m["rtd_replaced_count"] == round(m["rtd_fraction_replaced"] * real)
  # The "ELECTRA 15%" ablation counts the masked positions only.
  obj15, _, _ = _setup(_config(rtd_positions="masked"))
  assert float(obj15.normalizers(b)["rtd"]) == float(norms["mlm"])


def test_rtd_metrics_on_a_known_example():
  logits = jnp.array([[2.0, -1.0, 3.0, -2.0, 5.0, 1.0]])
  replaced = jnp.array([[True, True, False, False, True, False]])
  weights = jnp.array([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])  # the last token is padding
  _, sums = rtd.rtd_loss_and_metrics(logits, replaced, weights)
  m = losses.finalize_metrics({k: float(v) for k, v in sums.items()})
  # flagged: 0, 2, 4; replaced: 0, 1, 4 -> TP 2, precision 2/3, recall 2/3, acc 3/5
  np.testing.assert_allclose(m["rtd_flagged_accuracy"], 2 / 3)
  np.testing.assert_allclose(m["rtd_replaced_accuracy"], 2 / 3)
  np.testing.assert_allclose(m["rtd_accuracy"], 3 / 5)
  np.testing.assert_allclose(m["rtd_all_original_accuracy"], 2 / 5)
  np.testing.assert_allclose(m["rtd_original_accuracy"], 1 / 2)
  assert m["rtd_count"] == 5
  s = np.array([2.0, -1.0, 3.0, -2.0, 5.0])
  assert rtd.roc_auc(s, np.array([1, 1, 0, 0, 1], bool)) == pytest.approx(4 / 6)


def _grads(obj, params, b, term):
  def f(p):
    terms, _ = obj.loss(p, b, jax.random.PRNGKey(5), True)
    return terms[term]
  return jax.jit(jax.grad(f))(params)


@pytest.mark.parametrize("family", [pytest.param("electra", marks=pytest.mark.slow), "bert"])
def test_sharing_modes_route_gradients(family):
  width = 0.5 if family == "electra" else 1.0  # BERT shares only at full width
  depth = 1.0 if family == "electra" else 0.5  # DeBERTaV3's generator: half depth
  for sharing in ("tied", "gdes", "none"):
    obj, params, batch = _setup(_config(family, sharing, width=width, depth=depth))
    b = jax.jit(obj.transform)(batch, jax.random.PRNGKey(3))
    disc_table = params["discriminator"]["embeddings"].get("word_embeddings")
    g_rtd = _grads(obj, params, b, "rtd")
    g_mlm = _grads(obj, params, b, "mlm")
    gen_from_rtd = np.abs(np.asarray(g_rtd["generator"]["embeddings"]["word_embeddings"]
                                     ["embedding"])).max()
    gen_from_mlm = np.abs(np.asarray(g_mlm["generator"]["embeddings"]["word_embeddings"]
                                     ["embedding"])).max()
    assert gen_from_mlm > 0
    # No gradient flows from the discriminator through the sampling into the generator's
    # layers.
    assert all(np.abs(np.asarray(x)).max() == 0
               for x in jax.tree.leaves(g_rtd["generator"]["encoder"]))
    if sharing == "tied":
      assert disc_table is None  # the discriminator has no table of its own
      assert gen_from_rtd > 0
    else:
      assert gen_from_rtd == 0
      delta = np.asarray(g_rtd["discriminator"]["embeddings"]["word_embeddings"]["embedding"])
      assert np.abs(delta).max() > 0
      if sharing == "gdes":
        assert np.abs(np.asarray(disc_table["embedding"])).max() == 0  # delta starts at 0
        _, full = obj.model_params(params)
        np.testing.assert_array_equal(
            np.asarray(full["embeddings"]["word_embeddings"]["embedding"]),
            np.asarray(params["generator"]["embeddings"]["word_embeddings"]["embedding"]))


def test_flops_count_both_networks():
  obj, _, _ = _setup(_config())
  f = obj.flops_per_example(32)
  gen, disc = obj.module_flops("generator", 32), obj.module_flops("discriminator", 32)
  assert f == 3 * (gen + disc) and 0 < gen < disc
  # an inference forward scores with the discriminator alone: the generator is not run
  assert obj.flops_per_example(32, train=False) == disc
  import encoders
  assert disc == encoders.forward_flops(obj.model_config, 32)  # ELECTRA counts its rtd head


@pytest.mark.parametrize("family,sharing", [("electra", "gdes"), ("bert", "tied")])
def test_export_loads_in_transformers(family, sharing, tmp_path):
  width = 0.5 if family == "electra" else 1.0
  obj, params, batch = _setup(_config(family, sharing, width=width, depth=0.5))
  # Make the GDES delta non-zero, so folding it in is checked.
  if sharing == "gdes":
    t = params["discriminator"]["embeddings"]["word_embeddings"]["embedding"]
    params["discriminator"]["embeddings"]["word_embeddings"]["embedding"] = t + 0.05
  path = str(tmp_path / "hf")
  obj.export(params, path)
  ours = obj.forward(params, batch)
  real = np.asarray(batch["segment_ids"]) > 0
  ids = torch.tensor(np.asarray(batch["input_ids"]), dtype=torch.long)
  kw = dict(attention_mask=torch.tensor(real.astype(np.int64)),
            token_type_ids=torch.tensor(np.asarray(batch["token_type_ids"]), dtype=torch.long),
            output_hidden_states=True)
  if family == "electra":
    disc, info = T.ElectraForPreTraining.from_pretrained(path, output_loading_info=True)
    gen, ginfo = T.ElectraForMaskedLM.from_pretrained(path + "/generator",
                                                      output_loading_info=True)
    assert not ginfo["missing_keys"] and not ginfo["unexpected_keys"], ginfo
  else:
    disc, info = T.BertModel.from_pretrained(path, add_pooling_layer=False,
                                             output_loading_info=True)
    gen, ginfo = T.BertForMaskedLM.from_pretrained(path + "/generator",
                                                   output_loading_info=True)
    assert not ginfo["missing_keys"] and not ginfo["unexpected_keys"], ginfo
    from safetensors.numpy import load_file
    head = load_file(path + "/rtd_head.safetensors")
    assert sorted(head) == ["dense/bias", "dense/kernel", "prediction/bias",
                            "prediction/kernel"]
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  with torch.no_grad():
    out = disc.eval()(ids, **kw)
  np.testing.assert_allclose(out.hidden_states[-1].numpy()[real],
                             np.asarray(ours.last_hidden_state)[real], atol=1e-4)
  if family == "electra":
    np.testing.assert_allclose(out.logits.numpy()[real], np.asarray(ours.rtd_logits)[real],
                               atol=1e-4)


def test_electra_configs_and_ablations_load():
  from configs.ablations import electra as ablations
  import encoders
  for variant in electra_configs.VARIANTS:
    c = electra_configs.get_config(variant)
    assert c.objective.name == "rtd" and c.model.heads == ("rtd",)
    assert c.objective.disc_weight == 50.0
  widths = set()
  for setting in ablations.SETTINGS:
    c = ablations.get_config(f"tiny,setting={setting}")
    g = rtd.generator_config(c.model, c.objective)
    widths.add(g.hidden_size)
    jax.eval_shape(lambda: encoders.init_params(encoders.build(g), jax.random.PRNGKey(0)))
  assert widths == {16, 32, 64, 128}
  assert ablations.get_config("tiny,setting=electra_15").objective.rtd_positions == "masked"
  assert ablations.get_config("tiny,setting=share_gdes").objective.sharing == "gdes"
  with pytest.raises(ValueError, match="setting"):
    ablations.get_config("tiny,setting=all_mlm")


def test_torch_reference_does_the_same_work(tmp_path):
  """launch.bench --compare-hf's transformers side: generator MLM + sampling + weighted
  discriminator BCE with tied embeddings, and the discriminator's forward."""
  obj, params, batch = _setup(_config())
  obj.export(params, str(tmp_path / "hf"))
  ref = obj.reference_model(str(tmp_path / "hf"))
  host = {k: np.asarray(v) for k, v in batch.items()}
  x = {k: torch.from_numpy(v) for k, v in obj.reference_inputs(host, True, 0).items()}
  assert (x["labels"] >= 0).any()
  loss = ref.train()(**x).loss
  loss.backward()
  emb = ref.generator.electra.embeddings.word_embeddings
  assert ref.discriminator.electra.embeddings.word_embeddings is emb  # tied
  assert torch.isfinite(loss) and emb.weight.grad.abs().max() > 0
  x = {k: torch.from_numpy(v) for k, v in obj.reference_inputs(host, False).items()}
  with torch.no_grad():
    out = ref.eval()(**x, output_hidden_states=True)
  assert obj.reference_diff(obj.forward(params, batch), out, host) < 1e-4
