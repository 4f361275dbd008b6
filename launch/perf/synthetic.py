"""Synthetic batches for any objective, from its batch spec (objectives/spec.py), for the
tools that run a step without the data pipeline (launch.bench, launch.aot).

A layout says which documents fill each row (their lengths, special tokens included);
the objective's spec turns a layout into valid arrays. Layouts here: full-length rows,
variable-length documents packed first-fit into rows, or one document per row padded to
the batch maximum.
"""
import dataclasses
from typing import Dict, List, Sequence

import jax
import numpy as np

from launch.trainer import sharding

FIRST_REGULAR_ID = 6  # ids below are reserved for the synthetic special tokens
MIN_DOC_LEN = 8


@dataclasses.dataclass
class SyntheticTokenizer:
  """What the trainer and objectives need of a tokenizer, without one: the vocabulary
  size and the special ids (the model's pad id; the other specials are small ids)."""
  vocab_size: int
  pad_id: int
  cls_id: int
  sep_id: int
  mask_id: int
  unk_id: int

  @classmethod
  def for_model(cls, model_config) -> "SyntheticTokenizer":
    pad = int(model_config.pad_token_id)
    others = [i for i in range(FIRST_REGULAR_ID) if i != pad]
    return cls(vocab_size=int(model_config.vocab_size), pad_id=pad, cls_id=others[0],
               sep_id=others[1], mask_id=others[2], unk_id=others[3])

  @property
  def special_ids(self):
    return (self.cls_id, self.sep_id, self.pad_id, self.mask_id, self.unk_id)

  def decode(self, ids) -> str:
    return " ".join(f"<{int(i)}>" for i in ids)


# ---------------------------------------------------------------------------- layouts


def doc_lengths(spec: str, count: int, seq: int, seed: int = 0) -> np.ndarray:
  """Document lengths (special tokens included) from `uniform:LO:HI`,
  `lognormal:MEDIAN:SIGMA` or `fixed:N`, clipped to [MIN_DOC_LEN, seq]."""
  rng = np.random.RandomState(seed)
  kind, *args = spec.split(":")
  try:
    vals = [float(a) for a in args]
  except ValueError:
    vals = None
  if kind == "uniform" and vals and len(vals) == 2:
    n = rng.randint(int(vals[0]), int(vals[1]) + 1, count)
  elif kind == "lognormal" and vals and len(vals) == 2:
    n = np.round(vals[0] * np.exp(vals[1] * rng.randn(count)))
  elif kind == "fixed" and vals and len(vals) == 1:
    n = np.full(count, vals[0])
  else:
    raise ValueError(f"--packed={spec!r}: use uniform:LO:HI, lognormal:MEDIAN:SIGMA or "
                     "fixed:N")
  return np.clip(n, MIN_DOC_LEN, seq).astype(np.int64)


def pack_first_fit(lengths: Sequence[int], seq: int) -> List[List[int]]:
  """Document indices per row: each document goes to the first row with room."""
  rows, room = [], []
  for i, n in enumerate(lengths):
    for r, free in enumerate(room):
      if free >= n:
        rows[r].append(i)
        room[r] -= n
        break
    else:
      rows.append([i])
      room.append(seq - n)
  return rows


def packed_layouts(lengths, batch: int, seq: int):
  """[(layout, width)]: documents packed first-fit into rows of `seq`, `batch` rows per
  batch; the last batch is filled up with empty rows."""
  rows = [[int(lengths[d]) for d in docs] for docs in pack_first_fit(lengths, seq)]
  out = []
  for s in range(0, len(rows), batch):
    group = rows[s:s + batch]
    out.append((group + [[] for _ in range(batch - len(group))], seq))
  return out


def padded_layouts(lengths, batch: int, seq: int, pad_multiple: int):
  """[(layout, width)]: one document per row, `batch` documents per batch in the given
  order, padded to the longest of the batch rounded up to `pad_multiple` (<= `seq`)."""
  out = []
  for s in range(0, len(lengths), batch):
    group = [int(n) for n in lengths[s:s + batch]]
    width = min(seq, -(-max(group) // pad_multiple) * pad_multiple)
    out.append(([[n] for n in group] + [[] for _ in range(batch - len(group))], width))
  return out


# ---------------------------------------------------------------------------- batches


def full_batch(objective, batch: int, seq: int, seed: int = 0) -> Dict[str, np.ndarray]:
  """`batch` rows of one full-length document each, valid for `objective`."""
  return objective.batch_spec().synthesize([[seq]] * batch, seq, seed)


def batches(objective, layouts, seed: int = 0) -> List[Dict[str, np.ndarray]]:
  spec = objective.batch_spec()
  return [spec.synthesize(layout, width, seed + i) for i, (layout, width) in
          enumerate(layouts)]


def row_sharded(shapes, batch_sharding):
  """ShapeDtypeStructs of `shapes` (a dict of arrays or shape structs) with their rows
  sharded like the trainer's batches and every other dim replicated."""
  return {k: jax.ShapeDtypeStruct(v.shape, v.dtype,
                                  sharding=sharding.row_sharding(batch_sharding, len(v.shape)))
          for k, v in shapes.items()}


def abstract_batch(objective, batch: int, seq: int, batch_sharding):
  """ShapeDtypeStructs of a batch of `objective`'s spec, rows sharded like the trainer's."""
  return row_sharded(objective.batch_spec().shapes(batch, seq), batch_sharding)
