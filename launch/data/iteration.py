"""The `Pipeline` every data source builds: rows -> Grain batches for one process.

Iteration is a Grain `MapDataset` (range of rows -> this process's shard -> shuffle ->
repeat -> build rows -> batch), so it is deterministic given the seed, sharded by JAX
process and checkpointable: `Pipeline.train_iter()` returns a `grain.DatasetIterator`
(works with `grain.checkpoint.CheckpointSave/CheckpointRestore` inside an Orbax
CheckpointManager), and `iterator_state(it)` / `restore_iterator(pipeline, state)` give a
JSON-serializable dict for any other checkpointer.

Evaluation batches are fixed: every held-out row once (this process's share, up to a
number of batches), the last partial batch filled with `packing.padding_row`s. A held-out
split that ends up empty is an error unless the run asks for no evaluation
(`check_held_out`).
"""
from __future__ import annotations

import hashlib
import logging
from typing import Any, Sequence

import grain
import numpy as np
from absl import flags

from launch.data import packing as packing_lib
from launch.data import split

log = logging.getLogger(__name__)

Batch = dict[str, np.ndarray]


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
    ds = self.train_dataset().to_iter_dataset(
        grain.ReadOptions(num_threads=2, prefetch_buffer_size=8))
    if self.worker_count > 0:
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


class TrainIterator(grain.DatasetIterator):
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
