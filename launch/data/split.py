"""Held-out splits: which documents are evaluated on, and keeping training text out of them.

- `random_holdout`: a fixed fraction of the documents, chosen by a fixed seed (independent
  of `data.shuffle_seed`, so runs with different seeds share one held-out set); a held-out
  document that also occurs (exactly) among the training documents is dropped.
- `grouped_holdout`: the same, but whole groups at a time (for the default corpus: a
  module's reference page and its source, and every module of one package, share a group).
- `decontaminate`: drops from the held-out documents every paragraph that shares a
  `NGRAM`-word span with the training documents (the 13-gram rule of GPT-3's
  decontamination), or, when shorter than that, equals a training paragraph. Held-out
  accuracy then measures text the model has not read, not text it memorized.
"""
from __future__ import annotations

import logging
import re
from typing import Sequence

import numpy as np

EVAL_SPLIT_SEED = 20240601
NGRAM = 13  # words (whitespace-separated) in a span that counts as a shared passage
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")
_HASH_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
log = logging.getLogger(__name__)


def num_held_out(num_documents: int, fraction: float) -> int:
  """How many of `num_documents` documents a `fraction` holds out (0 when there is none)."""
  if fraction <= 0 or num_documents < 2:
    return 0
  return min(num_documents - 1, max(1, int(round(fraction * num_documents))))


def drop_training_copies(train: Sequence[str], held_out: Sequence[str]) -> list[str]:
  """`held_out` without the documents that also occur (exactly) in `train` (warned)."""
  seen = set(train)
  kept = [d for d in held_out if d not in seen]
  if len(kept) < len(held_out):
    log.warning("held-out split: dropped %d of %d documents that also occur in the "
                "training documents", len(held_out) - len(kept), len(held_out))
  return kept


def random_holdout(docs: Sequence[str], fraction: float) -> tuple[list[str], list[str]]:
  """(train, held-out): `num_held_out` documents chosen by the fixed seed, order kept;
  held-out copies of a training document are dropped (a duplicated document would
  otherwise be evaluated on after being trained on)."""
  n_eval = num_held_out(len(docs), fraction)
  is_eval = np.zeros((len(docs),), bool)
  is_eval[np.random.default_rng(EVAL_SPLIT_SEED).permutation(len(docs))[:n_eval]] = True
  train = [d for d, e in zip(docs, is_eval) if not e]
  seen = set(train)
  held_out = [d for d, e in zip(docs, is_eval) if e and d not in seen]
  if len(held_out) < n_eval:
    log.info("held-out split: dropped %d of %d documents that also occur in training",
             n_eval - len(held_out), n_eval)
  return train, held_out


def grouped_holdout(groups: Sequence[str], fraction: float) -> np.ndarray:
  """Which documents to hold out (bool mask) so that no group is split between the sides.

  Groups are visited in a fixed random order and held out whole while they fit in
  `num_held_out(len(groups), fraction)` documents (a group that does not fit is skipped);
  if none fits, the smallest is held out. At least one group always stays in training,
  so a single group means no held-out documents.
  """
  n_eval = num_held_out(len(groups), fraction)
  names = sorted(set(groups))
  is_eval = np.zeros((len(groups),), bool)
  if n_eval == 0 or len(names) < 2:
    if n_eval:
      log.warning("all %d documents are one group (%s): no held-out documents",
                  len(groups), names[0])
    return is_eval
  members: dict[str, list[int]] = {name: [] for name in names}
  for i, g in enumerate(groups):
    members[g].append(i)
  chosen, count = [], 0
  for k in np.random.default_rng(EVAL_SPLIT_SEED).permutation(len(names)):
    size = len(members[names[k]])
    if count + size <= n_eval and len(chosen) < len(names) - 1:
      chosen.append(names[k])
      count += size
      if count == n_eval:
        break
  if not chosen:
    chosen = [min(names, key=lambda name: (len(members[name]), name))]
  for name in chosen:
    is_eval[members[name]] = True
  return is_eval


def _paragraphs(doc: str) -> list[str]:
  return [p for p in _PARAGRAPH_BREAK.split(doc) if p.strip()]


class _Words:
  """Maps words to integer ids (one vocabulary for both sides of a split)."""

  def __init__(self):
    self._ids: dict[str, int] = {}

  def __call__(self, text: str) -> np.ndarray:
    ids = self._ids
    words = text.split()
    return np.fromiter((ids.setdefault(w, len(ids)) for w in words), np.uint64, len(words))


def ngram_hashes(ids: np.ndarray, n: int) -> np.ndarray:
  """A 64-bit polynomial hash of every run of `n` consecutive ids (empty if fewer)."""
  count = len(ids) - n + 1
  if count <= 0:
    return np.zeros((0,), np.uint64)
  h = np.zeros((count,), np.uint64)
  for k in range(n):
    h = h * _HASH_MULTIPLIER + ids[k:k + count] + np.uint64(1)
  return h


def decontaminate(train: Sequence[str], held_out: Sequence[str],
                  n: int = NGRAM) -> list[str]:
  """`held_out` without the paragraphs that also occur in `train`.

  A paragraph (text between blank lines) of a held-out document is dropped when any run
  of `n` of its words (split at whitespace) also occurs in a training document, or, if it
  has fewer than `n` words, when a training paragraph has the same words. The remaining
  paragraphs of a document are joined by blank lines; documents left empty are dropped.
  """
  if not held_out:
    return []
  words = _Words()
  seen = np.unique(np.concatenate(
      [np.zeros((0,), np.uint64)] + [ngram_hashes(words(d), n) for d in train]))
  short = {tuple(p.split()) for d in train for p in _paragraphs(d) if len(p.split()) < n}
  out, dropped, kept = [], 0, 0
  for doc in held_out:
    keep = []
    for p in _paragraphs(doc):
      ids = words(p)
      if len(ids) < n:
        shared = tuple(p.split()) in short
      else:
        h = ngram_hashes(ids, n)
        at = np.minimum(np.searchsorted(seen, h), max(0, len(seen) - 1))
        shared = bool(len(seen)) and bool((seen[at] == h).any())
      if shared:
        dropped += len(ids)
      else:
        keep.append(p.strip("\n"))
        kept += len(ids)
    if keep:
      out.append("\n\n".join(keep))
  log.info("held-out decontamination: kept %d words, dropped %d shared with training "
           "(%d of %d documents left)", kept, dropped, len(out), len(held_out))
  return out
