"""Sentence pairs for `data.packing="pairs"`: one builder, a labeller per pair task.

Rows are `[CLS] A [SEP] B [SEP]`, built as BERT's create_pretraining_data does: a
document's lines (long ones cut at sentence ends) are accumulated to a target length
(T - 3, or with probability `SHORT_SEQ_PROB` a random shorter one) and split at a random
point into A and the rest. The pair task (`data.pair_task`) then labels the pair:

- `nsp` (BERT's next-sentence prediction): with probability `objective.nsp_prob`, B is
  text from another document (`next_sentence_label` 1 = random), otherwise the rest
  (0 = is next).
- `sop` (ALBERT's sentence-order prediction): B is the rest, so A and B are two
  consecutive segments of one document; with probability `SOP_SWAP_PROB` they are
  swapped (`sentence_order_label` 1 = swapped, 0 = in order, as transformers'
  `AlbertForPreTraining`).

The longer side is truncated away from the A|B junction (A loses its start, B its end)
before any swap, so an in-order pair is always running text, and so is a swapped one
read B then A. The split point, the label and a random B are drawn again in every epoch
(each row takes a numpy Generator). token_type 0 for [CLS] A [SEP], 1 for B [SEP];
segment_ids 1 on real tokens, 0 on padding; position_ids 0.. over the pair.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from launch.data import packing

PAIR_TASKS = ("nsp", "sop")
LABEL_KEYS = {"nsp": "next_sentence_label", "sop": "sentence_order_label"}
PAD_LABEL = packing.PAD_LABEL  # label of an all-padding row: weight 0 in every loss
SHORT_SEQ_PROB = 0.1  # probability of a shorter target length (as in BERT)
SOP_SWAP_PROB = 0.5  # as in ALBERT
MIN_DOCUMENTS = {"nsp": 2, "sop": 1}  # a random B needs another document


def check_task(task: str) -> str:
  if task not in PAIR_TASKS:
    raise ValueError(f"data.pair_task={task!r}; expected one of {PAIR_TASKS} (the pair "
                     "task of data.packing='pairs')")
  return task


@dataclasses.dataclass
class PairRows:
  """Pair instances: runs of segments of one document, turned into rows on access.

  seg_start/seg_len: int64 (S,) segments (lines, cut to at most seq_len - 3 tokens).
  doc_segs: int64 (D + 1,) document d owns segments doc_segs[d]:doc_segs[d + 1].
  inst_doc/inst_lo/inst_hi/inst_target: int64 (R,) instance r is segments
    inst_lo[r]:inst_hi[r] of document inst_doc[r], aimed at inst_target[r] tokens.
  """

  tokens: np.ndarray
  seg_start: np.ndarray
  seg_len: np.ndarray
  doc_segs: np.ndarray
  inst_doc: np.ndarray
  inst_lo: np.ndarray
  inst_hi: np.ndarray
  inst_target: np.ndarray
  seq_len: int
  task: str
  nsp_prob: float
  cls_id: int
  sep_id: int
  pad_id: int
  word_start: np.ndarray

  needs_rng = True  # a row draws its split point and label from a Generator

  def __len__(self) -> int:
    return len(self.inst_doc)

  @property
  def num_docs(self) -> int:
    return len(self.doc_segs) - 1

  @property
  def label_key(self) -> str:
    return LABEL_KEYS[self.task]

  def _concat(self, lo: int, hi: int) -> np.ndarray:
    return np.concatenate([self.tokens[s:s + n] for s, n in
                           zip(self.seg_start[lo:hi], self.seg_len[lo:hi])])

  def _random_b(self, row: int, doc: int, len_a: int, rng: np.random.Generator):
    """Segments of another document, from a random start, about the target length."""
    target_b = max(1, int(self.inst_target[row]) - len_a)
    other = int(rng.integers(self.num_docs - 1))
    other += other >= doc
    s_lo, s_hi = int(self.doc_segs[other]), int(self.doc_segs[other + 1])
    start = s_lo + int(rng.integers(s_hi - s_lo))
    end, total = start, 0
    while end < s_hi and total < target_b:
      total += int(self.seg_len[end])
      end += 1
    return self._concat(start, end)

  def __call__(self, row: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    doc, lo, hi = int(self.inst_doc[row]), int(self.inst_lo[row]), int(self.inst_hi[row])
    if hi - lo >= 2:
      a_end = lo + int(rng.integers(1, hi - lo))
      a, rest = self._concat(lo, a_end), self._concat(a_end, hi)
    else:
      whole = self._concat(lo, hi)
      cut = int(rng.integers(1, len(whole)))
      a, rest = whole[:cut], whole[cut:]
    if self.task == "nsp":
      label = rng.random() < self.nsp_prob
      b = self._random_b(row, doc, len(a), rng) if label else rest
      a, b = truncate_pair(a, b, self.seq_len - 3)
    else:
      a, b = truncate_pair(a, rest, self.seq_len - 3)
      label = rng.random() < SOP_SWAP_PROB
      if label:
        a, b = b, a
    out = self._row(a, b)
    out[self.label_key] = np.int32(label)
    return out

  def _row(self, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    t = self.seq_len
    na, nb = len(a), len(b)
    n = na + nb + 3
    ids = np.full((t,), self.pad_id, np.int32)
    ids[0] = self.cls_id
    ids[1:1 + na] = a
    ids[1 + na] = self.sep_id
    ids[2 + na:2 + na + nb] = b
    ids[n - 1] = self.sep_id
    types = np.zeros((t,), np.int32)
    types[2 + na:n] = 1
    seg = np.zeros((t,), np.int32)
    seg[:n] = 1
    pos = np.zeros((t,), np.int32)
    pos[:n] = np.arange(n, dtype=np.int32)
    special = np.ones((t,), bool)
    special[1:1 + na] = False
    special[2 + na:2 + na + nb] = False
    return packing.finish_row(ids, seg, pos, types, special, self.word_start)


def truncate_pair(a: np.ndarray, b: np.ndarray,
                  max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
  """Trims the longer side until both fit (ties: B); A loses its start, B its end.

  Trimming away from the A|B junction keeps an in-order pair running text.
  """
  la, lb = len(a), len(b)
  excess = la + lb - max_tokens
  if excess <= 0:
    return a, b
  longer, shorter = max(la, lb), min(la, lb)
  if longer - excess >= shorter:
    new_long, new_short = longer - excess, shorter
  else:
    new_short = max_tokens // 2
    new_long = max_tokens - new_short
  new_a, new_b = (new_long, new_short) if la > lb else (new_short, new_long)
  return a[la - new_a:], b[:new_b]


def build_pairs(tok, tokenizer, seq_len: int, *, task: str = "nsp", nsp_prob: float = 0.5,
                seed: int = 0) -> PairRows:
  """Groups each document's lines into pair instances as BERT's create_pretraining_data.

  Args:
    tok: a `launch.data.TokenizedDocuments` tokenized by sentence units.
    tokenizer: its tokenizer (special ids and the word-start table).
    seq_len: T, tokens per row (at least 5).
    task: "nsp" or "sop" (see the module docstring).
    nsp_prob: for "nsp", the probability that B comes from another document.
    seed: fixes the instance boundaries and target lengths.
  """
  check_task(task)
  if tok.num_documents < MIN_DOCUMENTS[task]:
    raise ValueError(f"pair task {task!r} needs at least {MIN_DOCUMENTS[task]} documents "
                     f"(got {tok.num_documents})")
  max_tokens = seq_len - 3
  unit_len = np.diff(tok.unit_offsets)
  n_pieces = -(-unit_len // max_tokens)
  first = np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)
  k = np.arange(n_pieces.sum()) - first
  seg_start = np.repeat(tok.unit_offsets[:-1], n_pieces) + k * max_tokens
  seg_len = np.minimum(max_tokens, np.repeat(unit_len, n_pieces) - k * max_tokens)
  unit_to_seg = np.concatenate([[0], np.cumsum(n_pieces)])
  doc_segs = unit_to_seg[tok.doc_units]

  rng = np.random.default_rng(seed)
  draw_target = lambda: (max_tokens if rng.random() >= SHORT_SEQ_PROB
                         else int(rng.integers(2, max_tokens + 1)))
  inst_doc, inst_lo, inst_hi, inst_target = [], [], [], []
  seg_len_list = seg_len.tolist()
  for d in range(tok.num_documents):
    lo, end = int(doc_segs[d]), int(doc_segs[d + 1])
    target = draw_target()
    start, total = lo, 0
    for i in range(lo, end):
      total += seg_len_list[i]
      if i == end - 1 or total >= target:
        if total >= 2:
          inst_doc.append(d)
          inst_lo.append(start)
          inst_hi.append(i + 1)
          inst_target.append(target)
        start, total = i + 1, 0
        target = draw_target()
  as64 = lambda x: np.asarray(x, np.int64)
  return PairRows(tok.tokens, seg_start, seg_len, doc_segs, as64(inst_doc), as64(inst_lo),
                  as64(inst_hi), as64(inst_target), seq_len, task, float(nsp_prob),
                  tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.word_start)
