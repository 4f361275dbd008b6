"""Rows -> Grain iteration: the `Pipeline` of one process, and `make_pipeline`.

Iteration is a Grain `MapDataset` (range of rows -> this process's shard -> shuffle ->
repeat -> build rows -> batch), so it is deterministic given the seed, sharded by JAX
process and checkpointable: `Pipeline.train_iter()` returns a `grain.DatasetIterator`
(works with `grain.checkpoint.CheckpointSave/CheckpointRestore` inside an Orbax
CheckpointManager), and `iterator_state(it)` / `restore_iterator(pipeline, state)` give a
JSON-serializable dict for any other checkpointer.

Evaluation batches are fixed: every held-out row once (this process's share, up to a
number of batches), the last partial batch filled with `packing.padding_row`s. A held-out
split that ends up empty (every held-out document bad, too few documents for
`data.eval_fraction`, ...) is an error unless `train.eval_batches=0` asks for no
evaluation or the config asks for no held-out split (`data.eval_fraction=0` and no
`data.eval_split`: a warning says there is no evaluation).

All documents are tokenized once, up front, on every process (rows are then sharded);
token ids are cached in `<workdir>/data_cache/<hash>.npz`, with the counts of the bad
input skipped while reading them (`Pipeline.stats["bad_data"]`, `launch.data.badinput`).
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from typing import Any, Sequence

import numpy as np

from launch.data import badinput
from launch.data import packing as packing_lib
from launch.data import sources
from launch.data import split
from launch.data import tokenization
from launch.data import tokenized
from launch.data import pairs

PACKINGS = ("documents", "pairs")
CACHE_VERSION = 3  # 3: bad input per data.bad_data, its counts stored with the tokens
log = logging.getLogger(__name__)

Batch = dict[str, np.ndarray]


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
    packing: "documents" or "pairs".
    seq_len: T, tokens per row.
    batch_size: B, rows per batch on this process (global_batch // process_count).
    num_train_rows: rows in one epoch over all processes.
    rows_per_process: rows in one epoch of this process.
    steps_per_epoch: batches in one epoch (the same on every process).
    num_eval_rows: held-out rows on this process.
    label_key: the pair label's batch key (None for documents).
    fingerprint: hash of everything that determines the row stream.
    stats: numbers about the data (documents, tokens, padding), JSON-serializable;
      `stats["bad_data"]`: {kind: count} of the bad input skipped at start-up
      (`bad_data()` adds what the shard readers met since).
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
    self.label_key = train_rows.label_key
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

  def bad_data(self) -> dict[str, int]:
    """{kind: count} of all bad input skipped so far: at start-up, and by the row readers
    of this process since (ArrayRecord records read in Grain worker processes, with
    `data.worker_count > 0`, are counted in those workers and logged there)."""
    counts = dict(self.stats.get("bad_data", {}))
    for rows in (self._train_rows, self._eval_rows):
      for k, v in getattr(rows, "bad_counts", dict)().items():
        counts[k] = counts.get(k, 0) + v
    return counts

  def train_dataset(self):
    """The Grain `MapDataset` of this process's batches (infinite when num_epochs=-1)."""
    import grain  # pylint: disable=g-import-not-at-top
    ds = grain.MapDataset.range(self.num_train_rows)
    ds = ds[self.process_index::self.process_count]
    ds = ds.shuffle(seed=self.seed)
    ds = ds.repeat(None if self.num_epochs < 0 else self.num_epochs)
    if self._train_rows.needs_rng:
      ds = ds.random_map(self._train_rows, seed=_mix_seed(self.seed, self.process_index))
    else:
      ds = ds.map(self._train_rows)
    return ds.batch(self.batch_size, drop_remainder=True, batch_fn=_stack)

  def train_iter(self, start_state: dict | None = None) -> "TrainIterator":
    """An iterator over this process's training batches (dicts, see `launch.data`).

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

  def _eval_row(self, i: int) -> dict[str, np.ndarray]:
    if self._eval_rows.needs_rng:
      return self._eval_rows(i, np.random.default_rng([self.seed, i]))
    return self._eval_rows(i)

  def eval_batches(self, n: int) -> list[Batch]:
    """Up to `n` fixed batches of held-out rows (this process's share), same every call.

    Each held-out row of this process appears at most once (exactly once when `n`
    batches hold them all); the last batch is filled up with `packing.padding_row`s
    (pair label -1), which count in no loss or metric. Every process returns the same
    number of batches (a multi-host eval would hang otherwise), so a process with fewer
    rows pads more. [] when there is no held-out data.
    """
    rows = self._eval_rows
    if len(rows) == 0 or n <= 0:
      return []
    order = np.random.default_rng(split.EVAL_SPLIT_SEED).permutation(len(rows))
    mine = order[self.process_index::self.process_count]
    most = -(-len(rows) // self.process_count)  # rows of the process with the most
    count = min(n, -(-most // self.batch_size))
    pad = packing_lib.padding_row(self.seq_len, self.tokenizer.pad_id, self.label_key)
    out = []
    for b in range(count):
      idx = mine[b * self.batch_size:(b + 1) * self.batch_size]
      batch = [self._eval_row(int(i)) for i in idx]
      batch += [pad] * (self.batch_size - len(batch))
      out.append(_stack(batch))
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


def _nsp_prob(config) -> float:
  return float(config.get("objective", {}).get("nsp_prob", 0.5))


def validate(config) -> None:
  """Raises a ValueError naming the first bad setting of `config.data` / `tokenizer`."""
  data = config.data
  if data.source not in sources.SOURCES:
    raise ValueError(f"data.source={data.source!r}; expected one of {sources.SOURCES}")
  badinput.check_settings(*badinput.settings(data))
  if data.source == "arrayrecord":
    from launch.data import arrayrecord  # pylint: disable=g-import-not-at-top
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


def eval_wanted(config) -> bool:
  """False when the run asks for no evaluation (`train.eval_batches=0`)."""
  train = config.get("train", None)
  return train is None or int(train.get("eval_batches", 1)) != 0


def check_held_out(config, eval_rows: int, why: str, *, eval_fraction: float,
                   eval_split: str) -> None:
  """Raises a one-line ValueError when the held-out split has no rows but one is wanted.

  Wanted: the run evaluates (`train.eval_batches` is not 0) and the data asks for a
  held-out split (`eval_fraction > 0` or a named `eval_split`). With neither a held-out
  split nor `train.eval_batches=0`, a warning says there will be no evaluation.
  """
  if eval_rows > 0 or not eval_wanted(config):
    return
  if not eval_split and float(eval_fraction) <= 0:
    log.warning("no held-out data (data.eval_fraction=0 and no data.eval_split): this run "
                "has no evaluation")
    return
  raise ValueError(f"the held-out split is empty: {why}; use more documents, a larger "
                   "data.eval_fraction or a data.eval_split, or set "
                   "--config.train.eval_batches=0 to train without evaluation")


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
    from launch.data import arrayrecord  # pylint: disable=g-import-not-at-top
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
