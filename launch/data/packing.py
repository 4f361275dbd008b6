"""Rows: the per-row arrays every batch is stacked from, and document packing.

A row of T = `data.seq_len` tokens is a dict of
  input_ids int32 (T,), segment_ids int32 (T,) (0 = padding), position_ids int32 (T,),
  token_type_ids int32 (T,), special_tokens_mask bool (T,) ([CLS]/[SEP]/[PAD]: never
  masked), word_starts bool (T,) (token begins a word; the first token after [CLS] or
  [SEP] always does), plus a pair label for `packing="pairs"` (`launch.data.pairs`).

`data.packing="documents"`: each document becomes `[CLS] tokens [SEP]`, cut into pieces
of at most T - 2 tokens each wrapped the same way; pieces are packed into rows best-fit
(largest first). `segment_ids` number the pieces in a row 1, 2, ... (0 = padding),
`position_ids` restart at 0 in every piece, `token_type_ids` are 0.

`padding_row` is a row that holds nothing (all [PAD], segment 0, every token special, no
word starts, pair label -1): it fills the last partial evaluation batch, and counts in no
loss or metric.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from launch.data import tokenization
from launch.data.tokenized import TokenizedDocuments

PAD_LABEL = -1  # the pair label of a padding row: not counted


def finish_row(ids, seg, pos, types, special, word_start_table) -> dict[str, np.ndarray]:
  """The row dict of one row's arrays; word starts from the tokenizer's table."""
  starts = word_start_table[ids] | special
  starts[1:] |= special[:-1]
  return {"input_ids": ids, "segment_ids": seg, "position_ids": pos,
          "token_type_ids": types, "special_tokens_mask": special, "word_starts": starts}


def padding_row(seq_len: int, pad_id: int, label_key: str | None = None
                ) -> dict[str, np.ndarray]:
  """A row of padding only; with `label_key`, its pair label is `PAD_LABEL`."""
  row = {"input_ids": np.full((seq_len,), pad_id, np.int32),
         "segment_ids": np.zeros((seq_len,), np.int32),
         "position_ids": np.zeros((seq_len,), np.int32),
         "token_type_ids": np.zeros((seq_len,), np.int32),
         "special_tokens_mask": np.ones((seq_len,), bool),
         "word_starts": np.zeros((seq_len,), bool)}
  if label_key:
    row[label_key] = np.int32(PAD_LABEL)
  return row


@dataclasses.dataclass
class DocumentRows:
  """Packed rows of `[CLS] chunk [SEP]` pieces, built on access.

  chunk_start/chunk_len: int64 (C,) the content tokens of each piece.
  row_offsets: int64 (R + 1,) row r holds pieces row_chunks[row_offsets[r]:row_offsets[r+1]].
  """

  tokens: np.ndarray
  chunk_start: np.ndarray
  chunk_len: np.ndarray
  row_offsets: np.ndarray
  row_chunks: np.ndarray
  seq_len: int
  cls_id: int
  sep_id: int
  pad_id: int
  word_start: np.ndarray

  label_key = None  # rows of documents carry no label
  needs_rng = False  # a row depends on its index only

  def __len__(self) -> int:
    return len(self.row_offsets) - 1

  def __call__(self, row: int) -> dict[str, np.ndarray]:
    t = self.seq_len
    ids = np.full((t,), self.pad_id, np.int32)
    seg = np.zeros((t,), np.int32)
    pos = np.zeros((t,), np.int32)
    special = np.ones((t,), bool)
    p = 0
    for k, c in enumerate(self.row_chunks[self.row_offsets[row]:self.row_offsets[row + 1]]):
      s, n = self.chunk_start[c], self.chunk_len[c]
      ids[p] = self.cls_id
      ids[p + 1:p + 1 + n] = self.tokens[s:s + n]
      ids[p + 1 + n] = self.sep_id
      seg[p:p + n + 2] = k + 1
      pos[p:p + n + 2] = np.arange(n + 2, dtype=np.int32)
      special[p + 1:p + 1 + n] = False
      p += n + 2
    return finish_row(ids, seg, pos, np.zeros((t,), np.int32), special, self.word_start)

  @property
  def content_tokens(self) -> int:
    """Tokens in all rows that are not padding ([CLS] and [SEP] included)."""
    return 2 * len(self.chunk_len) + int(self.chunk_len.sum())


def pack_documents(tok: TokenizedDocuments, tokenizer: tokenization.Tokenizer,
                   seq_len: int) -> DocumentRows:
  """Cuts documents into `[CLS] <= seq_len - 2 tokens [SEP]` pieces, packs them best-fit."""
  body = seq_len - 2
  doc_start = tok.unit_offsets[tok.doc_units[:-1]]
  doc_len = tok.unit_offsets[tok.doc_units[1:]] - doc_start
  n_chunks = -(-doc_len // body)
  first = np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
  k = np.arange(n_chunks.sum()) - first
  chunk_start = np.repeat(doc_start, n_chunks) + k * body
  chunk_len = np.minimum(body, np.repeat(doc_len, n_chunks) - k * body)

  full = np.flatnonzero(chunk_len == body)
  rows = [[int(c)] for c in full]
  partial = np.flatnonzero(chunk_len < body)
  partial = partial[np.argsort(-chunk_len[partial], kind="stable")]
  free_count = np.zeros((seq_len + 1,), np.int64)  # open rows by remaining capacity
  free_rows: list[list[int]] = [[] for _ in range(seq_len + 1)]
  for c in partial:
    need = int(chunk_len[c]) + 2
    fits = np.flatnonzero(free_count[need:])
    if len(fits):
      cap = need + int(fits[0])
      r = free_rows[cap].pop()
      free_count[cap] -= 1
      rows[r].append(int(c))
    else:
      cap = seq_len
      r = len(rows)
      rows.append([int(c)])
    left = cap - need
    if left >= 3:
      free_rows[left].append(r)
      free_count[left] += 1
  row_offsets = np.zeros((len(rows) + 1,), np.int64)
  np.cumsum([len(r) for r in rows], out=row_offsets[1:])
  row_chunks = np.fromiter((c for r in rows for c in r), np.int64, count=int(row_offsets[-1]))
  return DocumentRows(tok.tokens, chunk_start, chunk_len, row_offsets, row_chunks, seq_len,
                      tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id,
                      tokenizer.word_start)
