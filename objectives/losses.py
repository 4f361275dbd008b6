"""Losses and summable metrics for the pretraining objectives.

Every loss function returns `(loss, metrics)`:

- `loss` is the weighted mean cross-entropy over this call's batch (for callers that
  train on one batch at a time; the pretraining trainer differentiates the SUM
  `<prefix>_loss_sum` divided by the normalizer of the whole global batch instead, so
  gradient accumulation is exact: objectives/base.py);
- `metrics` holds SUMS only, so they add up exactly across gradient-accumulation
  micro-steps, devices and eval batches. Keys are `<prefix>_loss_sum`,
  `<prefix>_correct_sum` and `<prefix>_weight_sum` (the number, or total weight, of
  the positions / examples that count). `finalize_metrics` turns summed dicts into
  means: `<prefix>_loss`, `<prefix>_accuracy` and `<prefix>_count`.

Everything is computed in float32 whatever the logits' dtype. Positions with weight 0
never contribute to loss, metrics or gradient, whatever their logits or labels are
(labels there may even be out of range, e.g. -100).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "argmax_equals",
    "weighted_cross_entropy",
    "mlm_loss_and_metrics",
    "nsp_loss_and_metrics",
    "sop_loss_and_metrics",
    "sequence_classification_loss",
    "add_metrics",
    "finalize_metrics",
]


def argmax_equals(logits, labels, row_max=None):
  """`jnp.argmax(logits, -1) == labels`, exactly (the first maximal index wins ties; a row
  with a NaN predicts its first NaN), with plain reductions instead of an argmax.

  The label is the argmax iff the label's entry is a row maximum (or a NaN, in a row with
  one) and no earlier entry is. Both are elementwise tests against the row's maximum
  reduced over the last axis, so XLA fuses them with the cross-entropy's own sums into
  one pass over the logits. (XLA's argmax is a (value, index) variadic reduce: on the CPU
  it does not vectorise, 26 of ~380 thread-ms of the main job's step on 2026-12-05; on
  TPU the former fast path's `lax.cond` kept a copy of the (B, M, V) float32 logits.)
  logits (..., C) float; labels (...) integer, in range; `row_max`, if given, is
  `jnp.max(logits, -1, keepdims=True)`. Returns a bool array (...).
  """
  m = jnp.max(logits, axis=-1, keepdims=True) if row_max is None else row_max
  at_max = (logits == m) | (jnp.isnan(logits) & jnp.isnan(m))
  index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  label = labels[..., None].astype(jnp.int32)
  # counted as float32 sums (exact: C < 2^24), reductions of the same kind as the
  # cross-entropy's, so that XLA puts them into one multi-output fusion
  count = lambda hit: jnp.sum(jnp.where(hit, 1.0, 0.0), axis=-1)
  return (count(at_max & (index == label)) > 0) & (count(at_max & (index < label)) == 0)


def _pick_by_gather(x, labels):
  return jnp.take_along_axis(x, labels[..., None], axis=-1)[..., 0]


def _pick_by_mask(x, labels):
  index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  return jnp.sum(jnp.where(index == labels[..., None].astype(jnp.int32), x, 0.0), axis=-1)


def _rows(logits, labels, pick):
  """Per-row softmax cross-entropy, as optax computes it (log-sum-exp of the logits
  shifted by the row max, minus the label's shifted logit), and `argmax == label`, sharing
  the row max. `pick` takes the label's logit: a gather on the CPU (where a masked sum over
  the vocabulary is ~1.8x slower); elsewhere a masked sum, so that on TPU every per-row
  value is a reduction over the (B, M, V) logits after the max, which XLA fuses into few
  reads (with a gather XLA wrote a copy of them first; docs/benchmarks.md, 2026-12-07)."""
  row_max = jnp.max(logits, axis=-1, keepdims=True)
  shift = jax.lax.stop_gradient(row_max)
  ce = jnp.log(jnp.sum(jnp.exp(logits - shift), axis=-1)) - (pick(logits, labels)
                                                             - shift[..., 0])
  return ce, argmax_equals(logits, labels, row_max)


def weighted_cross_entropy(logits, labels, weights, *, prefix):
  """Weighted mean softmax cross-entropy over the last axis of `logits`.

  logits: (..., C) any float dtype; labels: (...) integer; weights: (...) or None
  (all ones). Returns (loss, {prefix_loss_sum, prefix_correct_sum, prefix_weight_sum}).
  """
  logits = jnp.asarray(logits)
  labels = jnp.asarray(labels)
  if logits.shape[:-1] != labels.shape:
    raise ValueError(
        f"{prefix}: logits shape {logits.shape} does not match labels shape "
        f"{labels.shape} (expected logits = labels.shape + (num_classes,))")
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(f"{prefix}: labels must be integer, got dtype {labels.dtype}")
  if weights is None:
    weights = jnp.ones(labels.shape, jnp.float32)
  weights = jnp.asarray(weights, jnp.float32)
  if weights.shape != labels.shape:
    raise ValueError(
        f"{prefix}: weights shape {weights.shape} != labels shape {labels.shape}")

  logits = logits.astype(jnp.float32)
  counted = weights != 0
  # Ignored positions get label 0 and are excluded with `where`, so neither their
  # labels nor non-finite logits there can leak into the sums.
  safe_labels = jnp.where(counted, labels, 0)
  ce, correct = jax.lax.platform_dependent(
      logits, safe_labels, cpu=functools.partial(_rows, pick=_pick_by_gather),
      default=functools.partial(_rows, pick=_pick_by_mask))
  loss_sum = jnp.sum(jnp.where(counted, ce * weights, 0.0))
  weight_sum = jnp.sum(weights)
  correct_sum = jnp.sum(jnp.where(counted & correct, weights, 0.0))
  loss = loss_sum / jnp.where(weight_sum > 0, weight_sum, 1.0)
  metrics = {
      f"{prefix}_loss_sum": loss_sum,
      f"{prefix}_correct_sum": correct_sum,
      f"{prefix}_weight_sum": weight_sum,
  }
  return loss, metrics


def mlm_loss_and_metrics(logits, labels, weights):
  """Masked-LM loss over the weighted positions only.

  logits: (B,T,V) over every position, or (B,M,V) gathered at `masked_positions`;
  labels / weights: the matching (B,T) `labels` / `weights` or (B,M) `masked_labels` /
  `masked_weights` from `objectives.masking.mask_tokens`.
  Metrics: mlm_loss_sum, mlm_correct_sum, mlm_weight_sum.
  """
  if jnp.ndim(logits) != 3:
    raise ValueError(f"mlm logits must be (B,T,V) or (B,M,V), got shape {jnp.shape(logits)}")
  return weighted_cross_entropy(logits, labels, weights, prefix="mlm")


def sequence_classification_loss(logits, labels, weights=None, *, prefix="cls"):
  """Cross-entropy for one label per sequence: logits (B,C), labels (B,).

  `weights` (B,) is optional (e.g. 0 for padding examples in an eval batch).
  Metrics are named `<prefix>_loss_sum`, `<prefix>_correct_sum`, `<prefix>_weight_sum`.
  """
  if jnp.ndim(logits) != 2:
    raise ValueError(f"{prefix}: logits must be (B,num_classes), got shape {jnp.shape(logits)}")
  return weighted_cross_entropy(logits, labels, weights, prefix=prefix)


def nsp_loss_and_metrics(logits, labels, weights=None):
  """Next-sentence prediction: logits (B,2), labels (B,) (1 = random next, as in HF)."""
  return sequence_classification_loss(logits, labels, weights, prefix="nsp")


def sop_loss_and_metrics(logits, labels, weights=None):
  """Sentence-order prediction: logits (B,2), labels (B,) (1 = swapped, as in HF)."""
  return sequence_classification_loss(logits, labels, weights, prefix="sop")


def add_metrics(a, b):
  """Adds two metric-sum dicts key by key (keys present in only one are kept)."""
  if not a:
    return dict(b)
  out = dict(a)
  for k, v in b.items():
    out[k] = out[k] + v if k in out else v
  return out


def finalize_metrics(sums):
  """Turns summed metrics into means.

  For every prefix with a `<prefix>_weight_sum`: `<prefix>_loss = loss_sum / weight`,
  `<prefix>_accuracy = correct_sum / weight`, `<prefix>_count = weight`, and any other
  `<prefix>_<name>_sum` becomes `<prefix>_<name>` divided by the weight. A zero weight
  gives 0. Keys that belong to no such prefix are passed through unchanged.
  Works on host values (returns Python floats) and on jax arrays (inside jit too).
  """
  use_jax = any(isinstance(v, jax.Array) for v in sums.values())
  xp = jnp if use_jax else np
  out = {}
  # Longest prefix first, so "mlm_gen_*" is not taken by "mlm".
  prefixes = sorted((k[: -len("_weight_sum")] for k in sums if k.endswith("_weight_sum")),
                    key=len, reverse=True)
  used = set()
  for p in prefixes:
    w = xp.asarray(sums[f"{p}_weight_sum"], dtype=xp.float32)
    denom = xp.where(w > 0, w, 1.0)
    out[f"{p}_count"] = w
    used.add(f"{p}_weight_sum")
    for k, v in sums.items():
      if k in used or not k.startswith(p + "_") or not k.endswith("_sum"):
        continue
      name = k[len(p) + 1: -len("_sum")]
      name = "accuracy" if name == "correct" else name
      out[f"{p}_{name}"] = xp.where(w > 0, xp.asarray(v, xp.float32) / denom, 0.0)
      used.add(k)
  if not use_jax:
    out = {k: float(v) if np.ndim(v) == 0 else np.asarray(v) for k, v in out.items()}
  for k, v in sums.items():
    if k not in used:
      out[k] = v
  return out
