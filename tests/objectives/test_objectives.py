"""The objective interface on synthetic batches: the masking budget, the fit checks, the
batch spec, normalizers, eval keys, pair padding rows, and the SOP pair task."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import encoders
import objectives
from configs import bert as bert_configs
from configs.ablations import bert_pretraining
from launch.perf import synthetic
from launch.trainer.step import eval_key
from objectives import masking, mlm


def _config(module=bert_configs, arg="tiny", **objective):
  c = module.get_config(arg).unlock()
  c.model.num_hidden_layers, c.model.vocab_size = 1, 512
  for k, v in objective.items():
    c.objective[k] = v
  return c


def _objective(c):
  return objectives.get_objective(c, synthetic.SyntheticTokenizer.for_model(c.model))


def test_prediction_budget():
  assert masking.prediction_budget(0.15, 128, -1) == 20  # BERT's max_predictions_per_seq
  assert masking.prediction_budget(0.15, 512, -1) == 77
  assert masking.prediction_budget(0.15, 20, -1) == 3  # no float-noise extra slot
  assert masking.prediction_budget(0.4, 128, -1) == 52
  assert masking.prediction_budget(0.15, 128, 0) == 0  # every position
  assert masking.prediction_budget(0.15, 128, 32) == 32
  with pytest.raises(ValueError, match=r"max_predictions=20.*39"):
    masking.prediction_budget(0.15, 256, 20)
  with pytest.raises(ValueError, match="-1"):
    masking.prediction_budget(0.15, 256, -2)


def test_configs_resolve_the_budget_from_seq_len():
  c = _config()
  c.data.seq_len = 64  # the tiny recipe's rows
  assert _objective(c).max_predictions == 10
  c.data.seq_len = 128
  assert _objective(c).max_predictions == 20
  c.data.seq_len = 256
  assert _objective(c).max_predictions == 39
  c = bert_pretraining.get_config("tiny,setting=mask40").unlock()
  c.model.num_hidden_layers, c.model.vocab_size = 1, 512
  c.data.seq_len = 128
  assert _objective(c).max_predictions == 52
  c = _config(max_predictions=20)
  c.data.seq_len = 256
  with pytest.raises(ValueError, match=r"max_predictions=20.*ceil\(0.15 \* 256\) = 39"):
    _objective(c)  # at construction


def test_seq_256_masks_15_percent():
  """The README's --config.data.seq_len=256 override masks 15% of the tokens, not 8.7%."""
  c = _config()
  c.data.seq_len = 256
  objective = _objective(c)
  b = synthetic.full_batch(objective, 32, 256)
  m = jax.jit(objective.transform)(b, jax.random.PRNGKey(0))
  assert m["mlm_weights"].shape == (32, 39)
  real = (~b["special_tokens_mask"]).sum()
  frac = float(m["mlm_weights"].sum()) / real
  assert 0.145 < frac < 0.155, frac


def test_fit_checks_name_the_problem():
  c = _config()
  c.data.packing = "documents"
  with pytest.raises(ValueError, match="data.packing='pairs'"):
    _objective(c)
  c = _config()
  c.model.heads = ("mlm",)
  with pytest.raises(ValueError, match="lacks \\['nsp'\\]"):
    _objective(c)
  c = _config()
  c.objective.name = "mlm"  # the model still has the NSP head no loss would train
  with pytest.raises(ValueError, match="does not train"):
    _objective(c)
  c = _config()
  c.objective.name = "mlm_sop"
  c.model.heads = ("mlm", "sop")
  with pytest.raises(ValueError, match="pair_task='sop'"):
    _objective(c)  # the rows are labelled for NSP


def test_batch_spec_synthesises_valid_batches():
  objective = _objective(_config())
  s = objective.batch_spec()
  assert s.names() == ["input_ids", "segment_ids", "token_type_ids", "special_tokens_mask",
                       "next_sentence_label"]
  b = s.synthesize([[32], [10, 12], []], 32)
  shapes = s.shapes(3, 32)
  assert {k: (v.shape, v.dtype) for k, v in b.items()} == {
      k: (v.shape, v.dtype) for k, v in shapes.items()}
  assert b["next_sentence_label"][2] == -1 and set(b["next_sentence_label"][:2]) <= {0, 1}
  assert (b["segment_ids"][1, :22] == [1] * 10 + [2] * 12).all()
  assert b["special_tokens_mask"][2].all() and (b["input_ids"][2] == 0).all()
  objective.check_batch(b)
  ww = _objective(_config(whole_word=True)).batch_spec()
  assert "word_starts" in ww.names()
  with pytest.raises(ValueError, match="do not fit"):
    s.synthesize([[40]], 32)


def test_eval_masks_differ_per_batch_and_repeat_across_runs():
  objective = _objective(_config())
  b = synthetic.full_batch(objective, 8, 128)
  t = jax.jit(objective.transform)
  a0, a1 = t(b, eval_key(0)), t(b, eval_key(1))
  again = t(b, eval_key(jnp.asarray(0, jnp.int32)))
  np.testing.assert_array_equal(a0["masked_positions"], again["masked_positions"])
  p0, p1 = np.asarray(a0["masked_positions"]), np.asarray(a1["masked_positions"])
  overlap = np.mean([len(set(x) & set(y)) / len(set(x) | set(y)) for x, y in zip(p0, p1)])
  assert overlap < 0.3  # independent masks overlap by ~8% here


