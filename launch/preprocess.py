"""Pretokenize a corpus once into ArrayRecord shards of training rows.

  python -m launch.preprocess --config configs/roberta.py:base --out gs://BUCKET/data/c4 \
      --config.data.source=text --config.data.files='/data/c4/*.jsonl.gz' [--workers 8]
  python -m launch.pretrain --config configs/roberta.py:base --workdir ... \
      --config.data.source=arrayrecord --config.data.path=gs://BUCKET/data/c4

The documents come from the config's `data` section (`default`, `text` or `tfds`, as for
training), the tokenizer from its `tokenizer` section (`sentencepiece_train` trains it
here, on the first documents, and stores it in OUT/tokenizer/). Documents are cut into
shards of `--docs_per_shard`; one worker process per core tokenizes a shard and builds its
rows: `data.packing="documents"` packs pieces best-fit into rows (`--nopack`: one piece
per row), `"pairs"` builds one epoch of NSP/SOP pairs. Each shard is written to a local
temporary file and copied to OUT through etils.epath (so OUT may be gs://), then its
`.json` sidecar marks it done: re-running the same command skips finished shards.
`manifest.json` (counts, tokenizer fingerprint, config) is written last.

Held out: the `eval-*` shards hold the documents kept out of training: the named
`data.eval_split`, or those whose content hash falls under `data.eval_fraction` (so a
duplicated document is on one side only; `manifest.json`'s `held_out` says which rule).
A held-out split that ends up empty is an error (unless `train.eval_batches=0`, or no
held-out split is asked for: `data.eval_fraction=0` and no `data.eval_split`).

Bad input (non-UTF-8 bytes, binary files and records, empty files and documents, over-long
documents, broken JSON lines, corrupt `.gz` files and TFDS records) follows
`data.bad_data` (skip and count, or an error naming file and offset); see
`launch.data.badinput`. Input without one good document is an error naming the files.

OUT must be absent, empty, or this tool's own earlier output (its marker file
`encoders.outdir.MARKER`, or the `manifest.json` / shard sidecars an earlier version
wrote): a non-empty directory of anything else is refused before anything is written.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import multiprocessing
import os
import re
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator

import numpy as np
from absl import app, flags
from array_record.python.array_record_module import ArrayRecordWriter
from etils import epath
from ml_collections import config_flags

from encoders import outdir
from launch import cli
from launch.data import arrayrecord
from launch.data import badinput
from launch.data import sources
from launch.data import packing as packing_lib
from launch.data import pairs
from launch.data import pipeline as pipeline_lib
from launch.data import tokenization
from launch.data import tokenized

TOKENIZER_TRAIN_DOCS = 100_000  # sentencepiece_train learns from at most these documents
TOKENIZER_TRAIN_CHARS = 200_000_000
WRITER = "launch.preprocess"
_OUR_FILES = re.compile(r"(train|eval)-\d{5}\.(json|arrayrecord)$")


def _looks_like_our_output(names: list[str]) -> bool:
  """Output of an earlier version of this tool (before the marker file): its manifest, or
  shard sidecars of an interrupted run."""
  return arrayrecord.MANIFEST in names or any(
      _OUR_FILES.match(n) and n.endswith(".json") for n in names)


def claim_out(out: str) -> str:
  """Makes `out` ours (see the module docstring) or raises `outdir.OutputDirError`;
  -> the path to write to (absolute when local)."""
  if "://" not in out:
    if (os.path.isdir(out) and not outdir.is_ours(out)
        and _looks_like_our_output(os.listdir(out))):
      outdir.write_marker(out, WRITER)
    return outdir.claim_dir(out, f"{WRITER} --out", writers=(WRITER,))
  path = epath.Path(out)
  if path.exists():
    if not path.is_dir():
      raise outdir.OutputDirError(f"{WRITER} --out {out} exists and is not a directory; "
                                  "choose a new path")
    names = [p.name for p in path.iterdir()]
    if names and outdir.MARKER not in names and not _looks_like_our_output(names):
      raise outdir.OutputDirError(
          f"{WRITER} --out {out} is a non-empty directory this project did not write (no "
          f"{outdir.MARKER} marker); refusing to write into it: choose a new or empty "
          "directory")
    if outdir.MARKER in names and names != [outdir.MARKER]:
      try:
        writer = json.loads((path / outdir.MARKER).read_text()).get("writer") or ""
      except (ValueError, AttributeError):
        writer = ""
      if not writer.startswith(WRITER):
        raise outdir.OutputDirError(
            f"{WRITER} --out {out} holds the output of {writer or 'another tool'}; "
            "refusing to write shards into it: choose a new or empty directory")
  path.mkdir(parents=True, exist_ok=True)
  if not (path / outdir.MARKER).exists():
    (path / outdir.MARKER).write_text(json.dumps({"writer": WRITER}))
  return out


def _content_hash(text: str) -> int:
  return int.from_bytes(hashlib.sha256(text.encode("utf-8", "replace")).digest()[:8],
                        "little")


def _holdout(text: str, fraction: float) -> bool:
  """A fixed, content-based held-out choice (streaming: no document list needed)."""
  return _content_hash(text) / 2**64 < fraction


def stream_documents(data, bad: badinput.BadData) -> Iterator[tuple[str, str, str]]:
  """(split "train"|"eval", where, text) for every document of the config's source.

  With a named `data.eval_split`, held-out documents that are also training documents
  are dropped (8 bytes of hash kept per training document to find them)."""
  if not data.eval_split or data.source == "default":
    yield from _stream_documents(data, bad)
    return
  hashes, seen, dropped, held = array("Q"), None, 0, 0
  for split_name, where, text in _stream_documents(data, bad):
    if split_name == "train":
      hashes.append(_content_hash(text))
    else:
      if seen is None:  # the training documents come first: all are hashed by now
        seen = np.sort(np.frombuffer(hashes, np.uint64)) if hashes else np.zeros(
            (0,), np.uint64)
      h = np.uint64(_content_hash(text))
      held += 1
      at = int(np.searchsorted(seen, h))
      if at < len(seen) and seen[at] == h:
        dropped += 1
        continue
    yield split_name, where, text
  if dropped:
    logging.getLogger(__name__).warning(
        "held-out split: dropped %d of %d documents of data.eval_split that also occur in "
        "the training documents", dropped, held)


def _stream_documents(data, bad: badinput.BadData) -> Iterator[tuple[str, str, str]]:
  source, limit = data.source, int(data.max_documents)
  fraction = float(data.eval_fraction)
  if source == "default":
    train, held_out = sources.default_split(limit, fraction)
    for i, t in enumerate(train):
      yield "train", f"default corpus document {i}", t
    for i, t in enumerate(held_out):
      yield "eval", f"default corpus held-out document {i}", t
    return
  if source == "text":
    mode = data.get("text_document", "blank_line")
    n = 0
    for path in sources.expand_globs(data.files):
      if 0 <= limit <= n:
        break
      for offset, text in badinput.stream_text_file(path, mode, data.text_key, bad):
        if 0 <= limit <= n:
          break
        n += 1
        to_eval = not data.eval_split and _holdout(text, fraction)
        yield ("eval" if to_eval else "train"), f"{path} at byte {offset}", text
    if data.eval_split:
      n = 0
      for path in sources.expand_globs(data.eval_split, "data.eval_split"):
        for offset, text in badinput.stream_text_file(path, mode, data.text_key, bad):
          if n >= sources.EVAL_MAX_DOCUMENTS:
            return
          n += 1
          yield "eval", f"{path} at byte {offset}", text
    return
  if source == "tfds":
    splits = [("train", data.train_split, limit)]
    if data.eval_split:
      splits.append(("eval", data.eval_split, sources.EVAL_MAX_DOCUMENTS))
    for name, split_name, cap in splits:
      for i, text in sources.tfds_documents(data.tfds_name, split_name, data.tfds_data_dir,
                                            data.text_key, cap, bad):
        where = f"TFDS {data.tfds_name}/{split_name} record {i}"
        to_eval = name == "train" and not data.eval_split and _holdout(text, fraction)
        yield ("eval" if to_eval else name), where, text
    return
  raise ValueError(f"data.source={source!r}: launch.preprocess reads one of "
                   f"{sources.DOCUMENT_SOURCES}")


def _input_names(data) -> list[str]:
  """The inputs of the config's source, for messages."""
  if data.source == "text":
    return sources.expand_globs(data.files)
  if data.source == "tfds":
    return [f"TFDS {data.tfds_name}/{data.train_split}"]
  return [f"the {data.source} corpus"]


