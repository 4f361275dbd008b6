"""Documents as token ids: tokenized once, cached in the run directory.

Documents are tokenized whole (`unit="document"`, for packing) or line by line
(`unit="sentence"`, for pairs: long lines are cut at sentence ends). Special-token ids
that appear inside document text are replaced by [UNK], so [CLS]/[SEP]/[PAD]/[MASK] only
ever mark structure. Token ids are cached in `<workdir>/data_cache/<hash>.npz`.
"""
from __future__ import annotations

import dataclasses
import io
import logging
import os
import re
from typing import Sequence

import numpy as np
from etils import epath

from launch.data import tokenization

UNITS = ("document", "sentence")
MAX_UNIT_CHARS = 300  # sentence units: lines longer than this are cut at sentence ends
_TOKENIZE_CHUNK = 2048
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")
log = logging.getLogger(__name__)


@dataclasses.dataclass
class TokenizedDocuments:
  """Token ids of documents, split into units (whole documents or sentence-ish lines).

  tokens: int32 (N,) all content tokens, no special tokens.
  unit_offsets: int64 (U + 1,) unit u is tokens[unit_offsets[u]:unit_offsets[u + 1]].
  doc_units: int64 (D + 1,) document d is units doc_units[d]:doc_units[d + 1].
  """

  tokens: np.ndarray
  unit_offsets: np.ndarray
  doc_units: np.ndarray

  @property
  def num_documents(self) -> int:
    return len(self.doc_units) - 1

  @property
  def num_tokens(self) -> int:
    return len(self.tokens)

  def document(self, d: int) -> np.ndarray:
    """All tokens of document d, in order."""
    lo = self.unit_offsets[self.doc_units[d]]
    hi = self.unit_offsets[self.doc_units[d + 1]]
    return self.tokens[lo:hi]

  def to_arrays(self, prefix: str) -> dict[str, np.ndarray]:
    return {f"{prefix}_tokens": self.tokens, f"{prefix}_unit_offsets": self.unit_offsets,
            f"{prefix}_doc_units": self.doc_units}

  @classmethod
  def from_arrays(cls, prefix: str, arrays: dict[str, np.ndarray]) -> "TokenizedDocuments":
    return cls(arrays[f"{prefix}_tokens"], arrays[f"{prefix}_unit_offsets"],
               arrays[f"{prefix}_doc_units"])


def _sentence_units(doc: str) -> list[str]:
  units = []
  for line in doc.splitlines():
    line = line.strip()
    if not line:
      continue
    if len(line) > MAX_UNIT_CHARS:
      units.extend(s for s in _SENTENCE_END.split(line) if s.strip())
    else:
      units.append(line)
  return units


def tokenize_documents(tokenizer: tokenization.Tokenizer, docs: Sequence[str],
                       unit: str) -> TokenizedDocuments:
  """Tokenizes `docs` whole (`unit="document"`) or line by line (`unit="sentence"`).

  Units that tokenize to nothing are dropped, and so are documents left without units.
  """
  if unit not in UNITS:
    raise ValueError(f"unit={unit!r}; expected one of {UNITS}")
  structural = np.array([tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id,
                         tokenizer.mask_id])
  pieces, unit_lengths, doc_counts = [], [], []
  for lo in range(0, len(docs), _TOKENIZE_CHUNK):
    batch = docs[lo:lo + _TOKENIZE_CHUNK]
    if unit == "document":
      units_per_doc = [[d] for d in batch]
    else:
      units_per_doc = [_sentence_units(d) for d in batch]
    flat = [u for units in units_per_doc for u in units]
    encoded = tokenizer.encode_batch(flat)
    k = 0
    for units in units_per_doc:
      count = 0
      for ids in encoded[k:k + len(units)]:
        if ids:
          pieces.append(np.asarray(ids, np.int32))
          unit_lengths.append(len(ids))
          count += 1
      k += len(units)
      if count:
        doc_counts.append(count)
  tokens = np.concatenate(pieces) if pieces else np.zeros((0,), np.int32)
  tokens[np.isin(tokens, structural)] = tokenizer.unk_id
  unit_offsets = np.zeros((len(unit_lengths) + 1,), np.int64)
  np.cumsum(unit_lengths, out=unit_offsets[1:])
  doc_units = np.zeros((len(doc_counts) + 1,), np.int64)
  np.cumsum(doc_counts, out=doc_units[1:])
  return TokenizedDocuments(tokens, unit_offsets, doc_units)


def save_npz(path, arrays: dict[str, np.ndarray]) -> None:
  """Writes `arrays` to `path` atomically (a temporary file, then a rename)."""
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  tmp = path.parent / f"{path.name}.tmp{os.getpid()}"
  tmp.write_bytes(buf.getvalue())
  tmp.rename(path)


def load_npz(path) -> dict[str, np.ndarray] | None:
  """The arrays of `path`, or None when it is missing or unreadable."""
  path = epath.Path(path)
  if not path.exists():
    return None
  try:
    with np.load(io.BytesIO(path.read_bytes())) as z:
      return {k: z[k] for k in z.files}
  except Exception as e:  # pylint: disable=broad-except
    log.warning("ignoring unreadable data cache %s: %s", path, e)
    return None