def test_padding_rows_count_nowhere():
  objective = _objective(_config())
  b = objective.batch_spec().synthesize([[32], [20], [], []], 32)
  m = jax.jit(objective.transform)(b, jax.random.PRNGKey(0))  # jitted, as the trainer runs it
  norms = objective.normalizers(m)
  assert float(norms["nsp"]) == 2
  assert float(np.asarray(m["mlm_weights"])[2:].sum()) == 0
  params = nn.unbox(objective.init(jax.random.PRNGKey(0)))
  loss = jax.jit(lambda p, b: objective.loss(p, b, jax.random.PRNGKey(0), False))
  terms, sums = loss(params, m)
  assert float(sums["nsp_weight_sum"]) == 2
  assert float(sums["mlm_weight_sum"]) == float(norms["mlm"])
  # The padding rows' labels (-1) and logits do not reach the loss.
  m2 = dict(m, next_sentence_label=np.asarray([m["next_sentence_label"][0],
                                               m["next_sentence_label"][1], 0, 1], np.int32))
  terms2, _ = loss(params, m2)
  assert float(terms2["nsp"]) != float(terms["nsp"])  # counted once labelled >= 0
  assert objective.combine(terms, norms) > 0


def test_flops_count_the_budget_and_three_times_for_training():
  c = _config()
  c.data.seq_len = 128
  objective = _objective(c)
  cfg = objective.model.config
  fwd = encoders.forward_flops(cfg, 128, 20)
  assert objective.flops_per_example(128) == pytest.approx(3 * fwd)
  assert objective.flops_per_example(128, train=False, all_positions=True) == pytest.approx(
      encoders.forward_flops(cfg, 128, None))


class _StubSop(nn.Module):
  """A stand-in model with MLM and SOP heads (the objective's plumbing, not a family)."""
  config: object

  @nn.compact
  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, segment_ids=None,
               masked_positions=None, deterministic=True):
    h = nn.Embed(self.config.vocab_size, 16)(input_ids)
    if masked_positions is not None:
      g = jnp.take_along_axis(h, masked_positions[..., None], axis=1)
    else:
      g = h
    return encoders.EncoderOutput(last_hidden_state=h,
                                  mlm_logits=nn.Dense(self.config.vocab_size)(g),
                                  sop_logits=nn.Dense(2)(h.mean(1)))


def test_sop_objective_reads_sop_logits_and_sentence_order_labels(monkeypatch):
  monkeypatch.setattr(mlm.encoders, "build", lambda cfg: _StubSop(cfg))
  c = _config()
  c.objective.name = "mlm_sop"
  c.model.heads = ("mlm", "sop")
  c.data.pair_task = "sop"
  objective = _objective(c)
  s = objective.batch_spec()
  assert "sentence_order_label" in s.names() and "next_sentence_label" not in s.names()
  b = s.synthesize([[32], [24], [16], []], 32)
  m = jax.jit(objective.transform)(b, jax.random.PRNGKey(0))
  params = {"encoder": objective.model.init(jax.random.PRNGKey(0),
                                            jnp.zeros((1, 32), jnp.int32))["params"]}
  terms, sums = jax.jit(lambda p, b: objective.loss(p, b, jax.random.PRNGKey(0), True))(params, m)
  assert set(terms) == {"mlm", "sop"} and float(sums["sop_weight_sum"]) == 3
  assert set(objective.normalizers(m)) == {"mlm", "sop"}
  base = objective.baselines([b], [(b, eval_key(0))])
  assert base["sop_count"] == 3 and "sop_majority_accuracy" in base
  x = objective.reference_inputs(b, True)
  assert set(x) >= {"labels", "sentence_order_label"} and x["sentence_order_label"].min() >= 0


def test_eval_mask_rate_fixes_the_held_out_masks_while_training_masks_more():
  """A recipe trains at 30% and is scored at 15%: the eval step and the baselines mask
  held-out batches at eval_mask_rate, training batches at mask_rate; 0 = the same rate."""
  from launch.trainer.step import TrainState, make_eval_step
  c = _config(mask_rate=0.3, eval_mask_rate=0.15)
  c.data.seq_len = 64
  objective = _objective(c)
  assert (objective.max_predictions, objective.eval_max_predictions) == (20, 10)
  assert objective.describe()["eval_mask_rate"] == 0.15
  b = objective.batch_spec().synthesize([[64]] * 32, 64)
  real = float((~np.asarray(b["special_tokens_mask"], bool)).sum())
  transform = jax.jit(objective.transform, static_argnames="train")
  train, held = transform(b, eval_key(0)), transform(b, eval_key(0), train=False)
  assert np.asarray(train["masked_positions"]).shape[1] == 20
  assert np.asarray(held["masked_positions"]).shape[1] == 10
  assert float(np.asarray(train["mlm_weights"]).sum()) / real == pytest.approx(0.3, abs=0.02)
  n_held = float(np.asarray(held["mlm_weights"]).sum())
  assert n_held / real == pytest.approx(0.15, abs=0.02)
  # the eval step scores exactly the held-out masks, and the baseline counts the same ones
  params = nn.unbox(objective.init(jax.random.PRNGKey(0)))
  state = TrainState(step=0, params=params, frozen={}, opt_state=None,
                     rng=jax.random.PRNGKey(0))
  sums = make_eval_step(objective)(state, b, 0)
  assert float(sums["mlm_weight_sum"]) == n_held
  assert objective.baselines([b], [(b, eval_key(0))])["mlm_count"] == n_held
  # unset (0): held-out batches use the training rate
  same = _objective(_config(mask_rate=0.3))
  assert same.eval_mask_rate == 0.3 and same.eval_max_predictions == 20
  with pytest.raises(ValueError, match="eval_mask_rate"):
    _objective(_config(eval_mask_rate=1.5))