# ---- the worker: one shard ----

_WORKER = {}


def _init_worker(tok_ref):
  kind, payload, lowercase = tok_ref
  if kind.startswith("sentencepiece"):
    _WORKER["tok"] = tokenization.SentencePieceTokenizer(payload, lowercase=lowercase,
                                                         kind=kind)
  else:
    _WORKER["tok"] = tokenization.load_hf(payload, lowercase)


def _shard_rows(tok, docs, settings, shard_seed):
  seq_len = settings["seq_len"]
  if settings["packing"] == "documents":
    tokd = tokenized.tokenize_documents(tok, docs, "document")
    rows = packing_lib.pack_documents(tokd, tok, seq_len)
    if not settings["pack"]:  # one piece per row, in document order
      rows.row_offsets = np.arange(len(rows.chunk_len) + 1, dtype=np.int64)
      rows.row_chunks = np.arange(len(rows.chunk_len), dtype=np.int64)
    return tokd, (rows(i) for i in range(len(rows))), len(rows)
  tokd = tokenized.tokenize_documents(tok, docs, "sentence")
  task = settings["pair_task"]
  if tokd.num_documents < pairs.MIN_DOCUMENTS[task]:
    return tokd, iter(()), 0
  rows = pairs.build_pairs(tokd, tok, seq_len, task=task, nsp_prob=settings["nsp_prob"],
                           seed=shard_seed)
  return tokd, (rows(i, np.random.default_rng([shard_seed, i])) for i in range(len(rows))), \
      len(rows)


