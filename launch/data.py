"""The pretraining input pipeline: documents -> tokens -> fixed-length rows -> Grain batches.

Sources (`config.data.source`):
- `default`: the embedded corpus of `launch.corpus` (Python's own documentation and
  source, available offline).
- `text`: local (or gs://) files from the comma-separated globs in `data.files`.
  `*.jsonl` / `*.jsonl.gz`: one document per line, its `data.text_key` field. Other files
  (optionally `.gz`): with `data.text_document="blank_line"` (default) documents are
  separated by blank lines, the input format of BERT's create_pretraining_data (one
  sentence per line, a blank line between documents); with `"file"` each file is one
  document. For this source `data.eval_split`, when set, is a glob of evaluation files.
- `tfds`: `tfds.data_source(data.tfds_name, split=..., data_dir=data.tfds_data_dir)`,
  which reads ArrayRecord files without TensorFlow (never downloads); text field
  `data.text_key`.

Evaluation documents: the named `data.eval_split`, otherwise a fixed fraction
(`data.eval_fraction`) of the documents, chosen by a fixed seed (independent of
`shuffle_seed`, so runs with different seeds share one held-out set).

Rows (`data.packing`), each `data.seq_len` = T tokens:
- `documents`: each document becomes `[CLS] tokens [SEP]`, cut into pieces of at most
  T - 2 tokens each wrapped the same way; pieces are packed into rows best-fit
  (largest first). `segment_ids` number the pieces in a row 1, 2, ... (0 = padding),
  `position_ids` restart at 0 in every piece, `token_type_ids` are 0.
- `pairs` (BERT's NSP): `[CLS] A [SEP] B [SEP]` from one document, built as
  create_pretraining_data does: lines (long ones cut at sentence ends) are accumulated to
  a target length (T - 3, or with probability 0.1 a random shorter one), split at a
  random point into A and B; with probability `objective.nsp_prob` B is replaced by text
  from another document (`next_sentence_label` 1 = random, 0 = is next); the longer side
  is truncated away from the A|B junction (A loses its start, B its end), so an "is
  next" pair is always running text. The split point, the label and the random B are drawn
  again in every epoch. token_type 0 for [CLS] A [SEP], 1 for B [SEP];
  segment_ids 1 on real tokens, 0 on padding.

Batches are dicts of numpy arrays with a leading per-process batch dimension B:
  input_ids int32 (B, T), segment_ids int32 (B, T), position_ids int32 (B, T),
  token_type_ids int32 (B, T), special_tokens_mask bool (B, T) ([CLS]/[SEP]/[PAD]: never
  masked), word_starts bool (B, T) (token begins a word; the first token after [CLS] or
  [SEP] always does), and for `pairs` next_sentence_label int32 (B,).

Iteration is a Grain `MapDataset` (range of rows -> this process's shard -> shuffle ->
repeat -> build rows -> batch), so it is deterministic given the seed, sharded by JAX
process and checkpointable: `Pipeline.train_iter()` returns a `grain.DatasetIterator`
(works with `grain.checkpoint.CheckpointSave/CheckpointRestore` inside an Orbax
CheckpointManager), and `iterator_state(it)` / `restore_iterator(pipeline, state)` give a
JSON-serializable dict for any other checkpointer.

All documents are tokenized once, up front, on every process (rows are then sharded);
token ids are cached in `<workdir>/data_cache/<hash>.npz`. Special-token ids that appear
inside document text are replaced by [UNK], so [CLS]/[SEP]/[PAD]/[MASK] only ever mark
structure.
"""
from __future__ import annotations

import dataclasses
import functools
import glob as globlib
import gzip
import hashlib
import io
import json
import logging
import os
import re
import time
from typing import Any, Sequence

import numpy as np

from launch import corpus
from launch import tokenization

SOURCES = ("default", "text", "tfds")
PACKINGS = ("documents", "pairs")
TEXT_DOCUMENT_MODES = ("blank_line", "file")
CACHE_VERSION = 1
EVAL_SPLIT_SEED = 20240601
EVAL_MAX_DOCUMENTS = 20_000  # read at most this many documents of a named eval split
SHORT_SEQ_PROB = 0.1  # pairs: probability of a shorter target length (as in BERT)
MAX_UNIT_CHARS = 300  # pairs: lines longer than this are cut at sentence ends
_TOKENIZE_CHUNK = 2048
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")
_BLANK_LINES = re.compile(r"\n[ \t\r\f\v]*\n")
log = logging.getLogger(__name__)

