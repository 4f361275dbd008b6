"""Sequence classification: one label per text (or text pair), softmax over the classes.

    --config configs/finetune.py:sequence     finetune.data_format: table | tfds

Data: a table (CSV / TSV / JSONL by extension, optionally .gz / .bz2) with a text column,
an optional text-pair column and a label column; or a TFDS dataset (`tfds_name`,
`tfds_data_dir` may be gs://) with those features by name. Rows encode as [CLS] text [SEP]
(pair [SEP]) truncated to seq_len, the label as its class id. Scored by accuracy and
macro-F1, with a confusion matrix; the pipeline is `classify`.
"""
import csv
import importlib.util
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from encoders.tasks import data, metrics
from encoders.tasks.base import Task, majority_accuracy, register
from encoders.tasks.data import DataError, Row


# ---- readers ----------------------------------------------------------------------------

def read_table(path: str, text: str = "text", pair: str = "", label: str = "label", *,
               bad, encoding: str = "utf-8") -> List[Row]:
  """Rows {"text", "pair"?, "label"} of a .csv / .tsv / .jsonl file (optionally .gz /
  .bz2); labels as written (the task's `labels` checks them)."""
  before = dict(bad.counts)
  ext = os.path.splitext(path.removesuffix(".bz2").removesuffix(".gz"))[1].lower()
  if ext not in (".jsonl", ".json", ".csv", ".tsv"):
    raise DataError(f"{path}: unknown table format {ext!r}; use .csv, .tsv or .jsonl")
  cols = (text, label) + ((pair,) if pair else ())
  rows = []
  if ext in (".jsonl", ".json"):
    for n, line in data.lines(path, bad, encoding):
      if not line.strip():
        continue
      where = f"{path}:{n}"
      try:
        r = json.loads(line)
      except json.JSONDecodeError as e:
        bad.report("bad_json", where, str(e))
        continue
      if not isinstance(r, dict):
        bad.report("bad_json", where, f"a JSON {type(r).__name__}, not an object")
        continue
      missing = [c for c in cols if r.get(c) is None]
      if missing:
        bad.report("bad_json", where, f"no {missing[0]!r} field (it has {sorted(r)})")
        continue
      rows.append(_table_row(r[text], r[label], r[pair] if pair else None, where, bad))
  else:
    rows = _read_delimited(path, "\t" if ext == ".tsv" else ",", cols, bad, encoding)
  rows = [r for r in rows if r is not None]
  data.need_rows(rows, path, bad, before)
  return rows


def _table_row(text, label, pair, where, bad) -> Optional[Row]:
  text = text if isinstance(text, str) else str(text)
  if not text.strip():
    bad.report("empty", where, "no text")
    return None
  row = Row(text=text, label=label)
  if pair is not None:
    row["pair"] = pair if isinstance(pair, str) else str(pair)
  return data.located(row, where)


def _read_delimited(path: str, delimiter: str, cols: Tuple[str, ...], bad,
                    encoding: str) -> List[Optional[Row]]:
  consumed = []  # the file line numbers csv has read so far

  def feed():
    for n, line in data.lines(path, bad, encoding):
      consumed.append(n)
      yield line

  csv.field_size_limit(max(csv.field_size_limit(), bad.max_document_bytes))
  reader = csv.reader(feed(), delimiter=delimiter, strict=True)
  header, rows = None, []
  while True:
    k = len(consumed)
    try:
      rec = next(reader)
    except StopIteration:
      break
    except csv.Error as e:
      bad.report("corrupt_record", f"{path}:{consumed[k] if k < len(consumed) else '?'}",
                 str(e))
      continue
    if not rec:  # a blank line
      continue
    where = f"{path}:{consumed[k]}"
    if header is None:
      header = [h.strip() for h in rec]
      for c in cols:
        if c not in header:
          raise DataError(f"{where}: no column {c!r} (the header has {header})")
      at = {c: header.index(c) for c in cols}
      continue
    if len(rec) != len(header):
      bad.report("corrupt_record", where, f"{len(rec)} fields where the header has "
                 f"{len(header)}")
      continue
    rows.append(_table_row(rec[at[cols[0]]], rec[at[cols[1]]],
                           rec[at[cols[2]]] if len(cols) > 2 else None, where, bad))
  return rows


