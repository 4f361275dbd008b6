"""Pretokenized rows in ArrayRecord shards (`launch.preprocess`) and their training source.

`data.source="arrayrecord"` with `data.path=DIR` trains on the shards that
`python -m launch.preprocess --out DIR` wrote: nothing is tokenized at start-up (the
start-up reads only the manifest and each shard's footer), each JAX process reads only
its own rows (a strided share of the global row order), Grain worker processes read and
decode them (`data.worker_count`), and the iterator state is checkpointed as for every
source (`launch.data.iteration.Pipeline`).

A record is one row (see `launch.data.packing`) without its padding:
  uint8 version | int8 pair label (0 for documents) | uint16 n |
  n input ids (the manifest's ids_dtype) | n segment ids (uint16) | n token types (uint8)
Position ids restart at 0 in every segment, special tokens are [CLS]/[SEP]/[PAD], and
word starts come from the tokenizer, so the decoded row equals the row the in-memory
pipeline would build from the same pieces.

Layout of DIR: `manifest.json` (counts, tokenizer fingerprint, config, and `held_out`:
how the held-out documents were chosen), `tokenizer/` (the tokenizer the ids belong to),
`train-NNNNN.arrayrecord` and `eval-NNNNN.arrayrecord` shards, each with a `.json` sidecar
(its counts; written last, it marks the shard done). The `eval-*` shards are the held-out
set: documents `launch.preprocess` kept out of every training shard (a content hash, so a
duplicated document never lands on both sides, or the named `data.eval_split`). A run
with `train.eval_batches > 0` on shards without held-out rows stops at start-up.

Bad input (`data.bad_data`, `launch.data.badinput`): a shard that does not open, or
whose record count differs from the manifest, is `corrupt_shard` (skipped at start-up and
counted, or an error naming it); a record that cannot be read or decoded is
`corrupt_record`: under "skip" the row is replaced by the next readable row (a function of
the row index only, so a resumed run reads the same stream), never by a padding row;
under "error" a `BadDataError` names the shard and the record.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import time

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader
from etils import epath

from launch.data import badinput
from launch.data import packing as packing_lib
from launch.data import tokenization
from launch.data.iteration import Pipeline, check_held_out

RECORD_VERSION = 1
MANIFEST = "manifest.json"
_HEADER = struct.Struct("<BbH")
_READ_OPTIONS = "readahead_buffer_size:0,max_parallelism:0"  # random access
MAX_REPLACEMENT_TRIES = 4096  # rows looked at for a readable one after a corrupt record
log = logging.getLogger(__name__)


def ids_dtype(vocab_size: int) -> str:
  return "uint16" if vocab_size <= 2**16 else "int32"


def encode_row(row: dict[str, np.ndarray], dtype: str, label_key: str | None = None) -> bytes:
  """The record of one row (its content is a prefix: padding has segment id 0)."""
  seg = row["segment_ids"]
  n = int(np.count_nonzero(seg))
  if n > 65535 or np.any(seg[n:]):
    raise ValueError("a row's content must be a prefix of at most 65535 tokens")
  label = int(row[label_key]) if label_key else 0
  return (_HEADER.pack(RECORD_VERSION, label, n) + row["input_ids"][:n].astype(dtype).tobytes()
          + seg[:n].astype(np.uint16).tobytes()
          + row["token_type_ids"][:n].astype(np.uint8).tobytes())


class RowDecoder:
  """Record bytes -> row dict of `seq_len` tokens (raises ValueError on a bad record)."""

  def __init__(self, seq_len: int, dtype: str, vocab_size: int, cls_id: int, sep_id: int,
               pad_id: int, word_start: np.ndarray, label_key: str | None):
    self.seq_len, self.dtype, self.vocab_size = seq_len, np.dtype(dtype), vocab_size
    self.cls_id, self.sep_id, self.pad_id = cls_id, sep_id, pad_id
    self.word_start, self.label_key = word_start, label_key

  def __call__(self, raw: bytes) -> dict[str, np.ndarray]:
    if len(raw) < _HEADER.size:
      raise ValueError(f"record of {len(raw)} bytes is shorter than its header")
    version, label, n = _HEADER.unpack_from(raw)
    size = _HEADER.size + n * (self.dtype.itemsize + 3)
    if version != RECORD_VERSION or len(raw) != size or not 0 < n <= self.seq_len:
      raise ValueError(f"not a row record (version {version}, {n} tokens, {len(raw)} bytes; "
                       f"expected version {RECORD_VERSION}, {size} bytes, at most "
                       f"{self.seq_len} tokens)")
    o = _HEADER.size
    body = np.frombuffer(raw, self.dtype, n, o).astype(np.int32)
    o += n * self.dtype.itemsize
    seg_n = np.frombuffer(raw, np.uint16, n, o).astype(np.int32)
    types_n = np.frombuffer(raw, np.uint8, n, o + 2 * n).astype(np.int32)
    if body.min() < 0 or body.max() >= self.vocab_size:
      raise ValueError(f"record holds ids outside the vocabulary [0, {self.vocab_size})")
    if seg_n[0] != 1 or np.any(np.diff(seg_n) < 0) or np.any(np.diff(seg_n) > 1):
      raise ValueError("record's segment ids do not number its pieces 1, 2, ...")
    if types_n.max() > 1:
      raise ValueError("record holds token type ids other than 0 and 1")
    if label not in ((0, 1) if self.label_key else (0,)):
      raise ValueError(f"record holds pair label {label}")
    t = self.seq_len
    ids = np.full((t,), self.pad_id, np.int32)
    ids[:n] = body
    seg = np.zeros((t,), np.int32)
    seg[:n] = seg_n
    types = np.zeros((t,), np.int32)
    types[:n] = types_n
    idx = np.arange(n)
    change = np.ones((n,), bool)
    change[1:] = seg_n[1:] != seg_n[:-1]
    pos = np.zeros((t,), np.int32)
    pos[:n] = idx - np.maximum.accumulate(np.where(change, idx, 0))
    special = (ids == self.cls_id) | (ids == self.sep_id) | (ids == self.pad_id)
    row = packing_lib.finish_row(ids, seg, pos, types, special, self.word_start)
    if self.label_key:
      row[self.label_key] = np.int32(label)
    return row


class ShardRows:
  """Rows of a list of shards by global index, read on demand (picklable for workers).

  A record that cannot be read or decoded is reported to the bad-data policy: under
  "skip" the next readable row (i + 1, i + 2, ... wrapping around) is served in its place
  and counted, never a padding row (a padding row would train on nothing, silently);
  under "error" a `BadDataError` names the shard and the record.
  """

  needs_rng = False

  def __init__(self, paths: list[str], counts: list[int], decoder: RowDecoder, policy: str):
    self.paths, self.decoder, self.policy = list(paths), decoder, policy
    self.offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    self.label_key = decoder.label_key
    self._readers = {}
    self._bad = badinput.BadData(policy)  # counts per process (each Grain worker its own)

  def __getstate__(self):
    return {k: v for k, v in self.__dict__.items() if k != "_readers"}

  def __setstate__(self, state):
    self.__dict__.update(state, _readers={})

  def __len__(self) -> int:
    return int(self.offsets[-1])

  def bad_counts(self) -> dict[str, int]:
    """{kind: count} of the corrupt records this object has met (in this process)."""
    return self._bad.nonzero()

  def _reader(self, s: int):
    if s not in self._readers:
      self._readers[s] = ArrayRecordReader(self.paths[s], _READ_OPTIONS)
    return self._readers[s]

  def _read(self, i: int) -> dict[str, np.ndarray]:
    s = int(np.searchsorted(self.offsets, i, side="right")) - 1
    local = int(i - self.offsets[s])
    try:
      return self.decoder(self._reader(s).read([local])[0])
    except Exception as e:  # pylint: disable=broad-except
      self._readers.pop(s, None)  # a reader that failed may be in a bad state
      detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      self._bad.report("corrupt_record", f"shard {self.paths[s]} record {local}", detail)
      return None

  def __call__(self, i: int) -> dict[str, np.ndarray]:
    n = len(self)
    for k in range(min(n, MAX_REPLACEMENT_TRIES)):
      row = self._read((int(i) + k) % n)
      if row is not None:
        return row
    raise badinput.BadDataError(
        f"no readable record among the {min(n, MAX_REPLACEMENT_TRIES)} rows from row {i} on "
        f"(shards {', '.join(p.rsplit('/', 1)[-1] for p in self.paths[:3])}...): the shards "
        "are corrupt; preprocess again")


def check_path(path: str) -> None:
  """One-line ValueErrors for a `data.path` that cannot hold shards (start-up check)."""
  write = "write them with `python -m launch.preprocess --config ... --out DIR`"
  if not path:
    raise ValueError("data.source='arrayrecord' needs --config.data.path (the --out "
                     "directory of launch.preprocess)")
  if "://" in path:
    raise ValueError(f"data.path={path!r}: shards are read with random access from a file "
                     "path; mount the bucket (gcsfuse) or copy the shards to local disk and "
                     "point data.path there (launch.preprocess itself can write to gs://)")
  if not os.path.exists(path):
    raise ValueError(f"data.path={path!r} does not exist; {write}")
  if not os.path.isdir(path):
    raise ValueError(f"data.path={path!r} is not a directory of shards; {write}")
  if not os.path.isfile(os.path.join(path, MANIFEST)):
    raise ValueError(f"data.path={path!r}: no {MANIFEST} there (not launch.preprocess "
                     f"output, or it did not finish); {write}")


def read_manifest(path: str) -> dict:
  check_path(path)
  f = os.path.join(path, MANIFEST)
  try:
    with open(f) as fh:
      manifest = json.load(fh)
    for key in ("seq_len", "packing", "ids_dtype", "tokenizer", "shards", "totals",
                "fingerprint"):
      if key not in manifest:
        raise ValueError(f"no {key!r} entry")
  except (OSError, ValueError) as e:
    raise ValueError(f"data.path={path!r}: {MANIFEST} is unreadable ({e}); preprocess "
                     "again into a new directory") from e
  return manifest


def check_manifest(data) -> dict:
  """The manifest of `data.path`, checked against the config's row settings (one-line
  ValueErrors; a start-up check: it reads only manifest.json)."""
  path = data.get("path", "")
  manifest = read_manifest(path)
  for key in ("seq_len", "packing"):
    if manifest[key] != data[key]:
      raise ValueError(f"data.{key}={data[key]!r} but the shards in {path} were written "
                       f"with {manifest[key]!r}: preprocess again or change the config")
  if data.packing == "pairs" and manifest.get("pair_task") != data.get("pair_task", "nsp"):
    raise ValueError(f"data.pair_task={data.get('pair_task', 'nsp')!r} but the shards hold "
                     f"{manifest.get('pair_task')!r} pairs")
  return manifest


def load_tokenizer(path: str, manifest: dict, tok_config):
  """The tokenizer the shards were written with; its fingerprint must match."""
  info = manifest["tokenizer"]
  if info["kind"].startswith("sentencepiece"):
    proto = (epath.Path(path) / "tokenizer" / "spm.model").read_bytes()
    tok = tokenization.SentencePieceTokenizer(proto, lowercase=info["lowercase"],
                                              kind=info["kind"])
  else:
    tok = tokenization.make_tokenizer(tok_config, None, list)
  if tok.fingerprint() != info["fingerprint"]:
    raise ValueError(f"data.path={path!r}: the shards were tokenized with tokenizer "
                     f"{info['fingerprint'][:16]}, the config's is {tok.fingerprint()[:16]}")
  return tok


def open_shards(path: str, entries: list[dict], bad: badinput.BadData):
  """(paths, row counts) of the shards that open with the manifest's record count."""
  paths, counts = [], []
  for e in entries:
    p = str(epath.Path(path) / e["file"])
    try:
      reader = ArrayRecordReader(p, _READ_OPTIONS)
      n = reader.num_records()
      reader.close()
      if n != e["rows"]:
        raise ValueError(f"{n} records, the manifest says {e['rows']}")
    except Exception as err:  # pylint: disable=broad-except
      bad.report("corrupt_shard", f"shard {p}", str(err).splitlines()[0] if str(err) else
                 type(err).__name__)
      continue
    if n:
      paths.append(p)
      counts.append(n)
  return paths, counts


