"""The distillation objective in isolation: each loss term against a numpy recomputation,
the refusals (vocabulary, widths, settings), the student's init from teacher layers, and
FLOPs that count the teacher's forward."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import objectives
from configs import distilbert as distil_configs
from launch.perf import synthetic
from objectives import distill


def small(student_layers=2, teacher_layers=4, width=32, teacher_width=32, vocab=300, **obj):
  c = distil_configs.get_config("tiny").unlock()
  for m, n, d in ((c.model, student_layers, width),
                  (c.objective.teacher_model, teacher_layers, teacher_width)):
    m.update(num_hidden_layers=n, hidden_size=d, num_attention_heads=2,
             intermediate_size=2 * d, vocab_size=vocab, dtype="float32")
  c.model.hidden_dropout_prob = c.model.attention_probs_dropout_prob = 0.0
  c.data.seq_len, c.data.global_batch = 16, 4
  c.objective.update(obj)
  return c


def build(c):
  return objectives.get_objective(c, synthetic.SyntheticTokenizer.for_model(c.model))


def _params(obj, seed=0):
  import flax.linen as nn
  return nn.unbox(obj.init(jax.random.PRNGKey(seed)))


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.mark.parametrize("ce_positions", [pytest.param("all", marks=pytest.mark.slow), "masked"])
def test_loss_terms_match_a_numpy_recomputation(ce_positions):
  c = small(ce_positions=ce_positions, temperature=3.0)
  obj = build(c)
  params = _params(obj)
  batch = obj.batch_spec().synthesize([[16], [9, 5], [7], []], 16, seed=0)
  # Jitted, as the trainer runs them (op by op, each call compiles hundreds of programs).
  batch = jax.jit(obj.transform)(jax.tree.map(jnp.asarray, batch), jax.random.PRNGKey(1))
  terms, m = jax.jit(lambda p, b: obj.loss(p, b, None, False))(params, batch)
  norms = obj.normalizers(batch)

  def run(module, p):
    return module.apply({"params": p}, batch["input_ids"],
                        attention_mask=(batch["segment_ids"] > 0).astype(jnp.int32),
                        token_type_ids=batch["token_type_ids"]
                        if module.config.type_vocab_size else None,
                        segment_ids=batch["segment_ids"])
  s = jax.jit(lambda p: run(obj.model, p))(params["encoder"])
  t = jax.jit(lambda p: run(obj.teacher, p))(params["teacher"])
  zs, zt = np.asarray(s.mlm_logits, np.float64), np.asarray(t.mlm_logits, np.float64)
  hs, ht = np.asarray(s.last_hidden_state, np.float64), np.asarray(t.last_hidden_state,
                                                                     np.float64)
  pos = np.asarray(batch["masked_positions"])
  w_mask = np.asarray(batch["mlm_weights"]) > 0
  real = np.asarray(batch["segment_ids"]) > 0
  gather = lambda x: np.take_along_axis(x, pos[..., None], 1) if x.ndim == 3 else \
      np.take_along_axis(x, pos, 1)
  if ce_positions == "all":
    sel_s, sel_t, sel_hs, sel_ht, w = zs, zt, hs, ht, real
  else:
    sel_s, sel_t, sel_hs, sel_ht, w = (gather(zs), gather(zt), gather(hs), gather(ht),
                                       w_mask)
  lps, lpt = _log_softmax(sel_s / 3.0), _log_softmax(sel_t / 3.0)
  kl = (np.exp(lpt) * (lpt - lps)).sum(-1) * 9.0
  # (float32 KL of near-equal distributions: a small difference of logs)
  np.testing.assert_allclose(float(terms["kd"]), kl[w].sum(), rtol=1e-3)
  np.testing.assert_allclose(float(terms["mse"]), ((sel_s - sel_t) ** 2).sum(-1)[w].sum(),
                             rtol=1e-4)
  cos = (sel_hs * sel_ht).sum(-1) / np.linalg.norm(sel_hs, axis=-1) / np.linalg.norm(
      sel_ht, axis=-1)
  np.testing.assert_allclose(float(terms["cos"]), (1 - cos)[w].sum(), rtol=1e-4)
  labels = np.asarray(batch["mlm_labels"])
  ce = -np.take_along_axis(_log_softmax(gather(zs)), labels[..., None], -1)[..., 0]
  np.testing.assert_allclose(float(terms["mlm"]), ce[w_mask].sum(), rtol=1e-4)
  agree = gather(zs).argmax(-1) == gather(zt).argmax(-1)
  assert float(m["agreement_top1_sum"]) == agree[w_mask].sum()
  assert float(norms["kd"]) == w.sum() and float(norms["mlm"]) == w_mask.sum()
  assert 0 < w_mask.sum() < real.sum()
  # DistilBERT's default weights, combined over the global normalizers
  total = obj.combine(terms, norms)
  want = sum(a * float(terms[k]) / float(norms[k]) for k, a in
             (("kd", 5.0), ("mlm", 2.0), ("cos", 1.0), ("mse", 0.0)))
  np.testing.assert_allclose(float(total), want, rtol=1e-5)


def test_a_vocabulary_mismatch_is_a_clear_error():
  c = small()
  c.objective.teacher_model.vocab_size = 301
  with pytest.raises(ValueError, match=r"teacher's vocabulary \(301 tokens\) differs from "
                                       r"the student's \(300\)"):
    build(c)


def test_refusals():
  with pytest.raises(ValueError, match="alpha_cos > 0 needs"):
    build(small(width=16))
  build(small(width=16, alpha_cos=0.0))  # a narrower student without the cosine term
  with pytest.raises(ValueError, match="temperature must be > 0"):
    build(small(temperature=0.0))
  with pytest.raises(ValueError, match="not all 0"):
    build(small(alpha_ce=0.0, alpha_mlm=0.0, alpha_cos=0.0))
  with pytest.raises(ValueError, match="ce_positions"):
    build(small(ce_positions="some"))
  with pytest.raises(ValueError, match="not a Hugging Face|neither"):
    build(small(teacher="/nonexistent/dir"))


def test_layer_map():
  assert distill.layer_map("every_other", 3, 6) == ([0, 2, 4], "")
  assert distill.layer_map("0,2,4,7,9,11", 6, 12) == ([0, 2, 4, 7, 9, 11], "")
  picks, why = distill.layer_map("every_other", 2, 2)
  assert picks is None and "teacher has 2" in why
  assert distill.layer_map("random", 2, 4)[0] is None
  with pytest.raises(ValueError, match="names 2 teacher layers for a student of 3"):
    distill.layer_map("0,1", 3, 4)


def _leaf(tree, path):
  for k in path.split("/"):
    tree = tree[k]
  return np.asarray(tree)


def test_student_takes_every_other_teacher_layer_or_stays_random():
  c = small(student_layers=2, teacher_layers=4)
  obj = build(c)
  params = _params(obj)
  shardings = jax.tree.map(lambda x: x.sharding, params)
  out = obj.after_init(params, shardings)
  assert obj.init_report["student_init"] == "teacher layers"
  assert obj.init_report["teacher_layers"] == [0, 2] and not obj.init_report["fresh"]
  for s, t in (("layer_0", "layer_0"), ("layer_1", "layer_2")):
    np.testing.assert_array_equal(
        _leaf(out["encoder"], f"encoder/{s}/attention/query/kernel"),
        _leaf(out["teacher"], f"encoder/{t}/attention/query/kernel"))
  for p in ("embeddings/word_embeddings/embedding", "mlm/transform/kernel", "mlm/bias"):
    np.testing.assert_array_equal(_leaf(out["encoder"], p), _leaf(out["teacher"], p))
  # Too few teacher layers for "every other": random, and the report says why.
  obj = build(small(student_layers=2, teacher_layers=2))
  params = _params(obj)
  out = obj.after_init(params, jax.tree.map(lambda x: x.sharding, params))
  assert obj.init_report["student_init"] == "random" and "teacher has 2" in \
      obj.init_report["reason"]
  assert out["encoder"] is params["encoder"]
  # Other widths: random (no layer fits).
  obj = build(small(width=16, alpha_cos=0.0))
  params = _params(obj)
  obj.after_init(params, jax.tree.map(lambda x: x.sharding, params))
  assert obj.init_report["student_init"] == "random"
  assert "do not fit" in obj.init_report["reason"]


def test_flops_count_the_teacher_forward():
  obj = build(small(student_layers=2, teacher_layers=4))
  s, t = obj.module_flops("encoder", 16), obj.module_flops("teacher", 16)
  assert t > s > 0
  assert obj.flops_per_example(16) == pytest.approx(3 * s + t)
  # an inference forward runs the student alone (the teacher only serves training)
  assert obj.flops_per_example(16, train=False) == pytest.approx(s)


@pytest.mark.parametrize("variant", distil_configs.VARIANTS)
def test_config_variants_load_and_build(variant):
  import encoders
  c = distil_configs.get_config(variant)
  assert c.is_locked and c.model.family == "distilbert" and c.data.packing == "documents"
  assert c.objective.name == ("distill" if variant in ("tiny", "paper") else "mlm")
  if variant == "paper":
    t = c.objective.teacher_model
    assert (t.family, t.num_hidden_layers, t.hidden_size) == ("bert", 12, 768)
    assert (c.model.num_hidden_layers, c.model.hidden_size) == (6, 768)
    assert c.objective.student_init == "0,2,4,7,9,11"
    assert (c.objective.alpha_ce, c.objective.alpha_mlm, c.objective.alpha_cos) == (5, 2, 1)
    assert c.objective.temperature == 2 and c.data.global_batch == 4096
  model = encoders.build(c.model)
  jax.eval_shape(lambda: encoders.init_params(model, jax.random.PRNGKey(0)))


@pytest.mark.parametrize("setting", ["full", "no_cos", "no_mlm", "no_ce", "random_init",
                                     "mse"])
def test_table4_ablation_settings(setting):
  from configs.ablations import distilbert_table4 as t4
  c = t4.get_config(f"tiny,setting={setting}")
  o = c.objective
  want = {"full": (5, 2, 1, 0, "every_other"), "no_cos": (5, 2, 0, 0, "every_other"),
          "no_mlm": (5, 0, 1, 0, "every_other"), "no_ce": (0, 2, 1, 0, "every_other"),
          "random_init": (5, 2, 1, 0, "random"), "mse": (0, 2, 1, 5, "every_other")}
  assert (o.alpha_ce, o.alpha_mlm, o.alpha_cos, o.alpha_mse, o.student_init) == \
      want[setting]
  with pytest.raises(ValueError, match="setting"):
    t4.get_config("tiny,setting=bogus")


def test_a_teacher_without_an_mlm_head_is_refused(tmp_path):
  import encoders
  cfg = encoders.family_defaults("bert")
  cfg.update(vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
             intermediate_size=64, heads=("pooler",), dtype="float32")
  model = encoders.build(cfg)
  encoders.to_hf(model, encoders.init_params(model, jax.random.PRNGKey(0)), str(tmp_path))
  with pytest.raises(ValueError, match="BertModel has no MLM head"):
    build(small(teacher=str(tmp_path)))