def read_tfds(name: str, split: str, data_dir: str = "", text: str = "sentence",
              pair: str = "", label: str = "label", *, bad) -> List[Row]:
  """Rows of a TFDS dataset (data_dir may be gs://). With TensorFlow installed, any
  prepared format (tfds.load); without it, datasets prepared as array_record
  (tfds.data_source, which needs no TensorFlow). Text that is not UTF-8 is bad
  (non_utf8), an empty text too (empty), named by the example's index in the split."""
  import tensorflow_datasets as tfds  # slow to import, and only this format needs it
  before = dict(bad.counts)
  where = f"TFDS {name} split {split!r}"
  try:
    n = tfds.builder(name, data_dir=data_dir or None).info.splits[split].num_examples
  except Exception:  # pylint: disable=broad-except  (the reads below name the problem)
    n = None
  if n == 0:  # array_record's reader fails on no files with a message naming nothing
    data.need_rows([], where, bad, before)
  if importlib.util.find_spec("tensorflow") is not None:
    examples = tfds.as_numpy(tfds.load(name, split=split, data_dir=data_dir or None))
  else:
    try:
      source = tfds.data_source(name, split=split, data_dir=data_dir or None)
    except NotImplementedError as e:  # e.g. a tfrecord-only dataset
      raise DataError(f"TFDS dataset {name!r}: TensorFlow is not installed, and without "
                      f"it only array_record datasets can be read ({e})") from e
    examples = (source[i] for i in range(len(source)))
  rows = []
  cols = (text, label) + ((pair,) if pair else ())
  for i, ex in enumerate(examples):
    at = f"{where} example {i}"
    missing = [c for c in cols if c not in ex]
    if missing:
      raise DataError(f"TFDS {name}: no feature {missing[0]!r} (it has {sorted(ex)}); set "
                      "finetune.text_column / text_pair_column / label_column")
    try:
      dec = lambda v: v.decode("utf-8") if isinstance(v, bytes) else v
      t = dec(ex[text])
      p = dec(ex[pair]) if pair else None
      y = dec(ex[label])
    except UnicodeDecodeError as e:
      bad.report("non_utf8", at, f"byte {e.start}: {e.reason}")
      continue
    y = y.item() if hasattr(y, "item") else y
    row = _table_row(t, y, p, at, bad)
    if row is not None:
      rows.append(row)
  data.need_rows(rows, where, bad, before)
  return rows


# ---- labels and arrays --------------------------------------------------------------------

def class_labels(train, evals, given=(), *, bad, unknown: str = "error",
                 skipped: Optional[Dict[str, int]] = None,
                 names: Tuple[str, str] = ("the training rows", "the eval rows")):
  """-> (labels, train rows, eval rows), every row's label its canonical name. A label
  that names no class is bad input (corrupt_record); a training label outside `given`
  is an error; an eval label outside the set per `unknown` (skipped ones counted by
  label in `skipped`). `names`: the two sources, for messages."""
  skipped = {} if skipped is None else skipped
  train = data.clean_labels(train, names[0], bad)
  evals = data.clean_labels(evals, names[1], bad)
  labels = data.label_names([r["label"] for r in train], given)
  if given:
    data.check_known(train, lambda r: [r["label"]], labels, "finetune.labels", "training",
                     "error", skipped)
  elif len(labels) < 2:
    raise DataError(f"{names[0]}: {len(labels)} distinct label(s) {list(labels)}; "
                    "classification needs 2 or more (or name them in finetune.labels)")
  evals = data.check_known(evals, lambda r: [r["label"]], labels,
                           "finetune.labels" if given else "training", "eval", unknown,
                           skipped)
  data.need_known(evals, names[1], skipped)
  return labels, train, evals


def encode_sequence(tok, rows: Sequence[Dict], seq_len: int, pad_id: int,
                    labels: Sequence[str] = (), regression: bool = False) -> Dict:
  """[CLS] text [SEP] (pair [SEP]) rows, truncated to seq_len; `labels` as class ids (or
  as floats with `regression`)."""
  tok.enable_truncation(max_length=seq_len)
  inputs = [(r["text"], r["pair"]) if "pair" in r else r["text"] for r in rows]
  encs = tok.encode_batch(inputs)
  tok.no_truncation()
  index = {name: i for i, name in enumerate(labels)}
  if regression:
    y = np.asarray([float(r["label"]) for r in rows], np.float32)
  else:
    unknown = sorted({str(r["label"]) for r in rows} - set(index))
    if unknown:
      raise ValueError(f"labels {unknown[:5]} are not among the model's labels {list(labels)}")
    y = np.asarray([index[str(r["label"])] for r in rows], np.int32)
  return dict(data.text_arrays(encs, seq_len, pad_id), labels=y)


