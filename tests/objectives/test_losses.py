"""objectives.losses: weighted cross-entropy, summable metrics, finalize."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from objectives import losses
from objectives.losses import add_metrics, finalize_metrics
from objectives.masking import mask_tokens

# Jitted once per shape (eager dispatch compiles op by op, which is slower on the CPU).
# Shape and dtype checks run while tracing, so they raise the same errors under jit.
mlm_loss_and_metrics = jax.jit(losses.mlm_loss_and_metrics)
nsp_loss_and_metrics = jax.jit(losses.nsp_loss_and_metrics)
sop_loss_and_metrics = jax.jit(losses.sop_loss_and_metrics)
sequence_classification_loss = jax.jit(losses.sequence_classification_loss,
                                       static_argnames="prefix")

B, T, V = 4, 16, 50


def np_cross_entropy(logits, labels):
  logits = np.asarray(logits, np.float64)
  z = logits - logits.max(-1, keepdims=True)
  logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  return -np.take_along_axis(logp, np.asarray(labels)[..., None], -1)[..., 0]


@pytest.fixture(scope="module")
def data():
  rs = np.random.RandomState(0)
  logits = rs.randn(B, T, V).astype(np.float32) * 3
  labels = rs.randint(0, V, (B, T)).astype(np.int32)
  weights = (rs.rand(B, T) < 0.3).astype(np.float32)
  weights[:, -4:] = 0  # padding
  weights[0, 0] = 1
  # Make some predictions right so accuracy is not trivially 0.
  right = rs.rand(B, T) < 0.5
  logits[right, labels[right]] += 20
  return logits, labels, weights


def test_mlm_loss_matches_numpy(data):
  logits, labels, weights = data
  loss, m = mlm_loss_and_metrics(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(weights))
  ce = np_cross_entropy(logits, labels)
  expected = (ce * weights).sum() / weights.sum()
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
  np.testing.assert_allclose(float(m["mlm_loss_sum"]), (ce * weights).sum(), rtol=1e-5)
  assert float(m["mlm_weight_sum"]) == weights.sum()
  correct = ((logits.argmax(-1) == labels) * weights).sum()
  assert 0 < correct < weights.sum()
  assert float(m["mlm_correct_sum"]) == correct
  for v in (loss, *m.values()):
    assert v.dtype == jnp.float32 and v.shape == ()


def test_mlm_loss_ignores_unweighted_positions(data):
  logits, labels, weights = data
  ignored = weights == 0
  ref = mlm_loss_and_metrics(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(weights))
  changed = logits.copy()
  changed[ignored] = np.random.RandomState(1).randn(ignored.sum(), V) * 100
  changed[ignored, 0] = np.inf  # even non-finite logits there must not leak
  changed[ignored, 1] = np.nan
  bad_labels = np.where(ignored, -100, labels)  # nor out-of-range labels
  for lg, lb in ((changed, labels), (logits, bad_labels), (changed, bad_labels)):
    loss, m = mlm_loss_and_metrics(jnp.asarray(lg), jnp.asarray(lb), jnp.asarray(weights))
    assert float(loss) == float(ref[0])
    for k in m:
      assert float(m[k]) == float(ref[1][k]), k


def test_mlm_gradient_zero_at_unweighted_positions(data):
  logits, labels, weights = data
  g = jax.grad(lambda x: mlm_loss_and_metrics(x, labels, weights)[0])(jnp.asarray(logits))
  g = np.asarray(g)
  assert np.all(g[weights == 0] == 0)
  assert np.all(np.abs(g[weights == 1]).sum(-1) > 0)


def test_mlm_bf16_logits_computed_in_float32(data):
  logits, labels, weights = data
  bf = jnp.asarray(logits, jnp.bfloat16)
  loss, m = mlm_loss_and_metrics(bf, labels, weights)
  assert loss.dtype == jnp.float32 and m["mlm_loss_sum"].dtype == jnp.float32
  ce = np_cross_entropy(np.asarray(bf.astype(jnp.float32)), labels)
  np.testing.assert_allclose(float(loss), (ce * weights).sum() / weights.sum(), rtol=1e-5)


def test_mlm_gathered_logits_equal_dense():
  """Dense (B,T,V) with weights == gathered (B,M,V) at masked_positions."""
  rs = np.random.RandomState(2)
  ids = rs.randint(5, V, (B, T)).astype(np.int32)
  special = np.zeros((B, T), bool)
  special[:, 0] = special[:, -3:] = True
  logits = jnp.asarray(rs.randn(B, T, V).astype(np.float32))

  @jax.jit
  def both(key):
    out = mask_tokens(key, ids, special, vocab_size=V, mask_id=4, mask_rate=0.3,
                      max_predictions=8)
    dense = losses.mlm_loss_and_metrics(logits, out["labels"], out["weights"])
    gathered_logits = jnp.take_along_axis(logits, out["masked_positions"][..., None], axis=1)
    gathered = losses.mlm_loss_and_metrics(gathered_logits, out["masked_labels"],
                                           out["masked_weights"])
    return dense, gathered

  dense, gathered = both(jax.random.key(0))
  assert float(dense[1]["mlm_weight_sum"]) > B
  np.testing.assert_allclose(float(gathered[0]), float(dense[0]), rtol=1e-6)
  for k in dense[1]:
    np.testing.assert_allclose(float(gathered[1][k]), float(dense[1][k]), rtol=1e-6)


def test_zero_weights_give_zero_loss(data):
  logits, labels, _ = data
  loss, m = mlm_loss_and_metrics(logits, labels, np.zeros((B, T), np.float32))
  assert float(loss) == 0.0 and float(m["mlm_weight_sum"]) == 0.0
  assert finalize_metrics(jax.device_get(m)) == {"mlm_count": 0.0, "mlm_loss": 0.0,
                                                 "mlm_accuracy": 0.0}


def test_eager_matches_jit_and_finalize_in_jit(data):
  logits, labels, weights = data
  loss, m = losses.mlm_loss_and_metrics(logits, labels, weights)  # eager
  ref_loss, _ = mlm_loss_and_metrics(logits, labels, weights)
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
  fin = jax.jit(finalize_metrics)(m)
  np.testing.assert_allclose(float(fin["mlm_loss"]), float(ref_loss), rtol=1e-6)


def test_shape_errors(data):
  logits, labels, weights = data
  with pytest.raises(ValueError, match="labels shape"):
    mlm_loss_and_metrics(logits, labels[:, :-1], weights)
  with pytest.raises(ValueError, match="weights shape"):
    mlm_loss_and_metrics(logits, labels, weights[:, :-1])
  with pytest.raises(ValueError, match="integer"):
    mlm_loss_and_metrics(logits, labels.astype(np.float32), weights)
  with pytest.raises(ValueError, match=r"\(B,T,V\)"):
    mlm_loss_and_metrics(logits[0], labels[0], weights[0])


def test_nsp_matches_numpy():
  rs = np.random.RandomState(3)
  logits = rs.randn(8, 2).astype(np.float32)
  labels = rs.randint(0, 2, 8).astype(np.int32)
  loss, m = nsp_loss_and_metrics(jnp.asarray(logits, jnp.bfloat16).astype(jnp.float32), labels)
  logits = np.asarray(jnp.asarray(logits, jnp.bfloat16).astype(jnp.float32))
  ce = np_cross_entropy(logits, labels)
  np.testing.assert_allclose(float(loss), ce.mean(), rtol=1e-5)
  assert set(m) == {"nsp_loss_sum", "nsp_correct_sum", "nsp_weight_sum"}
  assert float(m["nsp_weight_sum"]) == 8
  assert float(m["nsp_correct_sum"]) == (logits.argmax(-1) == labels).sum()


def test_sequence_classification_weights_and_prefix():
  rs = np.random.RandomState(4)
  logits = rs.randn(6, 3).astype(np.float32)
  labels = np.array([0, 1, 2, 1, -1, 7], np.int32)  # the last two are padding examples
  w = np.array([1, 1, 1, 1, 0, 0], np.float32)
  loss, m = sequence_classification_loss(logits, labels, w, prefix="sop")
  ce = np_cross_entropy(logits[:4], labels[:4])
  np.testing.assert_allclose(float(loss), ce.mean(), rtol=1e-5)
  assert set(m) == {"sop_loss_sum", "sop_correct_sum", "sop_weight_sum"}
  loss2, _ = sop_loss_and_metrics(logits[:4], labels[:4])
  np.testing.assert_allclose(float(loss2), float(loss), rtol=1e-6)
  with pytest.raises(ValueError, match="num_classes"):
    sequence_classification_loss(logits[None], labels[None])


def test_metric_sums_add_up_across_microbatches(data):
  """Summed metrics over two halves finalize to the full batch's weighted mean."""
  logits, labels, weights = data
  total = None
  for sl in (slice(0, 1), slice(1, B)):  # unequal halves: means would not add up
    _, m = mlm_loss_and_metrics(logits[sl], labels[sl], weights[sl])
    total = add_metrics(total or {}, m)
  _, nsp = nsp_loss_and_metrics(np.array([[2.0, 0.0], [0.0, 1.0]], np.float32),
                                np.array([0, 0], np.int32))
  total = add_metrics(total, nsp)
  total["step"] = 7
  fin = finalize_metrics(jax.device_get(total))
  full_loss, full_m = mlm_loss_and_metrics(logits, labels, weights)
  np.testing.assert_allclose(fin["mlm_loss"], float(full_loss), rtol=1e-5)
  np.testing.assert_allclose(
      fin["mlm_accuracy"], float(full_m["mlm_correct_sum"] / full_m["mlm_weight_sum"]),
      rtol=1e-6)
  assert fin["mlm_count"] == weights.sum()
  assert fin["nsp_accuracy"] == 0.5 and fin["nsp_count"] == 2.0
  assert fin["step"] == 7
  assert isinstance(fin["mlm_loss"], float)