Batch = dict[str, np.ndarray]


# ----------------------------------------------------------------------------- sources


def _read_text(path: str) -> str:
  from etils import epath  # pylint: disable=g-import-not-at-top
  data = epath.Path(path).read_bytes()
  if path.endswith(".gz"):
    data = gzip.decompress(data)
  return data.decode("utf-8", errors="replace")


def expand_globs(spec: str, what: str = "data.files") -> list[str]:
  """Sorted, de-duplicated files matching comma-separated globs; each glob must match."""
  patterns = [p.strip() for p in (spec or "").split(",") if p.strip()]
  if not patterns:
    raise ValueError(f"{what} is empty: source=text needs comma-separated file globs")
  out = []
  for pattern in patterns:
    if "://" in pattern:
      from etils import epath  # pylint: disable=g-import-not-at-top
      head = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
      base = head.rsplit("/", 1)[0]
      matches = (sorted(str(p) for p in epath.Path(base).glob(pattern[len(base) + 1:]))
                 if head != pattern else ([pattern] if epath.Path(pattern).exists() else []))
    else:
      matches = sorted(p for p in globlib.glob(os.path.expanduser(pattern), recursive=True)
                       if os.path.isfile(p))
    if not matches:
      raise ValueError(f"{what}: {pattern!r} matches no files")
    out.extend(matches)
  return list(dict.fromkeys(out))


def _file_documents(path: str, mode: str, text_key: str) -> list[str]:
  text = _read_text(path)
  name = path[:-3] if path.endswith(".gz") else path
  if name.endswith(".jsonl"):
    docs = []
    for n, line in enumerate(text.splitlines(), 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not a JSON line: {e}") from e
      if not isinstance(record, dict) or text_key not in record:
        raise ValueError(f"{path}:{n}: no {text_key!r} field (data.text_key)")
      docs.append(str(record[text_key]))
  elif mode == "file":
    docs = [text]
  else:
    docs = _BLANK_LINES.split(text.replace("\r\n", "\n"))
  return [d.strip() for d in docs if d.strip()]


def _text_documents(spec: str, mode: str, text_key: str, limit: int, what: str) -> list[str]:
  docs = []
  for path in expand_globs(spec, what):
    docs.extend(_file_documents(path, mode, text_key))
    if 0 <= limit <= len(docs):
      return docs[:limit]
  return docs


def _tfds_source(name: str, split: str, data_dir: str):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  if not name:
    raise ValueError("data.tfds_name is empty: source=tfds needs a dataset name")
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir or None, download=False)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"cannot open TFDS dataset {name!r} split {split!r} in data_dir="
                     f"{data_dir or '(default)'} (prepared ArrayRecord files are needed; "
                     f"nothing is downloaded): {e}") from e


def _tfds_documents(name: str, split: str, data_dir: str, text_key: str,
                    limit: int) -> list[str]:
  source = _tfds_source(name, split, data_dir)
  n = len(source) if limit < 0 else min(limit, len(source))
  docs = []
  for lo in range(0, n, 1024):
    idx = list(range(lo, min(n, lo + 1024)))
    records = source.__getitems__(idx) if hasattr(source, "__getitems__") else [
        source[i] for i in idx]
    for record in records:
      if text_key not in record:
        raise ValueError(f"TFDS {name}/{split}: no feature {text_key!r} (data.text_key); "
                         f"features: {sorted(record)}")
      value = record[text_key]
      text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
      if text.strip():
        docs.append(text)
  return docs


def _holdout(docs: list[str], fraction: float) -> tuple[list[str], list[str]]:
  if fraction <= 0 or len(docs) < 2:
    return docs, []
  n_eval = min(len(docs) - 1, max(1, int(round(fraction * len(docs)))))
  rng = np.random.default_rng(EVAL_SPLIT_SEED)
  is_eval = np.zeros((len(docs),), bool)
  is_eval[rng.permutation(len(docs))[:n_eval]] = True
  return ([d for d, e in zip(docs, is_eval) if not e], [d for d, e in zip(docs, is_eval) if e])


