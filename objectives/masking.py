"""Dynamic masked-language-model corruption, as pure jittable JAX functions.

`mask_tokens` runs on device inside the train step. The trainer passes a key folded
from the step (e.g. `jax.random.fold_in(base_key, step)`), so every time a row is
seen it gets a fresh mask, and a resumed run reproduces exactly the masks it would
have drawn.

Selection rule (BERT-style exact count per row):

- Candidates are the positions where `special_tokens_mask` is False. The caller must
  mark padding as special too: padding and special tokens are never selected.
- Each row gets a token budget `b = round(mask_rate * n_real)` (`jnp.round`, halves to
  even, like Python's `round`), where `n_real` is the row's number of candidates;
  `b` is at least 1 when the row has a candidate and `mask_rate > 0` (as in BERT's
  `max(1, round(len * rate))`).
- Token masking: exactly `b` candidates are chosen uniformly at random (without
  replacement).
- Whole-word masking (`whole_word=True`): the unit of selection is the word. A word
  is a candidate token that starts a word (`word_starts` True, or the previous token
  is special/padding, or it is the first position) plus the candidate non-start
  tokens that follow it. Words are put in a uniformly random order and the first `j`
  of them are selected, where `j >= 1` is chosen so that their total token count is
  the closest to `b` (ties: the smaller `j`). All pieces of a selected word are
  selected; a word is never split. The token count per row is therefore close to,
  not always exactly, `b`.
- `max_predictions=M` caps the selection: no more than `M` tokens are selected per
  row (in token mode: `min(b, M)` tokens; in whole-word mode the chosen words' total
  is also kept `<= M`, so a word that does not fit is left out rather than split). The
  cap is applied to the dense `weights` as well, so dense and gathered outputs always
  describe the same selection.

Of the selected tokens, each independently becomes `mask_id` with probability
`mask_token_prob`, a uniformly random id in `[0, vocab_size)` with probability
`random_token_prob`, and stays unchanged otherwise. Random ids may be special ids;
`vocab_size` should be the tokenizer's vocabulary (not a padded embedding table).
"""
from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp

__all__ = ["mask_tokens", "special_tokens_mask_from_ids", "prediction_budget"]


def rates_and_budgets(cfg, seq_len: int):
  """{train: (masking rate, prediction budget)} of an objective section: True for
  training batches (`mask_rate`), False for held-out ones (`eval_mask_rate`, where 0, the
  default, means `mask_rate`). A recipe may train at a higher rate than it is scored at
  (e.g. 30% in training, 15% held out, so its eval stays comparable with BERT's). The
  budgets follow `prediction_budget` (raises for a cap too small for either rate)."""
  train = float(cfg.mask_rate)
  held_out = float(cfg.get("eval_mask_rate", 0.0) or 0.0) or train
  _check_prob("eval_mask_rate", held_out)
  cap = int(cfg.max_predictions)
  return {True: (train, prediction_budget(train, seq_len, cap)),
          False: (held_out, prediction_budget(held_out, seq_len, cap))}


def check_config(cfg, seq_len: int) -> None:
  """The masking settings of an objective section (those it has), checked at start-up:
  `mask_rate` in (0, 1], `eval_mask_rate` in [0, 1] (0: `mask_rate`), `mask_token_prob`
  and `random_token_prob` in [0, 1] with a sum <= 1, `whole_word` a bool, and
  `max_predictions` (via `rates_and_budgets`). Raises a one-line ValueError."""
  if "mask_rate" not in cfg:
    return
  rate = cfg.mask_rate
  if not isinstance(rate, numbers.Real) or not 0.0 < float(rate) <= 1.0:
    raise ValueError(f"objective.mask_rate={rate!r} must be in (0, 1] (the fraction of "
                     "tokens masked; BERT: 0.15)")
  ev = cfg.get("eval_mask_rate", 0.0)
  if not isinstance(ev, numbers.Real) or not 0.0 <= float(ev) <= 1.0:
    raise ValueError(f"objective.eval_mask_rate={ev!r} must be in [0, 1] (0: mask_rate)")
  probs = {}
  for key in ("mask_token_prob", "random_token_prob"):
    v = cfg.get(key, 0.0)
    if not isinstance(v, numbers.Real) or not 0.0 <= float(v) <= 1.0:
      raise ValueError(f"objective.{key}={v!r} must be in [0, 1] (of the selected tokens)")
    probs[key] = float(v)
  if sum(probs.values()) > 1.0 + 1e-9:
    raise ValueError(f"objective.mask_token_prob={probs['mask_token_prob']} + "
                     f"random_token_prob={probs['random_token_prob']} must be <= 1 (the "
                     "rest of the selected tokens stay unchanged)")
  ww = cfg.get("whole_word", False)
  if not isinstance(ww, bool):
    raise ValueError(f"objective.whole_word={ww!r} must be True or False")
  if "max_predictions" in cfg:
    rates_and_budgets(cfg, seq_len)