@pytest.mark.parametrize("case", ["unique", "ties", "nan", "one_tie_row", "all_equal"])
def test_argmax_equals_is_argmax_exactly(case):
  """The fast accuracy test agrees with `argmax == label` on every row, including the rows
  that need the exact path: ties (the first maximal index wins, as in argmax), a NaN (argmax
  picks it) and a row of identical logits (a collapsed model is not 100% accurate)."""
  rng = np.random.default_rng(3)
  logits = rng.standard_normal((6, 5, 40)).astype(np.float32)
  if case == "ties":  # small integer logits: many rows tie at their maximum
    logits = rng.integers(0, 4, (6, 5, 40)).astype(np.float32)
  elif case == "nan":
    logits[2, 3, 7] = np.nan
  elif case == "one_tie_row":
    logits[1, 1, :] = 0.0
    logits[1, 1, [4, 9]] = 5.0
  elif case == "all_equal":
    logits[:] = 0.25
  labels = rng.integers(0, 40, (6, 5)).astype(np.int32)
  top = np.argmax(logits, -1)  # numpy's argmax also returns the first NaN / first maximum
  labels[0] = top[0]  # some rows right, so both outcomes are exercised
  if case == "one_tie_row":
    labels[1, 1] = 9  # the second of two maxima: wrong for argmax, though at the maximum
  if case == "all_equal":
    labels[0, 0] = 0  # argmax of an all-equal row is index 0
  got = np.asarray(jax.jit(losses.argmax_equals)(jnp.asarray(logits), jnp.asarray(labels)))
  want = np.asarray(jnp.argmax(jnp.asarray(logits), -1)) == labels
  np.testing.assert_array_equal(got, want)
  assert got.any() and not got.all()
  if case == "one_tie_row":
    assert not got[1, 1]


