"""Fine-tuning data: a registered task's rows (encoders/tasks/) -> batches for the one
trainer, and the settings checked before any read.

    train, evals, info, labels = load_data(config, tok)    # the task's reader + encoder
    metrics, records = score(config, outputs, info, labels)
    for batch in batches(train, global_batch, seed, buckets=length_buckets("auto", 128)):

The task reads, labels and encodes its rows (`finetune.task`, `finetune.data_format`,
`finetune.encoding`); splits are the given eval file / split, else a seeded held-out
fraction of the train rows (`holdout`). Bad rows follow data.bad_data. Rows are padded to
seq_len on the right; `example_weight` is 1 for real rows. `batches` cuts each batch to a
length bucket (`length_buckets`) or packs it (`pack_rows`).
"""
import functools
import logging
import math
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from encoders import tasks
from encoders.tasks import data as task_data
from encoders.tasks.data import UNKNOWN_EVAL_LABELS, canonical_label, label_names  # noqa: F401
from encoders.tasks.qa import best_spans, encode_qa, read_squad  # noqa: F401
from encoders.tasks.regression import regression_labels  # noqa: F401
from encoders.tasks.sequence import class_labels, encode_sequence, read_table, read_tfds  # noqa: F401
from encoders.tasks.token import encode_tokens, read_conll, tag_labels  # noqa: F401
from encoders.tokenizer import load_tokenizer  # noqa: F401
from launch.data import badinput

log = logging.getLogger("encoder_zoo")
IGNORE = tasks.IGNORE
# Input that cannot train the run (a file with no usable rows, a label outside the label
# set, ...): a ValueError the entry point prints as one line (exit 1).
DataError = badinput.InputDataError


def _default_bad(fn):
  """`fn` with data.bad_data's default policy ("skip") when called without `bad`, as
  launch.finetune reads."""
  @functools.wraps(fn)
  def wrapped(*args, bad=None, **kwargs):
    return fn(*args, bad=bad if bad is not None else badinput.BadData(), **kwargs)
  return wrapped


read_table, read_conll, read_squad, read_tfds, class_labels = (
    _default_bad(fn) for fn in (read_table, read_conll, read_squad, read_tfds, class_labels))


def holdout(n: int, fraction: float, seed: int) -> Tuple[np.ndarray, np.ndarray]:
  """(train, eval) indices: a seeded random `fraction` of range(n) held out."""
  if not 0 < fraction < 1:
    raise ValueError(f"eval fraction must be in (0, 1), got {fraction}")
  if n < 2:
    raise DataError(f"{n} row(s) cannot be split into train and eval rows; give more rows "
                     "or finetune.eval_file")
  perm = np.random.default_rng(seed).permutation(n)
  k = min(n - 1, max(1, int(round(n * fraction))))
  return np.sort(perm[k:]), np.sort(perm[:k])




def selection_metric(config) -> str:
  """The metric that picks the best epoch: finetune.selection_metric, else the task's."""
  f = config.finetune
  return str(f.get("selection_metric", "") or "") or tasks.get(f.task).selection


def config_errors(config) -> List[str]:
  """The fine-tuning settings that can be checked before any data is read: one message
  per bad key (its value and the fix)."""
  f, errs = config.finetune, []
  init_from = str(config.get("init_from", "") or "")
  if not init_from:
    errs.append("fine-tuning needs --config.init_from=DIR (an HF directory)")
  elif "://" not in init_from and not os.path.isdir(init_from):
    errs.append(f"init_from={init_from!r} is not a directory (an HF directory is needed)")
  seq_len, gb = config.data.seq_len, config.data.global_batch
  try:
    task = tasks.get(f.get("task"))
  except ValueError:
    task = None
    errs.append(f"finetune.task={f.get('task')!r}; expected one of {tasks.names()}")
  if task is not None:
    fmt = f.get("data_format")
    if fmt not in task.formats:
      errs.append(f"finetune.data_format={fmt!r} does not fit task {task.name!r}; expected "
                  f"one of {task.formats}")
    errs += task.config_errors(f, seq_len if isinstance(seq_len, int) else 0)
    chosen = str(f.get("selection_metric", "") or "")
    if chosen and chosen not in task.metrics:
      errs.append(f"finetune.selection_metric={chosen!r} is not a metric of the "
                  f"{task.name!r} task; choose from {task.metrics} (or '' for "
                  f"{task.selection!r})")
    if not task.has_eval(f):
      try:
        frac = float(f.eval_fraction)
      except (TypeError, ValueError):
        frac = math.nan
      if not 0 < frac < 1:
        errs.append(f"finetune.eval_fraction={f.eval_fraction!r} must be in (0, 1) (or give "
                    "finetune.eval_file)")
  why = task_data.check_encoding(f.get("encoding", "utf-8"))
  if why:
    errs.append(why)
  if not isinstance(f.epochs, int) or f.epochs < 1:
    errs.append(f"finetune.epochs={f.epochs!r} must be an integer >= 1")
  if not isinstance(f.max_train_rows, int) or not (f.max_train_rows == -1
                                                   or f.max_train_rows >= 1):
    errs.append(f"finetune.max_train_rows={f.max_train_rows!r} must be -1 (all) or >= 1")
  if str(f.get("unknown_eval_labels", "error")) not in UNKNOWN_EVAL_LABELS:
    errs.append(f"finetune.unknown_eval_labels={f.get('unknown_eval_labels')!r}; expected "
                f"one of {UNKNOWN_EVAL_LABELS}")
  if not isinstance(seq_len, int) or seq_len < 4:
    errs.append(f"data.seq_len={seq_len!r} must be an integer >= 4")
  else:
    try:
      length_buckets(f.get("length_buckets", "auto"), seq_len)
    except ValueError as e:
      errs.append(str(e))
  if not isinstance(gb, int) or gb < 1:
    errs.append(f"data.global_batch={gb!r} must be an integer >= 1")
  return errs