def write_shard(job) -> dict:
  """Tokenizes one shard's documents, writes its rows and then its sidecar."""
  out, name, docs, settings = job
  tok = _WORKER["tok"]
  seed = int.from_bytes(hashlib.sha256(f"{settings['seed']}:{name}".encode()).digest()[:4],
                        "little")
  tokd, rows, n_rows = _shard_rows(tok, docs, settings, seed)
  label_key = settings["label_key"]
  with tempfile.TemporaryDirectory() as tmp:
    local = os.path.join(tmp, f"{name}.arrayrecord")
    writer = ArrayRecordWriter(local, "group_size:64")
    for row in rows:
      writer.write(arrayrecord.encode_row(row, settings["ids_dtype"], label_key))
    writer.close()
    epath.Path(local).copy(epath.Path(out) / f"{name}.arrayrecord", overwrite=True)
  info = {"file": f"{name}.arrayrecord", "documents": tokd.num_documents,
          "tokens": tokd.num_tokens, "rows": n_rows, "settings": settings["hash"]}
  (epath.Path(out) / f"{name}.json").write_text(json.dumps(info))
  return info


# ---- the driver ----


def _tokenizer(config, out, first_docs):
  tok = tokenization.make_tokenizer(config.tokenizer, out, first_docs, multihost=False)
  if tok.kind.startswith("sentencepiece"):
    d = epath.Path(out) / "tokenizer"
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "spm.model").exists():
      (d / "spm.model").write_bytes(tok.model_proto)
    ref = (tok.kind, tok.model_proto, bool(config.tokenizer.lowercase))
  else:
    ref = (tok.kind, config.tokenizer.path, bool(config.tokenizer.lowercase))
  return tok, ref


class _Progress:
  """One status line: shards, documents/s and tokens/s (stderr, redrawn in place)."""

  def __init__(self, stream=sys.stderr):
    self.t0, self.docs, self.tokens, self.shards, self.skipped = time.time(), 0, 0, 0, 0
    self.stream = stream

  def add(self, info, reused=False):
    self.shards += 1
    if reused:
      self.skipped += 1
      return
    self.docs += info["documents"]
    self.tokens += info["tokens"]
    dt = max(time.time() - self.t0, 1e-9)
    self.stream.write(f"\rshards {self.shards} ({self.skipped} already done)  "
                      f"{self.docs:,} docs  {self.docs / dt:,.0f} docs/s  "
                      f"{self.tokens / dt:,.0f} tokens/s")
    self.stream.flush()

  def rates(self) -> dict:
    dt = max(time.time() - self.t0, 1e-9)
    return {"seconds": round(dt, 3), "docs_per_s": round(self.docs / dt, 1),
            "tokens_per_s": round(self.tokens / dt, 1)}