def prediction_budget(mask_rate: float, seq_len: int, max_predictions: int) -> int:
  """How many masked positions per row the MLM head is computed on (the width M of the
  gathered `masked_positions`), from `objective.max_predictions`:

  - 0: none gathered; the head runs on every position (returns 0);
  - -1: auto, `ceil(mask_rate * seq_len)` (BERT's 20 at length 128 and 15%), at least 1;
    this follows `seq_len`, so a longer sequence masks the same fraction;
  - > 0: an explicit cap, which must hold `ceil(mask_rate * seq_len)`: a smaller one would
    silently mask less than `mask_rate` of the tokens, and is a ValueError naming both.

  A row's budget is `round(mask_rate * n_real)` with `n_real <= seq_len`, so the auto
  width never truncates a row's selection.
  """
  if not isinstance(max_predictions, numbers.Integral) or max_predictions < -1:
    raise ValueError(f"objective.max_predictions must be -1 (auto), 0 (every position) or "
                     f"a positive cap, got {max_predictions!r}")
  _check_prob("mask_rate", mask_rate)
  if not isinstance(seq_len, numbers.Integral) or seq_len < 1:
    raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
  # The tolerance keeps float noise (0.15 * 20 = 3.0000000000000004) from adding a slot.
  needed = max(1, math.ceil(float(mask_rate) * int(seq_len) - 1e-6))
  if max_predictions == 0:
    return 0
  if max_predictions == -1:
    return needed
  if max_predictions < needed:
    raise ValueError(
        f"objective.max_predictions={max_predictions} is smaller than the "
        f"ceil(mask_rate * seq_len) = ceil({mask_rate} * {seq_len}) = {needed} masked "
        f"positions a row may need: it would mask less than {mask_rate:.0%}. Use -1 (auto, "
        f"{needed}), 0 (every position) or a cap >= {needed}")
  return int(max_predictions)


def special_tokens_mask_from_ids(input_ids, special_ids):
  """True where `input_ids` is one of `special_ids` (e.g. [CLS], [SEP], [PAD])."""
  special_ids = jnp.asarray(list(special_ids), dtype=jnp.asarray(input_ids).dtype)
  return jnp.isin(input_ids, special_ids)


def _check_prob(name, value):
  if isinstance(value, numbers.Real) and not 0.0 <= float(value) <= 1.0:
    raise ValueError(f"{name} must be in [0, 1], got {value}")


def _validate(input_ids, special_tokens_mask, word_starts, whole_word, vocab_size,
              mask_id, mask_rate, mask_token_prob, random_token_prob,
              max_predictions):
  if input_ids.ndim != 2:
    raise ValueError(f"input_ids must be (batch, length), got shape {input_ids.shape}")
  if not jnp.issubdtype(input_ids.dtype, jnp.integer):
    raise ValueError(f"input_ids must be integer, got dtype {input_ids.dtype}")
  if special_tokens_mask.shape != input_ids.shape:
    raise ValueError(
        f"special_tokens_mask shape {special_tokens_mask.shape} != input_ids shape "
        f"{input_ids.shape}")
  if whole_word:
    if word_starts is None:
      raise ValueError("whole_word=True needs word_starts (True at each word's first piece)")
  if word_starts is not None and jnp.shape(word_starts) != input_ids.shape:
    raise ValueError(
        f"word_starts shape {jnp.shape(word_starts)} != input_ids shape {input_ids.shape}")
  if not isinstance(vocab_size, numbers.Integral) or vocab_size < 1:
    raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
  if isinstance(mask_id, numbers.Integral) and not 0 <= mask_id < vocab_size:
    raise ValueError(f"mask_id {mask_id} is outside the vocabulary [0, {vocab_size})")
  _check_prob("mask_rate", mask_rate)
  _check_prob("mask_token_prob", mask_token_prob)
  _check_prob("random_token_prob", random_token_prob)
  if (isinstance(mask_token_prob, numbers.Real)
      and isinstance(random_token_prob, numbers.Real)
      and mask_token_prob + random_token_prob > 1.0 + 1e-9):
    raise ValueError(
        f"mask_token_prob + random_token_prob must be <= 1, got "
        f"{mask_token_prob} + {random_token_prob}")
  if max_predictions is not None and (
      not isinstance(max_predictions, numbers.Integral) or max_predictions < 1):
    raise ValueError(f"max_predictions must be a positive int or None, got {max_predictions!r}")