# ---- the pipeline -------------------------------------------------------------------------

def _softmax(x):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def classify(p, texts: Sequence[str], pairs=None, top_k: int = 1):
  """Per text {"label", "score"} (softmax; sigmoid for one output), or the top_k list,
  as transformers' text-classification pipeline."""
  if not isinstance(p.unit, SequenceClassification):  # regression's models are classified alike
    raise ValueError("classify needs a sequence-classification model")
  labels = p.labels()
  out = []
  for row in p.run(p.encode(texts, pairs)):
    logits = row["logits"]
    probs = 1 / (1 + np.exp(-logits.astype(np.float64))) if len(logits) == 1 else _softmax(logits)
    order = np.argsort(-probs, kind="stable")[:top_k]
    res = [{"label": labels[i], "score": float(probs[i])} for i in order]
    out.append(res[0] if top_k == 1 else res)
  return out


# ---- the task -----------------------------------------------------------------------------

def is_regression(hf: dict) -> bool:
  """transformers' reading of a ...ForSequenceClassification config: problem_type, else
  one output is regression."""
  problem = hf.get("problem_type")
  return problem == "regression" or (problem is None and int(hf.get("num_labels", len(
      hf.get("id2label") or {}) or 2)) == 1)


@register
class SequenceClassification(Task):
  name = "sequence"
  head_kind = "pooled"
  hf_suffix = "ForSequenceClassification"
  formats = ("table", "tfds")
  metrics = ("accuracy", "macro_f1")
  selection = "accuracy"

  def hf_claims(self, hf):
    return hf.get("problem_type") in (None, "single_label_classification") and not \
        is_regression(hf)

  def config_errors(self, f, seq_len):
    errs = super().config_errors(f, seq_len)
    for key in ("text_column", "label_column"):
      if not str(f.get(key, "") or ""):
        errs.append(f"finetune.{key} is empty: name the column")
    return errs

  def source_errors(self, f):
    if f.get("data_format") != "tfds":
      return super().source_errors(f)
    if not f.get("tfds_name", ""):
      return ["finetune.data_format='tfds' needs finetune.tfds_name (e.g. glue/sst2)"]
    return []

  def has_eval(self, f):
    if f.get("data_format") == "tfds":
      return bool(f.get("tfds_eval_split", ""))
    return super().has_eval(f)

  def read(self, f, split, bad):
    if f.get("data_format") != "tfds":
      return super().read(f, split, bad)
    name = f.tfds_train_split if split == "train" else f.get("tfds_eval_split", "")
    if not name:
      return None
    rows = read_tfds(f.tfds_name, name, f.tfds_data_dir, f.text_column, f.text_pair_column,
                     f.label_column, bad=bad)
    return rows, f"TFDS {f.tfds_name} split {name!r}"

  def read_file(self, path, f, bad):
    return read_table(path, f.text_column, f.text_pair_column, f.label_column, bad=bad,
                      encoding=f.get("encoding", "utf-8"))

  def labels(self, train, evals, f, bad, skipped, names):
    return class_labels(train, evals, tuple(f.labels), bad=bad,
                        unknown=str(f.get("unknown_eval_labels", "error")), skipped=skipped,
                        names=names)

  def encode(self, tok, rows, f, seq_len, pad_id, labels):
    return encode_sequence(tok, rows, seq_len, pad_id, labels), {}

  def score(self, outputs, info, labels, f):
    rows = info["rows"]
    index = {n: i for i, n in enumerate(labels)}
    gold = np.asarray([index[str(r["label"])] for r in rows])
    pred = outputs["logits"].argmax(-1)
    result = metrics.classification(gold, pred, len(labels))
    result["confusion"] = metrics.confusion_matrix(gold, pred, len(labels)).tolist()
    return result, [{"text": r["text"][:200], "label": str(r["label"]),
                     "prediction": labels[p]} for r, p in zip(rows, pred)]

  def report(self, result, labels, directory, title=""):
    if "confusion" not in result:
      return []
    path = os.path.join(directory, "confusion_matrix.png")
    return [metrics.plot_confusion(np.asarray(result["confusion"]), labels, path, title)]

  def baselines(self, train_batches, eval_items):
    return majority_accuracy(train_batches, eval_items)

  def pipeline(self, p, texts, pairs=None, top_k=1):
    return classify(p, texts, pairs, top_k)