def preprocess(config, out: str, *, workers: int | None = None, docs_per_shard: int = 20_000,
               pack: bool = True, progress: bool = True) -> dict:
  """Writes the shards and the manifest of `config`'s corpus to `out`; returns the manifest."""
  if config.data.source == "arrayrecord":
    raise ValueError("launch.preprocess reads documents: set data.source to default, text "
                     "or tfds")
  pipeline_lib.validate(config)
  if docs_per_shard <= 0:
    raise ValueError(f"--docs_per_shard={docs_per_shard} must be positive")
  data = config.data
  workers = workers or os.cpu_count() or 1
  bad = badinput.BadData.from_config(data)
  out = claim_out(out)

  def first_docs():
    docs, chars = [], 0
    first_bad = badinput.BadData("skip", bad.max_document_bytes, bad.min_printable_ratio)
    for name, _, text in stream_documents(data, first_bad):
      if name == "train":
        docs.append(text)
        chars += len(text)
        if len(docs) >= TOKENIZER_TRAIN_DOCS or chars >= TOKENIZER_TRAIN_CHARS:
          break
    if not docs:
      raise badinput.no_documents_error(f"data.source={data.source!r}", _input_names(data),
                                        first_bad)
    return docs

  tok, tok_ref = _tokenizer(config, out, first_docs)
  packing = data.packing
  pair_task = data.get("pair_task", "nsp") if packing == "pairs" else None
  settings = {"seq_len": int(data.seq_len), "packing": packing, "pack": bool(pack),
              "pair_task": pair_task, "nsp_prob": float(config.get("objective", {}).get(
                  "nsp_prob", 0.5)), "seed": int(data.shuffle_seed),
              "ids_dtype": arrayrecord.ids_dtype(tok.vocab_size),
              "label_key": pairs.LABEL_KEYS[pair_task] if pair_task else None,
              "docs_per_shard": int(docs_per_shard),
              "source": sources.source_spec(data), "tokenizer": tok.fingerprint(),
              "bad_data": bad.policy, "max_document_bytes": bad.max_document_bytes}
  if bad.min_printable_ratio != badinput.DEFAULT_MIN_PRINTABLE_RATIO:  # (earlier hashes hold)
    settings["min_printable_ratio"] = bad.min_printable_ratio
  settings["hash"] = hashlib.sha256(json.dumps(settings, sort_keys=True,
                                               default=str).encode()).hexdigest()[:24]

  def done(name):
    f = epath.Path(out) / f"{name}.json"
    if not f.exists():
      return None
    info = json.loads(f.read_text())
    if info.get("settings") != settings["hash"]:
      raise ValueError(f"{f} was written with other settings (config, tokenizer or "
                       "flags changed): use a new --out directory or delete the old shards")
    return info

  def jobs(progress_bar):
    buffers = {"train": [], "eval": []}
    index = {"train": 0, "eval": 0}

    def flush(split_name):
      name = f"{split_name}-{index[split_name]:05d}"
      index[split_name] += 1
      docs, buffers[split_name] = buffers[split_name], []
      info = done(name)
      if info is not None:
        progress_bar.add(info, reused=True)
        finished[name] = info
        return None
      return (out, name, docs, settings)

    for split_name, _, text in stream_documents(data, bad):
      buffers[split_name].append(text)
      if len(buffers[split_name]) >= docs_per_shard:
        job = flush(split_name)
        if job:
          yield job
    for split_name in ("train", "eval"):
      if buffers[split_name]:
        job = flush(split_name)
        if job:
          yield job

  finished = {}
  bar = _Progress(sys.stderr if progress else io.StringIO())
  if workers == 1:  # in this process: no worker start-up
    _init_worker(tok_ref)
    for job in jobs(bar):
      info = write_shard(job)
      finished[info["file"][:-len(".arrayrecord")]] = info
      bar.add(info)
    _WORKER.clear()
    jobs_left = False
  else:
    jobs_left = True
  ctx = multiprocessing.get_context("spawn")
  with (ctx.Pool(workers, initializer=_init_worker, initargs=(tok_ref,)) if jobs_left
        else contextlib.nullcontext()) as pool:
    pending = []  # at most 2 shards per worker in flight: memory stays bounded

    def collect(result):
      info = result.get()
      finished[info["file"][:-len(".arrayrecord")]] = info
      bar.add(info)

    for job in (jobs(bar) if jobs_left else ()):
      pending.append(pool.apply_async(write_shard, (job,)))
      while len(pending) >= 2 * workers:
        collect(pending.pop(0))
    for result in pending:
      collect(result)
  if progress:
    sys.stderr.write("\n")

  shards = {s: [finished[k] for k in sorted(finished) if k.startswith(s + "-")]
            for s in ("train", "eval")}
  totals = {s: {k: sum(e[k] for e in shards[s]) for k in ("documents", "tokens", "rows")}
            for s in shards}
  if totals["train"]["rows"] == 0:
    raise badinput.no_documents_error(
        f"no training rows were written (data.source={data.source!r})", _input_names(data),
        bad)
  if data.eval_split:
    rule = "the named data.eval_split"
  elif data.source == "default":
    rule = "whole groups, decontaminated (launch.data.split)"
  else:
    rule = "sha256 of the document text < data.eval_fraction"
  held_out = {"eval_split": data.eval_split, "eval_fraction": float(data.eval_fraction),
              "rule": rule}
  n_docs = totals["train"]["documents"] + totals["eval"]["documents"]
  pipeline_lib.check_held_out(
      config, totals["eval"]["rows"],
      f"{totals['eval']['documents']} of {n_docs} documents were held out ({rule}; "
      f"data.eval_fraction={held_out['eval_fraction']}, data.eval_split="
      f"{data.eval_split!r}), giving {totals['eval']['rows']} rows; bad input: "
      f"{bad.summary()}",
      eval_fraction=held_out["eval_fraction"], eval_split=data.eval_split)
  manifest = {"version": 1, "seq_len": int(data.seq_len), "packing": packing,
              "pack": bool(pack), "pair_task": pair_task, "label_key": settings["label_key"],
              "ids_dtype": settings["ids_dtype"],
              "tokenizer": {"kind": tok.kind, "fingerprint": tok.fingerprint(),
                            "vocab_size": tok.vocab_size,
                            "lowercase": bool(config.tokenizer.lowercase)},
              "shards": shards, "totals": totals, "held_out": held_out,
              "bad_data": bad.counts,
              "throughput": bar.rates(), "fingerprint": settings["hash"],
              "config": {"data": config.data.to_dict(),
                         "tokenizer": config.tokenizer.to_dict()}}
  (epath.Path(out) / arrayrecord.MANIFEST).write_text(
      json.dumps(manifest, indent=1, default=str))
  return manifest


