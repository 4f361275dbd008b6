"""ELECTRA's ablations (configs/ablations/electra.py): every setting builds and a few
optimizer steps run on its objective; "ELECTRA 15%" counts only the masked positions;
Replace MLM and All-Tokens MLM (objectives/rtd_mlm.py): labels, the copy gate's
distribution, and a run through the one trainer with an export transformers loads."""
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import objectives
from configs.ablations import electra as ablations
from launch.perf import synthetic
from objectives import losses, rtd_mlm
from tests.launch.train_helpers import copy_workdir, small_config
from tests.launch.train_helpers import tokenizer_cache  # noqa: F401  (a fixture)


def _ablation(setting, seq=32):
  c = ablations.get_config(f"tiny,setting={setting}").unlock()
  c.model.num_hidden_layers, c.model.vocab_size = 1, 300
  c.model.hidden_size, c.model.embedding_size = 64, 48
  c.model.num_attention_heads, c.model.intermediate_size = 2, 128
  c.data.seq_len = seq
  return c


def _setup(c, seed=0, rows=4):
  obj = objectives.get_objective(c, synthetic.SyntheticTokenizer.for_model(c.model))
  params = nn.unbox(obj.init(jax.random.PRNGKey(seed)))
  batch = synthetic.full_batch(obj, rows, c.data.seq_len, seed=seed)
  batch["segment_ids"][0, -7:] = 0  # padding at the end of one row
  batch["special_tokens_mask"][0, -7:] = True
  batch["input_ids"][0, -7:] = 0
  return obj, params, {k: jnp.asarray(v) for k, v in batch.items()}


# The new objectives and ELECTRA 15% in the default suite; generator widths and sharing
# modes are also covered fast by tests/objectives/test_rtd.py.
FAST = ("electra_15", "replace_mlm", "all_tokens_mlm")


@pytest.mark.parametrize("setting", [s if s in FAST else pytest.param(s, marks=pytest.mark.slow)
                                     for s in ablations.SETTINGS])
def test_each_ablation_builds_and_steps(setting):
  """Three Adam steps on one batch of the setting's objective lower its loss."""
  c = _ablation(setting, seq=16)
  obj, params, batch = _setup(c)
  assert obj.name == ("replaced_mlm" if setting in ablations.MLM_SETTINGS else "rtd")
  opt = optax.adam(3e-3)

  @jax.jit
  def step(params, opt_state, key):
    b = obj.transform(batch, jax.random.PRNGKey(0))  # the same masking every step

    def f(p):
      terms, _ = obj.loss(p, b, key, True)
      return obj.combine(terms, obj.normalizers(b))
    loss, g = jax.value_and_grad(f)(params)
    updates, opt_state = opt.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  state = opt.init(params)
  key = jax.random.PRNGKey(1)
  first = None
  for _ in range(3):
    params, state, loss = step(params, state, key)
    first = float(loss) if first is None else first
  _, _, last = step(params, state, key)
  assert np.isfinite(first) and float(last) < first


def test_electra_15_counts_only_the_masked_positions():
  obj, params, batch = _setup(_ablation("electra_15"))
  assert obj.rtd_positions == "masked"
  b = jax.jit(obj.transform)(batch, jax.random.PRNGKey(3))
  key = jax.random.PRNGKey(4)
  terms, sums = jax.jit(lambda p, b: obj.loss(p, b, key, False))(params, b)
  # The same step by hand: generator, sample, discriminator; BCE over masked tokens only.
  gen_p, disc_p = obj.model_params(params)
  _, k_sample, _ = jax.random.split(key, 3)
  g = obj._apply(obj.generator, gen_p, b["input_ids"], b, False, None,
                 b.get("masked_positions"))
  corrupted = obj.corrupt(k_sample, g.mlm_logits, b)
  d = obj._apply(obj.discriminator, disc_p, corrupted, b, False, None)
  masked = np.asarray(b["masked_dense"]) > 0
  real = np.asarray(batch["segment_ids"]) > 0
  assert 0 < masked.sum() < real.sum() and not (masked & ~real).any()
  z = np.asarray(d.rtd_logits, np.float64)
  y = np.asarray(corrupted != b["original_ids"], np.float64)
  bce = np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
  np.testing.assert_allclose(float(terms["rtd"]), bce[masked].sum(), rtol=1e-5)
  assert float(sums["rtd_weight_sum"]) == masked.sum()
  assert float(obj.normalizers(b)["rtd"]) == masked.sum()