def load_documents(data) -> tuple[list[str], list[str]]:
  """(train documents, eval documents) for the config's `data` section."""
  source, limit = data.source, int(data.max_documents)
  fraction = float(data.eval_fraction)
  if source == "default":
    if data.eval_split:
      raise ValueError("source=default has no named splits; leave data.eval_split empty "
                       "and use data.eval_fraction")
    return _holdout(corpus.default_documents(limit), fraction)
  if source == "text":
    mode = data.get("text_document", "blank_line")
    train = _text_documents(data.files, mode, data.text_key, limit, "data.files")
    if not train:
      raise ValueError(f"data.files={data.files!r}: the files hold no text")
    if data.eval_split:
      return train, _text_documents(data.eval_split, mode, data.text_key,
                                    EVAL_MAX_DOCUMENTS, "data.eval_split")
    return _holdout(train, fraction)
  if source == "tfds":
    train = _tfds_documents(data.tfds_name, data.train_split, data.tfds_data_dir,
                            data.text_key, limit)
    if not train:
      raise ValueError(f"TFDS {data.tfds_name}/{data.train_split} has no non-empty text")
    if data.eval_split:
      cap = EVAL_MAX_DOCUMENTS if limit < 0 else min(limit, EVAL_MAX_DOCUMENTS)
      return train, _tfds_documents(data.tfds_name, data.eval_split, data.tfds_data_dir,
                                    data.text_key, cap)
    return _holdout(train, fraction)
  raise ValueError(f"data.source={source!r}; expected one of {SOURCES}")


def _source_spec(data) -> dict:
  """Everything that determines the documents (for the cache key)."""
  spec = {"source": data.source, "max_documents": int(data.max_documents),
          "eval_split": data.eval_split, "eval_fraction": float(data.eval_fraction)}
  if data.source == "default":
    spec["corpus"] = corpus.fingerprint()
  elif data.source == "text":
    files = expand_globs(data.files)
    if data.eval_split:
      files += expand_globs(data.eval_split, "data.eval_split")
    stats = []
    for f in files:
      try:
        st = os.stat(f)
        stats.append((f, st.st_size, st.st_mtime_ns))
      except OSError:
        stats.append((f, None, None))
    spec.update(files=stats, text_key=data.text_key,
                text_document=data.get("text_document", "blank_line"))
  elif data.source == "tfds":
    spec.update(name=data.tfds_name, data_dir=data.tfds_data_dir,
                train_split=data.train_split, text_key=data.text_key)
  return spec


# --------------------------------------------------------------------------- tokenized


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


# ----------------------------------------------------------------------------- packing


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
    return _finish(ids, seg, pos, np.zeros((t,), np.int32), special, self.word_start)


def _finish(ids, seg, pos, types, special, word_start_table) -> dict[str, np.ndarray]:
  starts = word_start_table[ids] | special
  starts[1:] |= special[:-1]
  return {"input_ids": ids, "segment_ids": seg, "position_ids": pos,
          "token_type_ids": types, "special_tokens_mask": special, "word_starts": starts}


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


@dataclasses.dataclass
class PairRows:
  """NSP instances: runs of segments of one document, turned into rows on access.

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
  nsp_prob: float
  cls_id: int
  sep_id: int
  pad_id: int
  word_start: np.ndarray

  def __len__(self) -> int:
    return len(self.inst_doc)

  def _concat(self, lo: int, hi: int) -> np.ndarray:
    return np.concatenate([self.tokens[s:s + n] for s, n in
                           zip(self.seg_start[lo:hi], self.seg_len[lo:hi])])

  def __call__(self, row: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    doc, lo, hi = int(self.inst_doc[row]), int(self.inst_lo[row]), int(self.inst_hi[row])
    max_tokens = self.seq_len - 3
    if hi - lo >= 2:
      a_end = lo + int(rng.integers(1, hi - lo))
      a, rest = self._concat(lo, a_end), self._concat(a_end, hi)
    else:
      whole = self._concat(lo, hi)
      cut = int(rng.integers(1, len(whole)))
      a, rest = whole[:cut], whole[cut:]
    is_random = rng.random() < self.nsp_prob
    if is_random:
      target_b = max(1, int(self.inst_target[row]) - len(a))
      other = int(rng.integers(self.num_docs - 1))
      other += other >= doc
      s_lo, s_hi = int(self.doc_segs[other]), int(self.doc_segs[other + 1])
      start = s_lo + int(rng.integers(s_hi - s_lo))
      end, total = start, 0
      while end < s_hi and total < target_b:
        total += int(self.seg_len[end])
        end += 1
      b = self._concat(start, end)
    else:
      b = rest
    a, b = _truncate_pair(a, b, max_tokens)
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
    out = _finish(ids, seg, pos, types, special, self.word_start)
    out["next_sentence_label"] = np.int32(is_random)
    return out

  @property
  def num_docs(self) -> int:
    return len(self.doc_segs) - 1


def _truncate_pair(a: np.ndarray, b: np.ndarray,
                   max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
  """Trims the longer side until both fit (ties: B); A loses its start, B its end.

  Trimming away from the A|B junction keeps an "is next" pair running text.
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