def test_cross_entropy_value_and_gradient_match_optax():
  """The fused-reduction cross-entropy is optax's softmax cross-entropy, value and
  gradient, at logits large enough that an unshifted log-sum-exp would overflow."""
  import optax
  rs = np.random.RandomState(5)
  logits = (rs.randn(3, 7, 61) * 40 + 60).astype(np.float32)
  labels = rs.randint(0, 61, (3, 7)).astype(np.int32)
  weights = (rs.rand(3, 7) < 0.6).astype(np.float32) * rs.rand(3, 7).astype(np.float32)
  weights[0, 0] = 1.0

  def ours(x):
    return losses.weighted_cross_entropy(x, labels, weights, prefix="x")[0]

  def reference(x):
    ce = optax.softmax_cross_entropy_with_integer_labels(x, jnp.where(weights > 0, labels, 0))
    return jnp.sum(ce * weights) / jnp.sum(weights)

  got, got_grad = jax.jit(jax.value_and_grad(ours))(jnp.asarray(logits))
  want, want_grad = jax.jit(jax.value_and_grad(reference))(jnp.asarray(logits))
  assert np.isfinite(float(got))
  np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(got_grad), np.asarray(want_grad), atol=1e-7)
  # unweighted rows get no gradient, weighted ones the softmax minus the one-hot
  assert not np.asarray(got_grad)[weights == 0].any()
