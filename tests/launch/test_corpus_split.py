"""The default corpus's held-out split: no held-out passage appears in training.

Overlap is measured with a cheap whitespace tokenization (independent of the pipeline's
hashing): the fraction of held-out words covered by a run of N words that also occurs
in a training document. Measured on Python 3.11's standard library with eval_fraction 0.02, the
default (0.05 in parentheses): a plain random document split leaves 29% (29%) of held-out
words inside a shared 13-word span, 28% (27%) at 20 words; grouping alone 19% (15%), the
rest mostly pydoc topics repeating each other; grouped and decontaminated 0% at 13 and 20
words and 0.5% (0.3%) at 8.
"""
import collections

import numpy as np
import pytest

from launch import data
from launch.data import corpus
from launch.data import split
from tests.launch.data_helpers import make_config


def covered_fraction(train, held_out, n):
  """Fraction of held-out words inside a run of `n` words that also occurs in training."""
  seen = set()
  for doc in train:
    w = doc.split()
    seen.update(tuple(w[i:i + n]) for i in range(len(w) - n + 1))
  total = covered = 0
  for doc in held_out:
    w = doc.split()
    hit = np.zeros((len(w),), bool)
    for i in range(len(w) - n + 1):
      if tuple(w[i:i + n]) in seen:
        hit[i:i + n] = True
    total += len(w)
    covered += int(hit.sum())
  return covered / max(1, total)


@pytest.fixture(scope="module")
def default_split():
  c = make_config(max_documents=-1, eval_fraction=0.05)
  return data.load_documents(c.data)


@pytest.mark.slow  # default-suite time; the feature keeps a faster test by default
def test_random_split_is_contaminated_the_measure_sees_it():
  # The check below would catch the old split: the measure is not vacuous.
  train, held_out = split.random_holdout(corpus.default_documents(), 0.05)
  assert covered_fraction(train, held_out, 13) > 0.10


def test_held_out_text_does_not_appear_in_training(default_split):
  train, held_out = default_split
  words = sum(len(d.split()) for d in held_out)
  assert len(held_out) >= 20 and words > 10_000  # still a useful held-out set
  assert covered_fraction(train, held_out, 20) < 0.002
  assert covered_fraction(train, held_out, 13) < 0.005
  assert covered_fraction(train, held_out, 8) < 0.02


def test_groups_fall_on_one_side():
  docs = corpus.grouped_documents()
  groups = [g for _, g in docs]
  is_eval = split.grouped_holdout(groups, 0.05)
  train_groups = {g for g, e in zip(groups, is_eval) if not e}
  eval_groups = {g for g, e in zip(groups, is_eval) if e}
  assert eval_groups and not train_groups & eval_groups
  assert abs(is_eval.sum() - round(0.05 * len(docs))) <= 1
  # A module's reference page and its source share the group (its top-level package):
  # many groups hold both kinds, and none is split.
  code = set(corpus.code_documents())
  by_group = collections.defaultdict(set)
  for text, g in docs:
    by_group[g].add("code" if text in code else
                    "reference" if text.startswith("Module ") else "other")
  both = [g for g, kinds in by_group.items() if {"code", "reference"} <= kinds]
  assert len(both) > 50 and "json" in both
  # Same seed, same split.
  np.testing.assert_array_equal(split.grouped_holdout(groups, 0.05), is_eval)


def test_held_out_documents_are_paragraphs_of_held_out_groups(default_split):
  train, held_out = default_split
  docs = corpus.grouped_documents()
  is_eval = split.grouped_holdout([g for _, g in docs], 0.05)
  assert train == [t for (t, _), e in zip(docs, is_eval) if not e]
  originals = [t for (t, _), e in zip(docs, is_eval) if e]
  source_paragraphs = {p.strip("\n") for t in originals for p in split._paragraphs(t)}  # pylint: disable=protected-access
  for doc in held_out:
    for p in doc.split("\n\n"):
      assert p in source_paragraphs


def test_decontaminate_drops_shared_paragraphs():
  shared = " ".join(f"w{i}" for i in range(20))
  train = [f"intro words here\n\n{shared} and more", "Short heading"]
  held_out = [f"fresh text one\n\nsome {shared} tail\n\nfresh text two",
              "Short heading\n\nanother fresh paragraph", shared]
  assert split.decontaminate(train, held_out) == [
      "fresh text one\n\nfresh text two", "another fresh paragraph"]
  assert split.decontaminate(train, []) == []
