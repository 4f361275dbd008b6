"""Tests of the one pair builder (launch/data/pairs.py): NSP and SOP labelling."""
import collections

import numpy as np
import pytest

from launch import data
from launch.data import pairs
from tests.launch.data_helpers import rows_of, spm, spm_config, spm_path, take  # noqa: F401


def _check_pair_row(row, spm, seq_len):
  """Asserts the [CLS] A [SEP] B [SEP] layout of one row; returns (A, B) ids."""
  ids, types, seg = row["input_ids"], row["token_type_ids"], row["segment_ids"]
  n = int((seg > 0).sum())
  assert 5 <= n <= seq_len
  assert (seg[:n] == 1).all() and (seg[n:] == 0).all()
  np.testing.assert_array_equal(row["position_ids"][:n], np.arange(n))
  assert ids[0] == spm.cls_id and ids[n - 1] == spm.sep_id
  seps = np.flatnonzero(ids[:n] == spm.sep_id)
  assert len(seps) == 2
  first = seps[0]
  assert 1 <= first <= n - 3
  assert (types[:first + 1] == 0).all() and (types[first + 1:n] == 1).all()
  assert (types[n:] == 0).all() and (ids[n:] == spm.pad_id).all()
  special = np.zeros((seq_len,), bool)
  special[[0, first, n - 1]] = True
  special[n:] = True
  np.testing.assert_array_equal(row["special_tokens_mask"], special)
  assert row["word_starts"][[1, first + 1]].all()
  return ids[1:first], ids[first + 1:n - 1]


def _streams(spm, config):
  """Each training document's tokens (as the pipeline tokenizes them), as bytes."""
  tok = data.tokenize_documents(spm, data.load_documents(config.data)[0], "sentence")
  return tok, [tok.document(d).tobytes() for d in range(tok.num_documents)]


def _contiguous(first, second, streams):
  """Is `first` then `second` a contiguous span of one document?"""
  span = np.concatenate([first, second]).astype(np.int32).tobytes()
  return any(span in s for s in streams)


# -------------------------------------------------------------------------------- nsp


def test_pairs_rows_and_next_sentence_labels(spm, spm_path):
  seq_len = 64
  c = spm_config(spm_path, seq_len=seq_len, packing="pairs", global_batch=16, nsp_prob=0.5)
  p = data.make_pipeline(c, None, process_index=0, process_count=1)
  assert p.label_key == "next_sentence_label"
  batches = take(p.train_iter(), 80)
  assert batches[0]["next_sentence_label"].shape == (16,)
  assert batches[0]["next_sentence_label"].dtype == np.int32
  assert "sentence_order_label" not in batches[0]
  _, streams = _streams(spm, c)

  labels, contiguous = [], collections.Counter()
  for row in rows_of(batches):
    a, b = _check_pair_row(row, spm, seq_len)
    label = int(row["next_sentence_label"])
    labels.append(label)
    contiguous[label] += _contiguous(a, b, streams)
  labels = np.array(labels)
  assert abs(labels.mean() - 0.5) < 0.06, labels.mean()
  # "Is next": A then B is running text of one document; "random": almost never.
  assert contiguous[0] == (labels == 0).sum()
  assert contiguous[1] < 0.05 * (labels == 1).sum()


def test_pairs_nsp_prob_is_respected(spm_path):
  c = spm_config(spm_path, packing="pairs", global_batch=16, nsp_prob=0.0)
  p = data.make_pipeline(c, None, process_index=0, process_count=1)
  assert not any(b["next_sentence_label"].any() for b in take(p.train_iter(), 10))


# -------------------------------------------------------------------------------- sop


def test_sop_pairs_are_adjacent_segments_of_one_document(spm, spm_path):
  seq_len = 64
  c = spm_config(spm_path, seq_len=seq_len, packing="pairs", pair_task="sop")
  tok, streams = _streams(spm, c)
  rows = pairs.build_pairs(tok, spm, seq_len, task="sop", seed=0)
  assert rows.label_key == "sentence_order_label"
  labels, in_order_as_read = [], 0
  rng = np.random.default_rng(0)
  for i in range(min(len(rows), 1500)):
    row = rows(i, rng)
    assert "next_sentence_label" not in row
    a, b = _check_pair_row(row, spm, seq_len)
    assert len(a) and len(b)
    label = int(row["sentence_order_label"])
    assert row["sentence_order_label"].dtype == np.int32 and label in (0, 1)
    labels.append(label)
    # The instance belongs to one document: A and B lie in it, adjacent. In order, A then
    # B is running text; swapped, B then A is.
    doc = streams[int(rows.inst_doc[i])]
    first, second = (b, a) if label else (a, b)
    assert np.concatenate([first, second]).astype(np.int32).tobytes() in doc, i
    in_order_as_read += label and _contiguous(a, b, streams)
  labels = np.array(labels)
  assert len(labels) > 500
  assert abs(labels.mean() - pairs.SOP_SWAP_PROB) < 0.06, labels.mean()
  # A swapped pair read as it stands is almost never running text.
  assert in_order_as_read < 0.05 * labels.sum()


def test_sop_through_the_pipeline(spm, spm_path):
  c = spm_config(spm_path, packing="pairs", pair_task="sop", global_batch=16)
  p = data.make_pipeline(c, None, process_index=0, process_count=1)
  assert p.label_key == "sentence_order_label"
  batches = take(p.train_iter(), 20)
  assert all("next_sentence_label" not in b for b in batches)
  labels = np.concatenate([b["sentence_order_label"] for b in batches])
  assert labels.dtype == np.int32 and set(labels.tolist()) == {0, 1}
  _, streams = _streams(spm, c)
  for row in rows_of(batches):
    a, b = _check_pair_row(row, spm, 64)
    first, second = (b, a) if row["sentence_order_label"] else (a, b)
    assert _contiguous(first, second, streams)


def test_pair_task_changes_the_stream_fingerprint(spm_path):
  nsp = data.make_pipeline(spm_config(spm_path, packing="pairs"), None, process_index=0,
                           process_count=1)
  sop = data.make_pipeline(spm_config(spm_path, packing="pairs", pair_task="sop"), None,
                           process_index=0, process_count=1)
  assert nsp.fingerprint != sop.fingerprint


def test_sop_needs_one_document_nsp_two(spm):
  tok = data.tokenize_documents(spm, ["One line of text here.\nAnd the next line of it."],
                                "sentence")
  rows = pairs.build_pairs(tok, spm, 32, task="sop")
  assert len(rows) >= 1
  row = rows(0, np.random.default_rng(0))
  assert int(row["sentence_order_label"]) in (0, 1)
  with pytest.raises(ValueError, match="at least 2 documents"):
    pairs.build_pairs(tok, spm, 32, task="nsp")
  with pytest.raises(ValueError, match="data.pair_task"):
    pairs.build_pairs(tok, spm, 32, task="order")


# ------------------------------------------------------------------------- truncation


@pytest.mark.parametrize("la, lb, limit", [(3, 4, 10), (30, 4, 10), (4, 30, 10),
                                           (30, 30, 10), (9, 8, 11), (1, 50, 5)])
def test_truncate_pair_keeps_the_junction(la, lb, limit):
  a, b = np.arange(la), 1000 + np.arange(lb)
  ta, tb = pairs.truncate_pair(a, b, limit)
  assert len(ta) + len(tb) == min(la + lb, limit)
  assert len(ta) >= 1 and len(tb) >= 1
  # A keeps its end and B its start: the text around A|B stays.
  np.testing.assert_array_equal(ta, a[la - len(ta):])
  np.testing.assert_array_equal(tb, b[:len(tb)])
