"""`make_pipeline(config, workdir)`: documents -> tokens -> rows -> a `Pipeline`.

All documents are tokenized once, up front, on every process (rows are then sharded);
token ids are cached in `<workdir>/data_cache/<hash>.npz`, with the counts of the bad
input skipped while reading them (`Pipeline.stats["bad_data"]`, `launch.data.badinput`).
`data.source="arrayrecord"` reads pretokenized shards instead (`launch.data.arrayrecord`).
The `Pipeline` itself (Grain iteration, resumable state, evaluation batches) is in
`launch.data.iteration`.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import time

import jax
import numpy as np

from launch.data import arrayrecord
from launch.data import badinput
from launch.data import packing as packing_lib
from launch.data import pairs
from launch.data import sources
from launch.data import tokenization
from launch.data import tokenized
from launch.data.iteration import Pipeline, check_held_out

PACKINGS = ("documents", "pairs")
CACHE_VERSION = 3  # 3: bad input per data.bad_data, its counts stored with the tokens
log = logging.getLogger(__name__)


def _process_info(process_index, process_count) -> tuple[int, int]:
  if process_index is None or process_count is None:
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} outside [0, {process_count})")
  return int(process_index), int(process_count)


def _nsp_prob(config) -> float:
  return float(config.get("objective", {}).get("nsp_prob", 0.5))


def validate(config) -> None:
  """Raises a ValueError naming the first bad setting of `config.data` / `tokenizer`."""
  data = config.data
  if data.source not in sources.SOURCES:
    raise ValueError(f"data.source={data.source!r}; expected one of {sources.SOURCES}")
  badinput.check_settings(*badinput.settings(data))
  if data.source == "arrayrecord":
    arrayrecord.check_manifest(data)
  sources.check_eval_split(data)
  if data.packing not in PACKINGS:
    raise ValueError(f"data.packing={data.packing!r}; expected one of {PACKINGS}")
  pairs.check_task(data.get("pair_task", "nsp"))
  if config.tokenizer.kind not in tokenization.KINDS:
    raise ValueError(f"tokenizer.kind={config.tokenizer.kind!r}; expected one of "
                     f"{tokenization.KINDS}")
  mode = data.get("text_document", "blank_line")
  if mode not in sources.TEXT_DOCUMENT_MODES:
    raise ValueError(f"data.text_document={mode!r}; expected one of "
                     f"{sources.TEXT_DOCUMENT_MODES}")
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
  if int(data.max_documents) == 0 or int(data.max_documents) < -1:
    raise ValueError(f"data.max_documents={data.max_documents}: use -1 (all of them) or a "
                     "positive number")
  if int(data.num_epochs) == 0 or int(data.num_epochs) < -1:
    raise ValueError(f"data.num_epochs={data.num_epochs}: use -1 (forever) or a positive "
                     "number")
  if data.packing == "pairs" and not 0 <= _nsp_prob(config) <= 1:
    raise ValueError(f"objective.nsp_prob={_nsp_prob(config)} must be in [0, 1]")


def _held_out_why(data, train_docs: int, eval_docs: int, bad: dict) -> str:
  if data.eval_split:
    head = f"data.eval_split={data.eval_split!r} gave {eval_docs} usable documents"
  else:
    head = (f"data.eval_fraction={float(data.eval_fraction)} of {train_docs + eval_docs} "
            f"usable documents held out {eval_docs}")
    if data.source == "default":
      head += " (after dropping held-out text shared with training)"
  if eval_docs:
    head += ", which give no held-out rows"
    if data.packing == "pairs":
      head += f" (pairs need at least {pairs.MIN_DOCUMENTS[data.get('pair_task', 'nsp')]})"
  skipped = ", ".join(f"{v} {k}" for k, v in bad.items())
  return head + (f"; bad input skipped: {skipped}" if skipped else "")


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
  validate(config)
  if config.data.source == "arrayrecord":  # pretokenized shards (launch.preprocess)
    return arrayrecord.make_pipeline(config, workdir, **dict(zip(
        ("process_index", "process_count"), _process_info(process_index, process_count))))
  data = config.data
  process_index, process_count = _process_info(process_index, process_count)
  if int(data.global_batch) % process_count:
    raise ValueError(f"data.global_batch={data.global_batch} is not divisible by the "
                     f"{process_count} processes")
  t0 = time.perf_counter()
  seq_len, packing = int(data.seq_len), data.packing
  pair_task = data.get("pair_task", "nsp") if packing == "pairs" else None
  seed = int(data.shuffle_seed)
  nsp_prob = _nsp_prob(config)

  bad = badinput.BadData.from_config(data)

  @functools.cache
  def documents():
    train_docs, eval_docs = sources.load_documents(data, bad)
    if not eval_docs:  # before a tokenizer is trained or anything tokenized
      check_held_out(config, 0, _held_out_why(data, len(train_docs), 0, bad.nonzero()),
                     eval_fraction=float(data.eval_fraction), eval_split=data.eval_split)
    return train_docs, eval_docs

  tokenizer = tokenization.make_tokenizer(config.tokenizer, workdir, lambda: documents()[0])
  t_tok = time.perf_counter()

  unit = "document" if packing == "documents" else "sentence"
  key_spec = {"version": CACHE_VERSION, "data": sources.source_spec(data),
              "tokenizer": tokenizer.fingerprint(), "unit": unit,
              "max_unit_chars": tokenized.MAX_UNIT_CHARS,
              "bad_data": badinput.settings(data)}
  key = hashlib.sha256(json.dumps(key_spec, sort_keys=True, default=str).encode()).hexdigest()
  cache_path = f"{workdir}/data_cache/{key[:24]}.npz" if workdir else None
  arrays = tokenized.load_npz(cache_path) if cache_path else None
  if arrays is not None and "bad_data" in arrays:
    train_tok = tokenized.TokenizedDocuments.from_arrays("train", arrays)
    eval_tok = tokenized.TokenizedDocuments.from_arrays("eval", arrays)
    bad_counts = {k: int(v) for k, v in json.loads(str(arrays["bad_data"])).items()}
  else:
    arrays = None
    train_docs, eval_docs = documents()
    train_tok = tokenized.tokenize_documents(tokenizer, train_docs, unit)
    eval_tok = tokenized.tokenize_documents(tokenizer, eval_docs, unit)
    bad_counts = bad.nonzero()
    if cache_path and process_index == 0:
      tokenized.save_npz(cache_path, {**train_tok.to_arrays("train"),
                                      **eval_tok.to_arrays("eval"),
                                      "bad_data": np.array(json.dumps(bad_counts))})
  if train_tok.num_tokens == 0:
    raise ValueError("the training documents tokenize to nothing")
  t_data = time.perf_counter()

  if packing == "documents":
    train_rows = packing_lib.pack_documents(train_tok, tokenizer, seq_len)
    eval_rows = packing_lib.pack_documents(eval_tok, tokenizer, seq_len)
  else:
    if train_tok.num_documents < pairs.MIN_DOCUMENTS[pair_task]:
      raise ValueError(f"packing=pairs with pair_task={pair_task} needs at least "
                       f"{pairs.MIN_DOCUMENTS[pair_task]} training documents (got "
                       f"{train_tok.num_documents})")
    build = functools.partial(pairs.build_pairs, tokenizer=tokenizer, seq_len=seq_len,
                              task=pair_task, nsp_prob=nsp_prob, seed=seed)
    train_rows = build(train_tok)
    eval_rows = (build(eval_tok) if eval_tok.num_documents >= pairs.MIN_DOCUMENTS[pair_task]
                 else [])
  t_rows = time.perf_counter()
  check_held_out(config, len(eval_rows),
                 _held_out_why(data, train_tok.num_documents, eval_tok.num_documents,
                               bad_counts),
                 eval_fraction=float(data.eval_fraction), eval_split=data.eval_split)

  stats = {
      "train_documents": train_tok.num_documents, "train_tokens": train_tok.num_tokens,
      "eval_documents": eval_tok.num_documents, "eval_tokens": eval_tok.num_tokens,
      "train_rows": len(train_rows), "eval_rows": len(eval_rows),
      "tokenizer_s": round(t_tok - t0, 3), "tokenize_s": round(t_data - t_tok, 3),
      "rows_s": round(t_rows - t_data, 3), "cached": arrays is not None,
      "bad_data": bad_counts,
  }
  if packing == "documents":
    stats["fill"] = round(train_rows.content_tokens / max(1, len(train_rows) * seq_len), 4)
  fp_spec = {"rows": key, "packing": packing, "seq_len": seq_len, "seed": seed,
             "nsp_prob": nsp_prob, "global_batch": int(data.global_batch),
             "num_epochs": int(data.num_epochs), "process": [process_index, process_count],
             "worker_count": int(data.worker_count)}
  if pair_task:
    fp_spec["pair_task"] = pair_task
  fingerprint = hashlib.sha256(json.dumps(fp_spec, sort_keys=True).encode()).hexdigest()[:32]
  log.info("data: %s", stats)
  return Pipeline(tokenizer=tokenizer, train_rows=train_rows, eval_rows=eval_rows,
                  packing=packing, seq_len=seq_len, global_batch=int(data.global_batch),
                  seed=seed, num_epochs=int(data.num_epochs),
                  worker_count=int(data.worker_count), process_index=process_index,
                  process_count=process_count, fingerprint=fingerprint, stats=stats)