def load_data(config, tok, bad=None, report=None):
  """-> (train arrays, eval arrays, eval info for scoring, labels). Bad rows follow
  `bad` (a badinput.BadData: data.bad_data); `report` (a dict) receives what was skipped:
  per kind of bad input, and eval rows whose label is outside the label set."""
  f, m = config.finetune, config.model
  task = tasks.get(f.task)
  seq_len, pad = int(config.data.seq_len), int(m.pad_token_id)
  bad = bad if bad is not None else badinput.BadData.from_config(config.data)
  report = {} if report is None else report
  train, train_name = task.read(f, "train", bad)
  evals = task.read(f, "eval", bad)
  if evals is None:
    if len(train) < 2:
      raise DataError(f"{train_name}: {len(train)} usable row; holding out eval rows needs "
                      "2 or more (or give finetune.eval_file)")
    tr, ev = holdout(len(train), float(f.eval_fraction), int(f.split_seed))
    train, evals = [train[i] for i in tr], [train[i] for i in ev]
    names = (f"{train_name} (training part)", f"{train_name} (held-out part)")
  else:
    evals, eval_name = evals
    names = (train_name, eval_name)
  if int(f.max_train_rows) > 0:
    train = train[:int(f.max_train_rows)]
  skipped = {}  # eval rows with a label outside the set, by label
  labels, train, evals = task.labels(train, evals, f, bad, skipped, names)
  report["bad_data"] = {k: v for k, v in bad.counts.items() if v}
  report["skipped_bad_rows"] = bad.total
  report["skipped_eval_rows"] = sum(skipped.values())
  report["unknown_eval_labels"] = dict(sorted(skipped.items()))
  if bad.total or skipped:
    log.warning("fine-tuning data: skipped %d bad row(s) %s and %d eval row(s) with labels "
                "outside the label set %s", bad.total, report["bad_data"],
                report["skipped_eval_rows"], report["unknown_eval_labels"])
  train_arrays, _ = task.encode(tok, train, f, seq_len, pad, labels)
  eval_arrays, info = task.encode(tok, evals, f, seq_len, pad, labels)
  return train_arrays, eval_arrays, dict(info, rows=evals), tuple(labels)


def score(config, outputs, info, labels):
  """(metrics, prediction records) from the eval rows' model outputs (numpy)."""
  return tasks.get(config.finetune.task).score(outputs, info, labels, config.finetune)


