"""Batch specs: the arrays an objective reads, and how to synthesise valid ones.

An objective's `batch_spec()` names every array its transform and loss read from a
pipeline batch (per-row shape, dtype) and how to fill such arrays with valid values, so
tools that run a step without the data pipeline (`launch.bench`, `launch.aot`) build
batches for any objective from the spec alone, and the trainer checks and trims the
pipeline's batches with it.

Synthetic rows are described by a layout: for each row, the lengths of the documents
packed into it (special tokens included; an empty list is an all-padding row), and the
row width. `text_rows` fills the text fields the way the data pipeline does (documents
as [CLS] ... [SEP], or [CLS] A [SEP] B [SEP] for sentence pairs, numbered 1, 2, ... by
`segment_ids`, padding marked special).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Sequence, Tuple, Union

import jax
import numpy as np

Layout = Sequence[Sequence[int]]  # per row: the lengths of the documents packed into it
Synthesizer = Callable[[Layout, int, np.random.RandomState], Dict[str, np.ndarray]]

SEQ = "T"  # a per-row shape entry that stands for the row width (sequence length)
# a second row width, cut apart from SEQ's: a pair task's second text role (the embedding
# task's documents, while its short queries keep their own width)
SEQ2 = "T2"
WIDTHS = (SEQ, SEQ2)


@dataclasses.dataclass(frozen=True)
class Field:
  """One batch array: its shape per row (ints, or SEQ for the sequence length) and dtype."""
  shape: Tuple[Union[int, str], ...]
  dtype: str
  doc: str = ""

  def row_shape(self, seq_len: int) -> Tuple[int, ...]:
    return tuple(seq_len if d in WIDTHS else int(d) for d in self.shape)


class BatchSpec:
  """The fields an objective reads, and a synthesizer of valid values for them."""

  def __init__(self, fields: Dict[str, Field], synthesize: Synthesizer):
    self.fields = dict(fields)
    self._synthesize = synthesize

  def names(self) -> List[str]:
    return list(self.fields)

  def shapes(self, batch: int, seq_len: int):
    """{name: jax.ShapeDtypeStruct} of a batch of `batch` rows of `seq_len` tokens."""
    return {k: jax.ShapeDtypeStruct((batch,) + f.row_shape(seq_len), np.dtype(f.dtype))
            for k, f in self.fields.items()}

  def synthesize(self, layout: Layout, width: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """Valid host arrays for `layout` (rows of document lengths) at row width `width`."""
    for r, docs in enumerate(layout):
      if sum(docs) > width or any(n < 2 for n in docs):
        raise ValueError(f"row {r}: documents {list(docs)} do not fit a row of {width} "
                         "(each needs >= 2 tokens for its special tokens)")
    out = self._synthesize(layout, width, np.random.RandomState(seed))
    out = {k: out[k] for k in self.fields}  # exactly the spec's fields
    self.check(out)
    return out

  def select(self, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The spec's fields of a pipeline batch (which may carry more), checked."""
    missing = [k for k in self.fields if k not in batch]
    if missing:
      raise ValueError(f"the batch lacks {missing} (it has {sorted(batch)}): the data "
                       "pipeline's rows do not fit this objective")
    out = {k: batch[k] for k in self.fields}
    self.check(out)
    return out

  def check(self, batch: Dict[str, np.ndarray]):
    """Raises ValueError naming a field whose shape or dtype kind is not the spec's."""
    rows, seq = None, {}  # width symbol -> its length in this batch
    for k, f in self.fields.items():
      x = batch[k]
      shape = tuple(np.shape(x))
      if len(shape) != len(f.shape) + 1:
        raise ValueError(f"batch field {k!r} has shape {shape}; expected (rows,) + "
                         f"{f.shape}")
      rows = shape[0] if rows is None else rows
      if shape[0] != rows:
        raise ValueError(f"batch field {k!r} has {shape[0]} rows, others have {rows}")
      for d, n in zip(f.shape, shape[1:]):
        if d in WIDTHS:
          seq.setdefault(d, n)
          if n != seq[d]:
            raise ValueError(f"batch field {k!r} has length {n}, others have {seq[d]}")
        elif n != d:
          raise ValueError(f"batch field {k!r} has shape {shape}; expected (rows,) + "
                           f"{f.shape}")
      want = np.dtype(f.dtype)
      got = np.dtype(getattr(x, "dtype", np.asarray(x).dtype))
      if got.kind != want.kind and not (want.kind in "iu" and got.kind in "iu"):
        raise ValueError(f"batch field {k!r} has dtype {got}, expected {want}")


# ---------------------------------------------------------------------------- text rows

TEXT_FIELDS = {
    "input_ids": Field((SEQ,), "int32", "token ids"),
    "segment_ids": Field((SEQ,), "int32", "1, 2, ... per packed document; 0 = padding"),
    "token_type_ids": Field((SEQ,), "int32", "0 for sentence A, 1 for sentence B"),
    "special_tokens_mask": Field((SEQ,), "bool", "True at special tokens and padding"),
}
WORD_STARTS = Field((SEQ,), "bool", "True at the first piece of each word")


def text_rows(layout: Layout, width: int, tokenizer, rng: np.random.RandomState,
              pair: bool = False) -> Dict[str, np.ndarray]:
  """The text fields (and word_starts) of rows of documents with random non-special ids.

  `tokenizer` gives vocab_size and the special ids (cls_id, sep_id, pad_id and
  `special_ids`). With `pair`, a document of 5 or more tokens is a sentence pair split in
  the middle ([CLS] A [SEP] B [SEP], B with token type 1).
  """
  b = len(layout)
  out = {"input_ids": np.full((b, width), tokenizer.pad_id, np.int32),
         "segment_ids": np.zeros((b, width), np.int32),
         "token_type_ids": np.zeros((b, width), np.int32),
         "special_tokens_mask": np.ones((b, width), bool),
         "word_starts": np.zeros((b, width), bool)}
  specials = np.asarray(sorted(set(tokenizer.special_ids)))
  regular = np.setdiff1d(np.arange(tokenizer.vocab_size), specials)
  if regular.size == 0:
    raise ValueError("the vocabulary has no regular (non-special) token")
  for r, docs in enumerate(layout):
    p = 0
    for seg, n in enumerate(docs, 1):
      n = int(n)
      sl = slice(p, p + n)
      ids = regular[rng.randint(0, regular.size, n)].astype(np.int32)
      special = np.zeros(n, bool)
      types = np.zeros(n, np.int32)
      ids[0], ids[-1] = tokenizer.cls_id, tokenizer.sep_id
      special[0] = special[-1] = True
      if pair and n >= 5:
        mid = n // 2
        ids[mid] = tokenizer.sep_id
        special[mid] = True
        types[mid + 1:] = 1
      out["input_ids"][r, sl] = ids
      out["segment_ids"][r, sl] = seg
      out["token_type_ids"][r, sl] = types
      out["special_tokens_mask"][r, sl] = special
      out["word_starts"][r, sl] = special | (rng.rand(n) < 0.75)
      p += n
  return out


def pair_labels(layout: Layout, rng: np.random.RandomState) -> np.ndarray:
  """Random 0/1 labels per row; -1 (counted nowhere) for all-padding rows."""
  labels = rng.randint(0, 2, len(layout)).astype(np.int32)
  return np.where([len(d) > 0 for d in layout], labels, -1).astype(np.int32)