def _select(random_bits, candidates, unit_start, budget, cap):
  """Chooses whole units (words, or single tokens) per row.

  random_bits: (B,T) uint32, uniformly random.
  candidates: (B,T) bool, the tokens that may be selected.
  unit_start: (B,T) bool, True at the first token of each unit (a subset of candidates).
  budget: (B,) int32 token budget per row.
  cap: python int or None, the most tokens a row may select.
  Returns (B,T) bool, the selected tokens.
  """
  B, T = candidates.shape
  pos = jnp.arange(T, dtype=jnp.int32)
  # Index of the unit start each token belongs to (-1 before the first start).
  start_of = jax.lax.cummax(jnp.where(unit_start, pos[None, :], -1), axis=1)
  # Tokens per unit, stored at the unit's start position (0 elsewhere). A unit is a run of
  # candidates from its start up to the next start, so its size is a difference of the
  # running candidate count: cand_before[next start] - cand_before[start]. (Gathers and
  # scans only: a scatter here would leave XLA's TPU cost model unable to price the step.)
  cand_before = jnp.concatenate(
      [jnp.zeros((B, 1), jnp.int32), jnp.cumsum(candidates, axis=1, dtype=jnp.int32)],
      axis=1)  # (B, T+1): candidates in [0, i)
  later_start = jnp.concatenate(
      [jnp.where(unit_start, pos[None, :], T)[:, 1:], jnp.full((B, 1), T, jnp.int32)],
      axis=1)
  next_start = jax.lax.cummin(later_start, axis=1, reverse=True)  # first start after i
  unit_len = (jnp.take_along_axis(cand_before, next_start, axis=1)
              - cand_before[:, :T])
  unit_len = jnp.where(unit_start, unit_len, 0)

  # A uniformly random order of the units (31-bit random keys; non-starts get a key
  # above every start's, so they sort last).
  keys = jnp.where(unit_start, random_bits >> 1, jnp.uint32(0xFFFFFFFF))
  order = jnp.argsort(keys, axis=1)
  rank = jnp.argsort(order, axis=1).astype(jnp.int32)  # position -> place in the order
  sorted_len = jnp.take_along_axis(unit_len, order, axis=1)
  # totals[:, j] = tokens covered by the first j units of the order, j = 0..T.
  totals = jnp.concatenate(
      [jnp.zeros((B, 1), jnp.int32), jnp.cumsum(sorted_len, axis=1, dtype=jnp.int32)],
      axis=1)
  j = jnp.arange(T + 1, dtype=jnp.int32)[None, :]
  n_units = jnp.sum(unit_start, axis=1, dtype=jnp.int32)[:, None]
  valid = (j >= 1) & (j <= n_units)
  if cap is not None:
    valid &= totals <= cap
  big = jnp.iinfo(jnp.int32).max
  dist = jnp.where(valid, jnp.abs(totals - budget[:, None]), big)
  # argmin takes the first minimum: ties go to fewer units; no valid j -> 0 units.
  n_take = jnp.argmin(dist, axis=1).astype(jnp.int32)
  n_take = jnp.where(jnp.any(valid, axis=1) & (budget > 0), n_take, 0)

  unit_rank = jnp.take_along_axis(rank, jnp.maximum(start_of, 0), axis=1)
  return candidates & (start_of >= 0) & (unit_rank < n_take[:, None])