def main(argv):
  del argv
  f = flags.FLAGS
  try:
    m = preprocess(f.config, f.out, workers=f.workers, docs_per_shard=f.docs_per_shard,
                   pack=f.pack)
  except ValueError as e:  # bad settings, bad input, an --out that is not ours: one line
    cli.fail(" ".join(str(e).split()), 1)
  t = m["totals"]
  print(f"wrote {len(m['shards']['train'])} train + {len(m['shards']['eval'])} eval shards "
        f"to {f.out}: {t['train']['documents']} documents, {t['train']['tokens']} tokens, "
        f"{t['train']['rows']} rows (eval {t['eval']['rows']} rows); skipped "
        f"{ {k: v for k, v in m['bad_data'].items() if v} or 'nothing'}")


if __name__ == "__main__":
  config_flags.DEFINE_config_file("config", None, "config file[:arg]", lock_config=True)
  flags.DEFINE_string("out", None, "output directory (local or gs://)")
  flags.DEFINE_integer("workers", None, "worker processes (default: one per core)")
  flags.DEFINE_integer("docs_per_shard", 20_000, "documents per shard")
  flags.DEFINE_bool("pack", True, "packing=documents: pack pieces best-fit into rows")
  flags.mark_flags_as_required(["config", "out"])
  app.run(main, flags_parser=cli.parse_flags)