def build_pairs(tok: TokenizedDocuments, tokenizer: tokenization.Tokenizer, seq_len: int,
                nsp_prob: float, seed: int) -> PairRows:
  """Groups each document's lines into NSP instances as BERT's create_pretraining_data."""
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
  inst_doc, inst_lo, inst_hi, inst_target = [], [], [], []
  seg_len_list = seg_len.tolist()
  for d in range(tok.num_documents):
    lo, end = int(doc_segs[d]), int(doc_segs[d + 1])
    target = max_tokens if rng.random() >= SHORT_SEQ_PROB else int(rng.integers(2, max_tokens + 1))
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
        target = (max_tokens if rng.random() >= SHORT_SEQ_PROB
                  else int(rng.integers(2, max_tokens + 1)))
  as64 = lambda x: np.asarray(x, np.int64)
  return PairRows(tok.tokens, seg_start, seg_len, doc_segs, as64(inst_doc), as64(inst_lo),
                  as64(inst_hi), as64(inst_target), seq_len, float(nsp_prob),
                  tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.word_start)


# ----------------------------------------------------------------------------- caching


def _save_npz(path, arrays: dict[str, np.ndarray]) -> None:
  from etils import epath  # pylint: disable=g-import-not-at-top
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  buf = io.BytesIO()
  np.savez(buf, **arrays)
  tmp = path.parent / f"{path.name}.tmp{os.getpid()}"
  tmp.write_bytes(buf.getvalue())
  tmp.rename(path)


def _load_npz(path) -> dict[str, np.ndarray] | None:
  from etils import epath  # pylint: disable=g-import-not-at-top
  path = epath.Path(path)
  if not path.exists():
    return None
  try:
    with np.load(io.BytesIO(path.read_bytes())) as z:
      return {k: z[k] for k in z.files}
  except Exception as e:  # pylint: disable=broad-except
    log.warning("ignoring unreadable data cache %s: %s", path, e)
    return None


def _to_arrays(prefix: str, tok: TokenizedDocuments) -> dict[str, np.ndarray]:
  return {f"{prefix}_tokens": tok.tokens, f"{prefix}_unit_offsets": tok.unit_offsets,
          f"{prefix}_doc_units": tok.doc_units}


def _from_arrays(prefix: str, arrays: dict[str, np.ndarray]) -> TokenizedDocuments:
  return TokenizedDocuments(arrays[f"{prefix}_tokens"], arrays[f"{prefix}_unit_offsets"],
                            arrays[f"{prefix}_doc_units"])


# ---------------------------------------------------------------------------- pipeline


def _process_info(process_index, process_count) -> tuple[int, int]:
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} outside [0, {process_count})")
  return int(process_index), int(process_count)


def _stack(rows: Sequence[dict[str, np.ndarray]]) -> Batch:
  return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