def mask_tokens(rng, input_ids, special_tokens_mask, *, vocab_size, mask_id, mask_rate,
                mask_token_prob=0.8, random_token_prob=0.1, word_starts=None,
                whole_word=False, max_predictions=None):
  """Corrupts a batch for masked-language modelling (see the module docstring).

  Args:
    rng: a PRNG key, e.g. `jax.random.fold_in(key, step)`.
    input_ids: (B,T) integer token ids.
    special_tokens_mask: (B,T) bool, True at special tokens AND padding.
    vocab_size: random replacement ids are drawn from [0, vocab_size).
    mask_id: the [MASK] id.
    mask_rate: fraction of the candidate tokens to select per row.
    mask_token_prob, random_token_prob: the 80/10/10 split of the selected tokens.
    word_starts: (B,T) bool, True at the first piece of each word; needed for
      `whole_word=True`.
    whole_word: select whole words instead of single tokens.
    max_predictions: M; also return the selection gathered into (B,M) arrays.

  Returns:
    dict with
      input_ids: (B,T) the corrupted ids, same dtype as the input;
      labels: (B,T) the original ids (everywhere; use `weights` to pick positions);
      weights: (B,T) float32, 1.0 at selected positions, else 0.0;
    and when max_predictions is given:
      masked_positions: (B,M) int32 positions of the selected tokens in increasing
        order, padded with 0;
      masked_labels: (B,M) original ids at those positions, padded with 0;
      masked_weights: (B,M) float32, 1.0 for real entries, 0.0 for padding.
  """
  input_ids = jnp.asarray(input_ids)
  special_tokens_mask = jnp.asarray(special_tokens_mask).astype(bool)
  _validate(input_ids, special_tokens_mask, word_starts, whole_word, vocab_size, mask_id,
            mask_rate, mask_token_prob, random_token_prob, max_predictions)
  B, T = input_ids.shape
  candidates = ~special_tokens_mask

  if whole_word:
    word_starts = jnp.asarray(word_starts).astype(bool)
    prev_not_candidate = jnp.concatenate(
        [jnp.ones((B, 1), bool), ~candidates[:, :-1]], axis=1)
    unit_start = candidates & (word_starts | prev_not_candidate)
  else:
    unit_start = candidates

  n_real = jnp.sum(candidates, axis=1, dtype=jnp.int32)
  budget = jnp.round(jnp.asarray(mask_rate, jnp.float32) * n_real).astype(jnp.int32)
  # At least one token per non-empty row, unless mask_rate is 0.
  budget = jnp.where((n_real > 0) & (jnp.asarray(mask_rate) > 0), jnp.maximum(budget, 1),
                     budget)
  if not whole_word and max_predictions is not None:
    budget = jnp.minimum(budget, max_predictions)

  # One draw of random bits for everything (one threefry instance keeps compiles short).
  bits = jax.random.bits(rng, (3, B, T), jnp.uint32)
  selected = _select(bits[0], candidates, unit_start, budget, max_predictions)

  # Uniform in [0, 1) with 24-bit resolution.
  action = (bits[1] >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)
  to_mask = selected & (action < mask_token_prob)
  to_random = selected & ~to_mask & (action < mask_token_prob + random_token_prob)
  # Uniform in [0, vocab_size) up to a modulo bias below vocab_size / 2**32.
  random_ids = (bits[2] % jnp.uint32(vocab_size)).astype(input_ids.dtype)
  corrupted = jnp.where(to_mask, jnp.asarray(mask_id, input_ids.dtype), input_ids)
  corrupted = jnp.where(to_random, random_ids, corrupted)

  out = dict(input_ids=corrupted, labels=input_ids, weights=selected.astype(jnp.float32))
  if max_predictions is not None:
    M = int(max_predictions)
    # Stable sort of "not selected": selected positions first, in increasing order.
    order = jnp.argsort(~selected, axis=1, stable=True).astype(jnp.int32)
    if M <= T:
      positions = order[:, :M]
    else:
      positions = jnp.concatenate([order, jnp.zeros((B, M - T), jnp.int32)], axis=1)
    n_sel = jnp.sum(selected, axis=1, dtype=jnp.int32)
    valid = jnp.arange(M, dtype=jnp.int32)[None, :] < n_sel[:, None]
    positions = jnp.where(valid, positions, 0)
    out["masked_positions"] = positions
    out["masked_labels"] = jnp.where(
        valid, jnp.take_along_axis(input_ids, positions, axis=1), 0).astype(input_ids.dtype)
    out["masked_weights"] = valid.astype(jnp.float32)
  return out