def make_pipeline(config, workdir, *, process_index: int, process_count: int):
  """The `Pipeline` of `data.source="arrayrecord"` (see the module docstring)."""
  del workdir  # nothing is cached: the shards are the cache
  t0 = time.perf_counter()
  data = config.data
  path = data.get("path", "")
  manifest = check_manifest(data)
  if int(data.global_batch) % process_count:
    raise ValueError(f"data.global_batch={data.global_batch} is not divisible by the "
                     f"{process_count} processes")
  tokenizer = load_tokenizer(path, manifest, config.tokenizer)
  bad = badinput.BadData.from_config(data)
  label_key = manifest.get("label_key")
  decoder = RowDecoder(int(data.seq_len), manifest["ids_dtype"], tokenizer.vocab_size,
                       tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id,
                       tokenizer.word_start, label_key)
  rows = {}
  for split in ("train", "eval"):
    paths, counts = open_shards(path, manifest["shards"][split], bad)
    rows[split] = ShardRows(paths, counts, decoder, bad.policy)
  if len(rows["train"]) == 0:
    raise ValueError(f"data.path={path!r}: no readable training rows ({bad.summary()})")
  totals = manifest["totals"]
  written = manifest.get("config", {}).get("data", {})
  held = manifest.get("held_out", {})
  check_held_out(
      config, len(rows["eval"]),
      f"data.path={path!r} holds {len(rows['eval'])} readable held-out rows "
      f"({len(manifest['shards']['eval'])} eval shards, {totals['eval']['documents']} "
      f"documents written; {bad.summary()})",
      eval_fraction=float(held.get("eval_fraction", written.get("eval_fraction", 0.02))),
      eval_split=held.get("eval_split", written.get("eval_split", "")))
  stats = {"train_documents": totals["train"]["documents"],
           "train_tokens": totals["train"]["tokens"],
           "eval_documents": totals["eval"]["documents"],
           "eval_tokens": totals["eval"]["tokens"],
           "train_rows": len(rows["train"]), "eval_rows": len(rows["eval"]),
           "source": "arrayrecord", "shards": len(rows["train"].paths),
           "bad_data": bad.nonzero(),
           "preprocess_bad_data": {k: int(v) for k, v in manifest.get("bad_data", {}).items()
                                   if v},
           "startup_s": round(time.perf_counter() - t0, 3)}
  fp_spec = {"manifest": manifest["fingerprint"],
             "shards": [p.rsplit("/", 1)[-1] for p in rows["train"].paths],
             "seed": int(data.shuffle_seed), "global_batch": int(data.global_batch),
             "num_epochs": int(data.num_epochs), "process": [process_index, process_count],
             "worker_count": int(data.worker_count)}
  fingerprint = hashlib.sha256(json.dumps(fp_spec, sort_keys=True).encode()).hexdigest()[:32]
  log.info("data: %s", stats)
  return Pipeline(
      tokenizer=tokenizer, train_rows=rows["train"], eval_rows=rows["eval"],
      packing=data.packing, seq_len=int(data.seq_len), global_batch=int(data.global_batch),
      seed=int(data.shuffle_seed), num_epochs=int(data.num_epochs),
      worker_count=int(data.worker_count), process_index=process_index,
      process_count=process_count, fingerprint=fingerprint, stats=stats)