class Pipeline:
  """Tokenized, packed train/eval rows and their Grain iteration for one process.

  Attributes:
    tokenizer: the `tokenization.Tokenizer` used.
    seq_len: T, tokens per row.
    batch_size: B, rows per batch on this process (global_batch // process_count).
    num_train_rows: rows in one epoch over all processes.
    rows_per_process: rows in one epoch of this process.
    steps_per_epoch: batches in one epoch (the same on every process).
    num_eval_rows: held-out rows on this process.
    fingerprint: hash of everything that determines the row stream.
    stats: numbers about the data (documents, tokens, padding).
  """

  def __init__(self, *, tokenizer, train_rows, eval_rows, packing: str, seq_len: int,
               global_batch: int, seed: int, num_epochs: int, worker_count: int,
               process_index: int, process_count: int, fingerprint: str, stats: dict):
    self.tokenizer = tokenizer
    self.packing = packing
    self.seq_len = seq_len
    self.seed = seed
    self.num_epochs = num_epochs
    self.worker_count = worker_count
    self.process_index, self.process_count = process_index, process_count
    self.batch_size = global_batch // process_count
    self._train_rows, self._eval_rows = train_rows, eval_rows
    n = len(train_rows) - len(train_rows) % process_count
    self.num_train_rows = n
    self.rows_per_process = n // process_count
    self.steps_per_epoch = self.rows_per_process // self.batch_size
    self.num_eval_rows = len(range(process_index, len(eval_rows), process_count))
    self.fingerprint = fingerprint
    self.stats = stats
    if self.steps_per_epoch == 0:
      raise ValueError(
          f"{len(train_rows)} training rows give {self.rows_per_process} rows per process, "
          f"fewer than one batch of {self.batch_size} (data.global_batch={global_batch} over "
          f"{process_count} processes): use more data or a smaller batch")

  def train_dataset(self):
    """The Grain `MapDataset` of this process's batches (infinite when num_epochs=-1)."""
    import grain  # pylint: disable=g-import-not-at-top
    ds = grain.MapDataset.range(self.num_train_rows)
    ds = ds[self.process_index::self.process_count]
    ds = ds.shuffle(seed=self.seed)
    ds = ds.repeat(None if self.num_epochs < 0 else self.num_epochs)
    if self.packing == "documents":
      ds = ds.map(self._train_rows)
    else:
      ds = ds.random_map(self._train_rows, seed=_mix_seed(self.seed, self.process_index))
    return ds.batch(self.batch_size, drop_remainder=True, batch_fn=_stack)

  def train_iter(self, start_state: dict | None = None) -> "TrainIterator":
    """An iterator over this process's training batches (dicts, see module docstring).

    Args:
      start_state: a state from `iterator_state(it)` (= `it.get_state()`) of an earlier
        iterator of the same pipeline; iteration then continues exactly where it stood.
    """
    import grain  # pylint: disable=g-import-not-at-top
    ds = self.train_dataset().to_iter_dataset(
        grain.ReadOptions(num_threads=2, prefetch_buffer_size=8))
    if self.worker_count > 0:
      from absl import flags  # pylint: disable=g-import-not-at-top
      if not flags.FLAGS.is_parsed():  # Grain's workers read absl flags; use defaults.
        flags.FLAGS.mark_as_parsed()
      ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=self.worker_count))
    it = TrainIterator(iter(ds), self.fingerprint)
    if start_state is not None:
      it.set_state(start_state)
    return it

  def eval_batches(self, n: int) -> list[Batch]:
    """Up to `n` fixed batches of held-out rows (this process's share), same every call.

    Fewer than `n` when the held-out rows run out; the rows are repeated to fill one
    batch if there are fewer than `batch_size`; [] when there is no held-out data.
    """
    rows = self._eval_rows
    if len(rows) == 0 or n <= 0:
      return []
    order = np.random.default_rng(EVAL_SPLIT_SEED).permutation(len(rows))
    mine = order[self.process_index::self.process_count]
    if len(mine) == 0:
      mine = order[:1]
    # The same number of batches on every process, or a multi-host eval would hang.
    count = max(1, min(n, len(rows) // self.process_count // self.batch_size))
    take = np.resize(mine, count * self.batch_size)
    out = []
    for b in range(count):
      idx = take[b * self.batch_size:(b + 1) * self.batch_size]
      if self.packing == "documents":
        out.append(_stack([rows(int(i)) for i in idx]))
      else:
        out.append(_stack([rows(int(i), np.random.default_rng([self.seed, int(i)]))
                           for i in idx]))
    return out


def _mix_seed(seed: int, index: int) -> int:
  return int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:4], "little")


def _grain_iterator_base():
  import grain  # pylint: disable=g-import-not-at-top
  return grain.DatasetIterator