def length_buckets(spec, seq_len: int) -> Tuple[int, ...]:
  """The row widths batches are trimmed to (`finetune.length_buckets`), ascending, the
  last = seq_len: "auto" (16, 24, 32, 48, 64, 96, ... below seq_len, then seq_len), "off" (seq_len
  only: every batch full width), or comma-separated widths ("32,64"; seq_len is added)."""
  spec = str(spec).strip().lower()
  if spec == "off":
    return (seq_len,)
  if spec == "auto":  # 16, 24, 32, 48, 64, 96, ...: at most a third of a batch is padding
    widths, w = [], 16
    while w < seq_len:
      widths.append(w)
      if w + w // 2 < seq_len:
        widths.append(w + w // 2)
      w *= 2
    return tuple(widths) + (seq_len,)
  try:
    widths = sorted({int(x) for x in spec.split(",") if x.strip()})
  except ValueError:
    raise ValueError(f"finetune.length_buckets={spec!r}: use 'auto', 'off' or widths "
                     "like '32,64,128'") from None
  if any(w < 1 or w > seq_len for w in widths):
    raise ValueError(f"finetune.length_buckets={spec!r}: every width must be in "
                     f"[1, seq_len={seq_len}]")
  return tuple(w for w in widths if w < seq_len) + (seq_len,)


def trim_to_bucket(batch: Dict[str, np.ndarray], buckets: Sequence[int],
                   groups: Optional[Sequence[Sequence[str]]] = None) -> Dict:
  """The batch's (rows, ..., seq_len) arrays cut to the smallest bucket that holds every
  column any row attends to, so only padding columns (attention_mask 0 in every row)
  go. Several texts per row (`<prefix>attention_mask` with its `<prefix>input_ids`,
  ...: a pair task's roles) are cut to one width, that of the longest text of any role;
  with `groups` (a task's `width_groups`: tuples of prefixes), each group to its own."""
  prefixes = [k[:-len("attention_mask")] for k in batch if k.endswith("attention_mask")]
  if groups is None:
    groups = [prefixes]
  else:
    groups = [[p for p in g if p in prefixes] for g in groups]
    missing = [p for p in prefixes if not any(p in g for g in groups)]
    if missing:
      raise ValueError(f"text fields with prefixes {missing} are in no width group")
  out = dict(batch)
  for group in groups:
    if not group:
      continue
    masks = [batch[p + "attention_mask"] for p in group]
    seq_len = masks[0].shape[-1]
    cols = np.zeros(seq_len, bool)
    for m in masks:
      cols |= m.reshape(-1, seq_len).any(0)
    longest = int(cols.nonzero()[0].max()) + 1 if cols.any() else 1
    width = next(w for w in buckets if w >= longest)
    if width >= seq_len:
      continue
    if group == [""] and prefixes == [""]:  # one text per row: every (rows, seq_len) array
      keys = [k for k, v in batch.items() if v.ndim == 2 and v.shape[1] == seq_len]
    else:
      keys = [p + k for p in group for k in ("input_ids", "attention_mask",
                                             "token_type_ids") if p + k in batch]
    out.update({k: batch[k][..., :width] for k in keys})
  return out


def row_buckets(batch_size: int, unit: int = 1) -> Tuple[int, ...]:
  """The row counts packed batches are padded to: multiples of `unit` (what the batch
  must split into: data-parallel shards x micro-batches), k * unit for k = 1, 2, ..., 8,
  then 10, 12, 14, 16, 20, 24, 28, 32, 40, ... (at most a quarter more than needed), up
  to `batch_size` rounded up to `unit` (one example per row: the most a batch can need)."""
  top = -(-batch_size // unit) * unit
  counts, k = [], 1
  while k * unit < top:
    counts.append(k * unit)
    k += max(1, 2 ** (k.bit_length() - 1) // 4)
  return tuple(counts) + (top,)


def pack_rows(batch: Dict[str, np.ndarray], task, rows: Sequence[int],
              pad_id: int = 0, seen: Optional[set] = None) -> Dict[str, np.ndarray]:
  """One batch of examples (rows padded on the right, `example_weight` 0 on filler rows)
  -> the same examples packed several to a row of the batch's width, first-fit by
  decreasing length (`finetune.packing`); `task` a registered task or its name.

  Each example keeps its tokens, token types and labels; `segment_ids` numbers the
  examples of a row 1, 2, ... (0 = padding), so the encoder attends within an example
  only and restarts its positions there. Labels become per token: `labels` (rows, width)
  with IGNORE where nothing is scored (a sequence example's label sits on its first
  token) and `label_weight` (rows, width) 1 where a label is scored. Filler examples
  (weight 0) are dropped; the row count is padded up to the first of `rows` (ascending)
  that holds them, with empty rows (segment 0, weight 0). `seen` (a set the caller keeps
  across batches: the row counts already used, i.e. compiled): a batch with filler rows
  (an epoch's last, short batch) takes the smallest count already compiled that holds it
  instead, as one padded step costs less than a compile."""
  unit = tasks.get(task) if isinstance(task, str) else task
  if not unit.packable:
    packable = [t.name for t in tasks.registered() if t.packable]
    raise ValueError(f"packing supports the tasks that allow it ({', '.join(packable)}), "
                     f"not {unit.name!r}")
  mask = np.asarray(batch["attention_mask"])
  width = mask.shape[1]
  lengths = mask.sum(1).astype(np.int64)
  if (mask.cumsum(1) != np.minimum(np.arange(1, width + 1)[None], lengths[:, None])).any():
    raise ValueError("packing needs right-padded rows (attention_mask 1...1 0...0)")
  keep = [i for i in np.argsort(-lengths, kind="stable") if batch["example_weight"][i] > 0]
  if lengths[keep].max(initial=0) > width:
    raise ValueError(f"an example of {lengths[keep].max()} tokens does not fit a packed "
                     f"row of {width}")
  fill, placed = [], []  # per row: used columns; per example: (row, start column)
  for i in keep:
    r = next((j for j, used in enumerate(fill) if used + lengths[i] <= width), len(fill))
    if r == len(fill):
      fill.append(0)
    placed.append((i, r, fill[r]))
    fill[r] += int(lengths[i])
  fits = [r for r in rows if r >= len(fill)]
  if not fits:
    raise ValueError(f"{len(fill)} packed rows exceed the largest row count {rows[-1]}")
  n_rows = fits[0]
  if seen is not None:
    if len(keep) < len(lengths):  # a short batch: reuse a compiled count if one fits
      n_rows = min((r for r in seen if r >= len(fill)), default=n_rows)
    seen.add(n_rows)
  regression = np.issubdtype(batch["labels"].dtype, np.floating)  # no IGNORE: weight 0
  out = {"input_ids": np.full((n_rows, width), pad_id, np.int32),
         "attention_mask": np.zeros((n_rows, width), np.int32),
         "token_type_ids": np.zeros((n_rows, width), np.int32),
         "segment_ids": np.zeros((n_rows, width), np.int32),
         "labels": np.full((n_rows, width), 0.0 if regression else IGNORE,
                           np.float32 if regression else np.int32),
         "label_weight": np.zeros((n_rows, width), np.float32)}
  segment = np.zeros(n_rows, np.int32)
  for i, r, start in placed:
    n, cols = int(lengths[i]), slice(start, start + int(lengths[i]))
    segment[r] += 1
    out["input_ids"][r, cols] = batch["input_ids"][i, :n]
    out["attention_mask"][r, cols] = 1
    out["token_type_ids"][r, cols] = batch["token_type_ids"][i, :n]
    out["segment_ids"][r, cols] = segment[r]
    if unit.token_labels:
      out["labels"][r, cols] = batch["labels"][i, :n]
      out["label_weight"][r, cols] = (batch["labels"][i, :n] != IGNORE)
    else:  # an example's label at its first token, where its pooled logits sit
      out["labels"][r, start] = batch["labels"][i]
      out["label_weight"][r, start] = 1.0
  return out


def batches(arrays: Dict[str, np.ndarray], batch_size: int, seed: Optional[int] = None,
            buckets: Optional[Sequence[int]] = None, pack: Optional[Dict] = None,
            start: int = 0, groups: Optional[Sequence[Sequence[str]]] = None):
  """Batches of `batch_size` rows (shuffled by `seed` when given); the last is padded
  with copies of row 0 at example_weight 0, so every batch has `batch_size` rows. With
  `buckets` (length_buckets), each batch's sequence arrays are cut to the smallest
  width that holds its longest row: a few shapes (one compiled step each) instead of
  computing every row at full seq_len. With `pack` (pack_rows' task, rows, pad_id,
  seen), each batch's `batch_size` examples are packed into rows of the arrays' width
  instead (no cut: the rows are full, their count adapts). `start`: the batches from
  that index on (a resumed epoch: the same order, the first `start` batches not built;
  pack's `seen` must then be the one saved with the position). `groups`: the task's
  `width_groups` (trim_to_bucket)."""
  n = len(arrays["example_weight"])
  order = np.arange(n) if seed is None else np.random.default_rng(seed).permutation(n)
  for lo in range(int(start) * batch_size, n, batch_size):
    idx = order[lo:lo + batch_size]
    fill = batch_size - len(idx)
    take = np.concatenate([idx, np.zeros(fill, np.int64)]) if fill else idx
    b = {k: v[take] for k, v in arrays.items()}
    if fill:
      b["example_weight"] = b["example_weight"].copy()
      b["example_weight"][len(idx):] = 0.0
    if pack is not None:  # rows filled to the width: the row count adapts instead
      yield pack_rows(b, **pack)
    else:
      yield trim_to_bucket(b, buckets, groups) if buckets else b