def test_copy_gate_is_a_distribution_with_weight_on_the_input():
  logits = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 7))
  gate = jnp.array([[0.0, 2.0, -3.0], [1.0, -1.0, 5.0]])
  ids = jnp.array([[1, 4, 6], [0, 0, 3]])
  logp = jax.nn.log_softmax(logits, -1)
  p = np.exp(np.asarray(rtd_mlm.copy_mixture(logp, gate, ids), np.float64))
  np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)
  sm, dgate = np.exp(np.asarray(logp, np.float64)), 1 / (1 + np.exp(-np.asarray(gate)))
  for i in range(2):
    for t in range(3):
      want = (1 - dgate[i, t]) * sm[i, t]
      want[int(ids[i, t])] += dgate[i, t]
      np.testing.assert_allclose(p[i, t], want, rtol=1e-5)


def test_replace_and_all_tokens_mlm_targets():
  obj, params, batch = _setup(_ablation("replace_mlm"))
  b = jax.jit(obj.transform)(batch, jax.random.PRNGKey(3))
  terms, sums = jax.jit(lambda p, b: obj.loss(p, b, jax.random.PRNGKey(4), False))(params, b)
  n_masked = float(np.asarray(b["mlm_weights"]).sum())
  assert float(sums["dmlm_weight_sum"]) == float(sums["mlm_weight_sum"]) == n_masked > 0
  assert obj.normalizers(b)["dmlm"] == n_masked
  m = losses.finalize_metrics({k: float(v) for k, v in sums.items()})
  # Masked positions hold samples: copying the input is right exactly where the sample
  # equals the original.
  np.testing.assert_allclose(m["dmlm_copy_baseline_accuracy"],
                             1 - m["dmlm_replaced_count"] / n_masked, atol=1e-6)
  obj, params, batch = _setup(_ablation("all_tokens_mlm"))
  assert obj.copy_gate and obj.targets == "all"
  b = jax.jit(obj.transform)(batch, jax.random.PRNGKey(3))
  terms, sums = jax.jit(lambda p, b: obj.loss(p, b, jax.random.PRNGKey(4), False))(params, b)
  real = float((np.asarray(batch["segment_ids"]) > 0).sum())
  assert float(sums["dmlm_weight_sum"]) == real == float(obj.normalizers(b)["dmlm"])
  assert np.isfinite(float(terms["dmlm"]))
  f = obj.flops_per_example(32)
  assert f > 3 * obj.module_flops("generator", 32) > 0


def test_bad_replaced_mlm_settings_are_refused():
  c = _ablation("all_tokens_mlm")
  c.objective.mlm_targets = "some"
  with pytest.raises(ValueError, match="mlm_targets"):
    _setup(c)
  c = _ablation("replace_mlm")
  c.objective.copy_gate = True
  with pytest.raises(ValueError, match="copy_gate"):
    _setup(c)
  c = _ablation("replace_mlm")
  c.model.heads = ("rtd",)
  with pytest.raises(ValueError, match="mlm"):
    _setup(c)
  with pytest.raises(ValueError, match="setting"):
    ablations.get_config("tiny,setting=mlm_everything")


@pytest.mark.slow  # the objective's step is covered fast above; this is the trainer's run
def test_all_tokens_mlm_trains_with_the_trainer_and_exports(tmp_path, tokenizer_cache):  # noqa: F811
  from launch import trainer as train
  wd = copy_workdir(tmp_path, "atm", tokenizer_cache)
  c = small_config(ablations, "tiny,setting=all_tokens_mlm", train__steps=2,
                      train__eval_every=2)
  c.model.embedding_size = 32
  c.model.num_attention_heads = 2
  c.tokenizer.lowercase = False
  out = train.train_and_evaluate(c, wd, jax.devices()[:1])
  ev = out["eval"]
  for key in ("mlm_accuracy", "dmlm_loss", "dmlm_accuracy", "dmlm_replaced_accuracy",
              "dmlm_copy_baseline_accuracy"):
    assert np.isfinite(ev[key]), key
  import transformers as T
  path = os.path.join(wd, "hf")
  _, info = T.ElectraForMaskedLM.from_pretrained(path, output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert os.path.exists(os.path.join(path, "copy_gate.safetensors"))