class TrainIterator(_grain_iterator_base()):
  """A `grain.DatasetIterator` whose state also names the pipeline it belongs to.

  State: {"data_fingerprint": str, "grain": <the Grain iterator's state>}, JSON-serializable;
  `set_state` refuses a state from a different pipeline (changed data, tokenizer, seed,
  batch or process layout), so a resumed run cannot silently read another stream.
  Being a `grain.DatasetIterator`, it can be saved inside an Orbax checkpoint with
  `grain.checkpoint.CheckpointSave(it)` / `CheckpointRestore(it)`.
  """

  def __init__(self, parent, fingerprint: str):
    super().__init__(parent)
    self._fingerprint = fingerprint

  def __next__(self) -> Batch:
    return next(self._parent)

  def get_state(self) -> dict[str, Any]:
    return {"data_fingerprint": self._fingerprint, "grain": self._parent.get_state()}

  def set_state(self, state: dict[str, Any]) -> None:
    if "grain" not in state:
      raise ValueError(f"not a data iterator state (keys {sorted(state)})")
    if state.get("data_fingerprint") != self._fingerprint:
      raise ValueError(
          "the saved data iterator belongs to a different data pipeline (data, tokenizer, "
          "seed, batch or process layout changed); refusing to resume another stream: "
          f"saved {state.get('data_fingerprint')}, now {self._fingerprint}")
    self._parent.set_state(state["grain"])

  def __str__(self) -> str:
    return "encoder_zoo.TrainIterator"


def iterator_state(it: TrainIterator) -> dict[str, Any]:
  """A JSON-serializable snapshot of a `train_iter` iterator (same as `it.get_state()`)."""
  return it.get_state()


def restore_iterator(pipeline: Pipeline, state: dict[str, Any]) -> TrainIterator:
  """A new `pipeline.train_iter()` positioned where the iterator of `state` stood."""
  return pipeline.train_iter(start_state=state)


def _validate(config) -> None:
  data = config.data
  if data.source not in SOURCES:
    raise ValueError(f"data.source={data.source!r}; expected one of {SOURCES}")
  if data.packing not in PACKINGS:
    raise ValueError(f"data.packing={data.packing!r}; expected one of {PACKINGS}")
  if config.tokenizer.kind not in tokenization.KINDS:
    raise ValueError(f"tokenizer.kind={config.tokenizer.kind!r}; expected one of "
                     f"{tokenization.KINDS}")
  mode = data.get("text_document", "blank_line")
  if mode not in TEXT_DOCUMENT_MODES:
    raise ValueError(f"data.text_document={mode!r}; expected one of {TEXT_DOCUMENT_MODES}")
  min_len = 3 if data.packing == "documents" else 5
  if int(data.seq_len) < min_len:
    raise ValueError(f"data.seq_len={data.seq_len} is too small for packing={data.packing} "
                     f"(at least {min_len}: [CLS] ... [SEP] needs room for text)")
  if not 0 <= int(data.shuffle_seed) < 2**32:
    raise ValueError(f"data.shuffle_seed={data.shuffle_seed} must be in [0, 2**32)")
  if int(data.global_batch) <= 0:
    raise ValueError(f"data.global_batch={data.global_batch} must be positive")
  if not 0 <= float(data.eval_fraction) < 1:
    raise ValueError(f"data.eval_fraction={data.eval_fraction} must be in [0, 1)")
  if int(data.num_epochs) == 0 or int(data.num_epochs) < -1:
    raise ValueError(f"data.num_epochs={data.num_epochs}: use -1 (forever) or a positive "
                     "number")
  nsp_prob = float(config.get("objective", {}).get("nsp_prob", 0.5))
  if data.packing == "pairs" and not 0 <= nsp_prob <= 1:
    raise ValueError(f"objective.nsp_prob={nsp_prob} must be in [0, 1]")


