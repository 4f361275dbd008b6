"""Invariants of objectives.masking.mask_tokens."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from objectives.masking import mask_tokens, special_tokens_mask_from_ids

PAD, CLS, SEP, MASK = 0, 1, 2, 3
VOCAB = 30000
B, T = 128, 128


def make_batch(seed=0, batch=B, length=T, continuation_prob=0.3):
  """Rows like `[CLS] a b c [SEP] d e [SEP] [PAD]...` with random lengths.

  Returns ids, special mask (specials + padding), word starts (about 30% of the real
  tokens continue a word; a row may start with a continuation piece after [CLS]).
  """
  rs = np.random.RandomState(seed)
  ids = rs.randint(10, VOCAB, size=(batch, length)).astype(np.int32)
  for b in range(batch):
    n = rs.randint(length // 4, length + 1)
    ids[b, n:] = PAD
    ids[b, 0] = CLS
    ids[b, n - 1] = SEP
    if n > 8:
      ids[b, rs.randint(2, n - 2)] = SEP
  if batch > 1:
    ids[1, 2:] = PAD  # a row with no real tokens: [CLS] [SEP] [PAD]...
    ids[1, 1] = SEP
  special = np.isin(ids, [PAD, CLS, SEP])
  word_starts = rs.rand(batch, length) >= continuation_prob
  return ids, special, word_starts


def word_ids(word_starts, special):
  """Word index per token (-1 for specials): the documented word rule, in numpy."""
  out = np.full(word_starts.shape, -1, np.int64)
  for b in range(word_starts.shape[0]):
    w, prev_special = -1, True
    for t in range(word_starts.shape[1]):
      if special[b, t]:
        prev_special = True
        continue
      if word_starts[b, t] or prev_special:
        w += 1
      out[b, t] = w
      prev_special = False
  return out


@functools.partial(jax.jit, static_argnames=("vocab_size", "whole_word", "max_predictions"))
def _jit_mask_tokens(key, ids, special, word_starts, mask_rate, mask_id, mask_token_prob,
                     random_token_prob, *, vocab_size, whole_word, max_predictions):
  return mask_tokens(key, ids, special, vocab_size=vocab_size, mask_id=mask_id,
                     mask_rate=mask_rate, mask_token_prob=mask_token_prob,
                     random_token_prob=random_token_prob, word_starts=word_starts,
                     whole_word=whole_word, max_predictions=max_predictions)


def run(ids, special, seed=0, *, vocab_size=VOCAB, mask_id=MASK, mask_rate=0.15,
        mask_token_prob=0.8, random_token_prob=0.1, word_starts=None, whole_word=False,
        max_predictions=None):
  """mask_tokens under jit; the rates are traced so few compiles keep the tests fast."""
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  out = _jit_mask_tokens(
      jax.random.key(seed), jnp.asarray(ids), jnp.asarray(special),
      None if word_starts is None else jnp.asarray(word_starts), f32(mask_rate),
      jnp.asarray(mask_id, jnp.int32), f32(mask_token_prob), f32(random_token_prob),
      vocab_size=vocab_size, whole_word=whole_word, max_predictions=max_predictions)
  return {k: np.asarray(v) for k, v in out.items()}


@pytest.fixture(scope="module")
def batch():
  return make_batch()


@pytest.fixture(scope="module")
def token_out(batch):
  ids, special, _ = batch
  return run(ids, special, max_predictions=40)


@pytest.fixture(scope="module")
def word_out(batch):
  ids, special, starts = batch
  return run(ids, special, word_starts=starts, whole_word=True, max_predictions=40)


def test_special_tokens_mask_from_ids():
  ids = jnp.array([[CLS, 11, SEP, PAD]])
  np.testing.assert_array_equal(special_tokens_mask_from_ids(ids, [PAD, CLS, SEP]),
                                [[True, False, True, True]])


@pytest.mark.parametrize("mode", ["token", "word"])
def test_specials_and_padding_never_selected(batch, token_out, word_out, mode):
  ids, special, _ = batch
  out = token_out if mode == "token" else word_out
  assert out["weights"].dtype == np.float32
  assert set(np.unique(out["weights"])) <= {0.0, 1.0}
  assert not np.any(out["weights"][special])
  # Specials and padding are never corrupted either.
  np.testing.assert_array_equal(out["input_ids"][special], ids[special])
  assert out["weights"][1].sum() == 0  # the row with no real tokens


@pytest.mark.parametrize("mode", ["token", "word"])
def test_labels_and_unselected_positions(batch, token_out, word_out, mode):
  ids, _, _ = batch
  out = token_out if mode == "token" else word_out
  np.testing.assert_array_equal(out["labels"], ids)
  unselected = out["weights"] == 0
  np.testing.assert_array_equal(out["input_ids"][unselected], ids[unselected])
  assert out["input_ids"].dtype == ids.dtype


def test_exact_count_per_row(batch, token_out):
  ids, special, _ = batch
  n_real = (~special).sum(1)
  expected = np.where(n_real > 0, np.maximum(1, np.round(0.15 * n_real)), 0)
  np.testing.assert_array_equal(token_out["weights"].sum(1), expected)


@pytest.mark.parametrize("rate", [0.15, 0.4])
def test_rate_close_to_mask_rate(batch, rate):
  ids, special, starts = batch
  n_real = (~special).sum()
  tok = run(ids, special, mask_rate=rate, seed=1)
  assert abs(tok["weights"].sum() / n_real - rate) < 0.005
  word = run(ids, special, mask_rate=rate, seed=1, word_starts=starts, whole_word=True)
  assert abs(word["weights"].sum() / n_real - rate) < 0.01


def test_mask_rate_zero_selects_nothing(batch):
  ids, special, starts = batch
  assert run(ids, special, mask_rate=0.0)["weights"].sum() == 0
  assert run(ids, special, mask_rate=0.0, word_starts=starts,
             whole_word=True)["weights"].sum() == 0


def test_selection_is_uniform_over_positions():
  # One fixed row, many keys: every real position is chosen about equally often.
  ids, special, _ = make_batch(seed=3, batch=1, length=64)
  ids = np.repeat(ids, 2000, 0)
  special = np.repeat(special, 2000, 0)
  w = run(ids, special, mask_rate=0.25)["weights"]
  freq = w.mean(0)[~special[0]]
  assert np.all(np.abs(freq - freq.mean()) < 0.05), freq


@pytest.mark.parametrize("whole_word", [False, True])
def test_80_10_10_split(batch, whole_word):
  ids, special, starts = batch
  out = run(ids, special, mask_rate=0.5, seed=2, whole_word=whole_word,
            word_starts=starts if whole_word else None)
  sel = out["weights"] == 1
  new, old = out["input_ids"][sel], ids[sel]
  assert sel.sum() > 4000
  frac_mask = np.mean(new == MASK)  # the original ids are never MASK here
  frac_random = np.mean((new != MASK) & (new != old))
  frac_kept = np.mean(new == old)
  assert abs(frac_mask - 0.8) < 0.03
  assert abs(frac_random - 0.1) < 0.02
  assert abs(frac_kept - 0.1) < 0.02


def test_random_replacements_in_vocab(batch):
  ids, special, _ = batch
  out = run(ids, special, vocab_size=50, mask_token_prob=0.0, random_token_prob=1.0,
            mask_rate=0.5)
  sel = out["weights"] == 1
  new = out["input_ids"][sel]
  assert new.min() >= 0 and new.max() < 50
  assert len(np.unique(new)) == 50  # uniform over the whole range, not a constant
  np.testing.assert_array_equal(out["input_ids"][~sel], ids[~sel])


def test_custom_split():
  ids, special, _ = make_batch(seed=4)
  out = run(ids, special, mask_token_prob=1.0, random_token_prob=0.0)
  sel = out["weights"] == 1
  assert np.all(out["input_ids"][sel] == MASK)
  out = run(ids, special, mask_token_prob=0.0, random_token_prob=0.0)
  np.testing.assert_array_equal(out["input_ids"], ids)
  assert out["weights"].sum() > 0


def _check_whole_words(out, ids, special, starts):
  wid = word_ids(starts, special)
  w = out["weights"]
  for b in range(ids.shape[0]):
    for k in range(wid[b].max() + 1):
      vals = w[b][wid[b] == k]
      assert len(vals) > 0
      assert vals.min() == vals.max(), f"row {b} word {k} split: {vals}"


def test_whole_word_masks_all_pieces_together(batch, word_out):
  ids, special, starts = batch
  _check_whole_words(word_out, ids, special, starts)
  # Some selected words really are multi-piece, so the test is not vacuous.
  wid = word_ids(starts, special)
  multi = 0
  for b in range(ids.shape[0]):
    sel_words = np.unique(wid[b][word_out["weights"][b] == 1])
    multi += sum((wid[b] == k).sum() > 1 for k in sel_words)
  assert multi > 100


def test_whole_word_count_close_to_budget(batch, word_out):
  ids, special, starts = batch
  wid = word_ids(starts, special)
  n_real = (~special).sum(1)
  budget = np.where(n_real > 0, np.maximum(1, np.round(0.15 * n_real)), 0)
  got = word_out["weights"].sum(1)
  for b in range(ids.shape[0]):
    if n_real[b] == 0:
      assert got[b] == 0
      continue
    longest = np.bincount(wid[b][wid[b] >= 0]).max()
    assert got[b] >= 1
    assert abs(got[b] - budget[b]) <= longest


def test_whole_word_spans_first_continuation_after_special():
  # [CLS] ##a ##b [SEP]: the pieces after [CLS] form one word even without a start.
  ids = np.array([[CLS, 11, 12, SEP, 13, 14, SEP]], np.int32)
  special = np.isin(ids, [CLS, SEP])
  starts = np.array([[True, False, False, True, False, False, True]])
  for seed in range(20):
    w = run(ids, special, seed=seed, mask_rate=0.25, word_starts=starts,
            whole_word=True)["weights"][0]
    assert w[1] == w[2] and w[4] == w[5] and w.sum() == 2


def test_bad_inputs_fail_before_tracing(batch):
  ids, special, starts = batch
  kw = dict(vocab_size=VOCAB, mask_id=MASK, mask_rate=0.15)
  key = jax.random.key(0)
  with pytest.raises(ValueError, match="word_starts"):
    mask_tokens(key, ids, special, whole_word=True, **kw)
  with pytest.raises(ValueError, match="word_starts shape"):
    mask_tokens(key, ids, special, whole_word=True, word_starts=starts[:, :-1], **kw)
  with pytest.raises(ValueError, match="special_tokens_mask shape"):
    mask_tokens(key, ids, special[:, :-1], **kw)
  with pytest.raises(ValueError, match="integer"):
    mask_tokens(key, ids.astype(np.float32), special, **kw)
  with pytest.raises(ValueError, match="mask_id"):
    mask_tokens(key, ids, special, **{**kw, "mask_id": VOCAB})
  with pytest.raises(ValueError, match="mask_rate"):
    mask_tokens(key, ids, special, **{**kw, "mask_rate": 1.5})
  with pytest.raises(ValueError, match="<= 1"):
    mask_tokens(key, ids, special, mask_token_prob=0.8, random_token_prob=0.3, **kw)
  with pytest.raises(ValueError, match="max_predictions"):
    mask_tokens(key, ids, special, max_predictions=0, **kw)


def test_jit_with_key_folded_from_traced_step(batch):
  """The train-step pattern: key folded from a traced step inside jit."""
  ids, special, starts = batch
  base = jax.random.key(0)

  @jax.jit
  def f(step):
    return mask_tokens(jax.random.fold_in(base, step), jnp.asarray(ids), jnp.asarray(special),
                       vocab_size=VOCAB, mask_id=MASK, mask_rate=0.15,
                       word_starts=jnp.asarray(starts), whole_word=True, max_predictions=32)

  a, again, other = f(5), f(5), f(6)
  for k in a:  # same key -> same masks (a resumed run redraws the same masks)
    np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(again[k]), err_msg=k)
  # different key -> different masks (dynamic masking)
  assert np.mean(np.asarray(a["weights"]) != np.asarray(other["weights"])) > 0.05
  assert np.any(np.asarray(a["input_ids"]) != np.asarray(other["input_ids"]))


@pytest.mark.parametrize("mode", ["token", "word"])
def test_max_predictions_gather_agrees_with_dense(batch, token_out, word_out, mode):
  ids, _, _ = batch
  out = token_out if mode == "token" else word_out
  pos, lab, mw = out["masked_positions"], out["masked_labels"], out["masked_weights"]
  assert pos.shape == lab.shape == mw.shape == (B, 40)
  assert pos.dtype == np.int32 and mw.dtype == np.float32
  dense = np.zeros_like(out["weights"])
  np.put_along_axis(dense, pos, mw, axis=1)  # padding entries write 0 at position 0
  np.testing.assert_array_equal(dense, out["weights"])
  np.testing.assert_array_equal(mw.sum(1), out["weights"].sum(1))
  real = mw == 1
  np.testing.assert_array_equal(lab[real], np.take_along_axis(ids, pos, 1)[real])
  np.testing.assert_array_equal(lab[real], np.take_along_axis(out["labels"], pos, 1)[real])
  assert np.all(pos[~real] == 0) and np.all(lab[~real] == 0)
  for b in range(B):  # positions ascend, padding after the real entries
    k = int(mw[b].sum())
    assert np.all(mw[b, :k] == 1) and np.all(np.diff(pos[b, :k]) > 0)


@pytest.mark.parametrize("whole_word", [False, True])
def test_max_predictions_caps_selection(batch, whole_word):
  ids, special, starts = batch
  M = 5
  out = run(ids, special, mask_rate=0.3, max_predictions=M, whole_word=whole_word,
            word_starts=starts if whole_word else None)
  counts = out["weights"].sum(1)
  assert counts.max() <= M
  np.testing.assert_array_equal(out["masked_weights"].sum(1), counts)
  dense = np.zeros_like(out["weights"])
  np.put_along_axis(dense, out["masked_positions"], out["masked_weights"], axis=1)
  np.testing.assert_array_equal(dense, out["weights"])
  n_real = (~special).sum(1)
  if not whole_word:
    np.testing.assert_array_equal(counts, np.minimum(M, np.where(
        n_real > 0, np.maximum(1, np.round(0.3 * n_real)), 0)))
  else:
    _check_whole_words(out, ids, special, starts)
    assert np.mean(counts[n_real > 30] >= M - 2) > 0.9


def test_max_predictions_longer_than_sequence():
  ids, special, _ = make_batch(seed=5, batch=4, length=16)
  out = run(ids, special, mask_rate=0.5, max_predictions=20)
  assert out["masked_positions"].shape == (4, 20)
  np.testing.assert_array_equal(out["masked_weights"].sum(1), out["weights"].sum(1))