def make_pipeline(config, workdir: str | None, *, process_index: int | None = None,
                  process_count: int | None = None) -> Pipeline:
  """Builds tokenizer, rows and iteration from `config.data` / `config.tokenizer`.

  Args:
    config: the full config (sections `data`, `tokenizer`, and `objective.nsp_prob`).
    workdir: run directory for the tokenizer and data caches (None: no caching).
    process_index, process_count: this process's place among the JAX processes
      (default: `jax.process_index()`, `jax.process_count()`).

  Returns:
    A `Pipeline`; `global_batch` must be divisible by `process_count`.
  """
  _validate(config)
  data = config.data
  process_index, process_count = _process_info(process_index, process_count)
  if int(data.global_batch) % process_count:
    raise ValueError(f"data.global_batch={data.global_batch} is not divisible by the "
                     f"{process_count} processes")
  t0 = time.perf_counter()
  seq_len, packing = int(data.seq_len), data.packing
  seed = int(data.shuffle_seed)
  nsp_prob = float(config.get("objective", {}).get("nsp_prob", 0.5))

  documents = functools.cache(lambda: load_documents(data))
  tokenizer = tokenization.make_tokenizer(config.tokenizer, workdir, lambda: documents()[0])
  t_tok = time.perf_counter()

  unit = "document" if packing == "documents" else "sentence"
  key_spec = {"version": CACHE_VERSION, "data": _source_spec(data),
              "tokenizer": tokenizer.fingerprint(), "unit": unit,
              "max_unit_chars": MAX_UNIT_CHARS}
  key = hashlib.sha256(json.dumps(key_spec, sort_keys=True, default=str).encode()).hexdigest()
  cache_path = f"{workdir}/data_cache/{key[:24]}.npz" if workdir else None
  arrays = _load_npz(cache_path) if cache_path else None
  if arrays is not None:
    train_tok, eval_tok = _from_arrays("train", arrays), _from_arrays("eval", arrays)
  else:
    train_docs, eval_docs = documents()
    train_tok = tokenize_documents(tokenizer, train_docs, unit)
    eval_tok = tokenize_documents(tokenizer, eval_docs, unit)
    if cache_path and process_index == 0:
      _save_npz(cache_path, {**_to_arrays("train", train_tok), **_to_arrays("eval", eval_tok)})
  if train_tok.num_tokens == 0:
    raise ValueError("the training documents tokenize to nothing")
  if packing == "pairs" and train_tok.num_documents < 2:
    raise ValueError("packing=pairs needs at least 2 training documents (random next "
                     "segments come from other documents)")
  t_data = time.perf_counter()

  if packing == "documents":
    train_rows = pack_documents(train_tok, tokenizer, seq_len)
    eval_rows = pack_documents(eval_tok, tokenizer, seq_len)
    content = 2 * len(train_rows.chunk_len) + int(train_rows.chunk_len.sum())
  else:
    train_rows = build_pairs(train_tok, tokenizer, seq_len, nsp_prob, seed)
    eval_rows = (build_pairs(eval_tok, tokenizer, seq_len, nsp_prob, seed)
                 if eval_tok.num_documents >= 2 else [])
    content = None
  t_rows = time.perf_counter()

  stats = {
      "train_documents": train_tok.num_documents, "train_tokens": train_tok.num_tokens,
      "eval_documents": eval_tok.num_documents, "eval_tokens": eval_tok.num_tokens,
      "train_rows": len(train_rows), "eval_rows": len(eval_rows),
      "tokenizer_s": round(t_tok - t0, 3), "tokenize_s": round(t_data - t_tok, 3),
      "rows_s": round(t_rows - t_data, 3), "cached": arrays is not None,
  }
  if content is not None:
    stats["fill"] = round(content / max(1, len(train_rows) * seq_len), 4)
  fp_spec = {"rows": key, "packing": packing, "seq_len": seq_len, "seed": seed,
             "nsp_prob": nsp_prob, "global_batch": int(data.global_batch),
             "num_epochs": int(data.num_epochs), "process": [process_index, process_count],
             "worker_count": int(data.worker_count)}
  fingerprint = hashlib.sha256(json.dumps(fp_spec, sort_keys=True).encode()).hexdigest()[:32]
  log.info("data: %s", stats)
  return Pipeline(tokenizer=tokenizer, train_rows=train_rows, eval_rows=eval_rows,
                  packing=packing, seq_len=seq_len, global_batch=int(data.global_batch),
                  seed=seed, num_epochs=int(data.num_epochs),
                  worker_count=int(data.worker_count), process_index=process_index,
                  process_count=process_count, fingerprint=fingerprint, stats=stats)
