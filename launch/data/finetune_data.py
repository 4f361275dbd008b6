"""Fine-tuning data: labelled files -> fixed-length numpy rows for encoders/tasks.py heads.

Readers (`finetune.data_format`):
  table   CSV / TSV / JSONL (by extension) with a text column, an optional text-pair
          column and a label column (names, or numbers for regression);
  conll   CoNLL-style token/tag files: one token per line, the token first and the tag
          last (whitespace separated), sentences separated by blank lines;
          -DOCSTART- lines are skipped;
  squad   SQuAD-format JSON (v1.1, or v2.0 with is_impossible / empty answers);
  tfds    a TFDS dataset (`tfds_name`, `tfds_data_dir` may be gs://): text, pair and
          label features by name (e.g. glue/sst2: sentence, label).
Splits: the given eval file / split, else a seeded held-out fraction of the train rows.
Bad rows (see "readers" below) follow data.bad_data; labels are canonical class names from
the training rows or finetune.labels (see "labels" below).

Encoders (a `tokenizers.Tokenizer`, the checkpoint's own):
  sequence  [CLS] text [SEP] (pair [SEP]) truncated to seq_len; label id or float;
  token     words pre-tokenized; the FIRST sub-token of each word carries its tag, the
            other sub-tokens, special tokens and padding -100; words cut off by the
            length limit are predicted "O" when scored;
  qa        question + context in windows of seq_len tokens that overlap by `stride`
            tokens of context; the answer's first and last token in a window that holds
            it whole, else 0 (the [CLS] position: "no answer here").
Rows are padded to seq_len with the model's pad id (on the right); `example_weight` is 1
for real rows. `batches` cuts each batch to a length bucket (`length_buckets`).
"""
import csv
import decimal
import json
import math
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

import logging

from launch.data import badinput
from objectives import task_metrics as tm

log = logging.getLogger("encoder_zoo")
SELECTION = {"sequence": "accuracy", "regression": "pearson", "token": "entity_f1",
             "qa": "f1"}
FORMATS = {"sequence": ("table", "tfds"), "token": ("conll",), "qa": ("squad",)}
IGNORE = -100
# Input that cannot train the run (a file with no usable rows, a label outside the label
# set, ...): a ValueError the entry point prints as one line (exit 1).
DataError = badinput.InputDataError


# ---- tokenizer --------------------------------------------------------------------------

def load_tokenizer(path: str, lowercase: Optional[bool] = None):
  """A `tokenizers.Tokenizer` from tokenizer.json (a file or a directory holding one),
  else a WordPiece tokenizer from vocab.txt. Padding and truncation settings cleared."""
  from tokenizers import Tokenizer
  if os.path.isdir(path):
    for name in ("tokenizer.json", "vocab.txt"):
      if os.path.isfile(os.path.join(path, name)):
        path = os.path.join(path, name)
        break
  if path.endswith(".json"):
    tok = Tokenizer.from_file(path)
  elif path.endswith(".txt"):
    from tokenizers import BertWordPieceTokenizer
    tok = BertWordPieceTokenizer(path, lowercase=bool(lowercase))._tokenizer
  else:
    raise ValueError(f"no tokenizer.json or vocab.txt at {path}")
  tok.no_padding()
  tok.no_truncation()
  return tok


# ---- readers ----------------------------------------------------------------------------
#
# Every reader takes a `badinput.BadData` (`data.bad_data`; default: data.bad_data's default,
# "skip", so a direct call reads the rows launch.finetune does) and reports each bad item with its file and line: undecodable bytes (non_utf8), a
# line longer than data.max_document_bytes (too_long), a JSONL line that does not parse or
# lacks a field (bad_json), a row without text (empty), and anything else malformed: a
# ragged CSV/TSV row, a CoNLL line with the wrong number of columns, a SQuAD record with a
# missing field or an answer not at its answer_start (corrupt_record). Under "skip" the
# bad row (a whole CoNLL sentence) is dropped and counted. Each row keeps its origin as
# `row.where` ("file:line"), so later checks (labels) can name it. A file with no usable
# rows is an error.

class Row(dict):
  """A table row {"text", "pair"?, "label"}; `where` names its file and line."""
  where = ""


class Sentence(tuple):
  """(words, tags) of a CoNLL sentence; `where` names its file and first line."""
  where = ""


def _located(obj, where: str):
  obj.where = where
  return obj


def _default() -> badinput.BadData:
  return badinput.BadData()  # data.bad_data's default ("skip"), as launch.finetune reads


def _open_bytes(path: str) -> bytes:
  if path.endswith(".bz2"):
    import bz2
    with bz2.open(path, "rb") as f:
      return f.read()
  if path.endswith(".gz"):
    import gzip
    with gzip.open(path, "rb") as f:
      return f.read()
  with open(path, "rb") as f:
    return f.read()


def _lines(path: str, bad: badinput.BadData):
  """(line number, text) of each line of a local (.gz / .bz2) file, line ends kept; a
  line that is not UTF-8 or is over data.max_document_bytes is reported (and left out)."""
  for n, raw in enumerate(_open_bytes(path).splitlines(keepends=True), 1):
    if n == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
      raw = raw[3:]
    if len(raw) > bad.max_document_bytes:
      bad.report("too_long", f"{path}:{n}", f"{len(raw)} bytes > data.max_document_bytes="
                 f"{bad.max_document_bytes}")
      continue
    try:
      yield n, raw.decode("utf-8")
    except UnicodeDecodeError as e:
      bad.report("non_utf8", f"{path}:{n}", f"byte {e.start} of the line: {e.reason}")


def _need_rows(rows: Sequence, what: str, bad: badinput.BadData, before: Dict[str, int]):
  if rows:
    return
  skipped = {k: v - before.get(k, 0) for k, v in bad.counts.items() if v > before.get(k, 0)}
  raise DataError(f"{what}: no usable rows" + (
      f" ({', '.join(f'{v} {k}' for k, v in skipped.items())} skipped: data.bad_data="
      f"'skip')" if skipped else " (the input is empty)"))


def read_table(path: str, text: str = "text", pair: str = "", label: str = "label",
               bad: Optional[badinput.BadData] = None) -> List[Row]:
  """Rows {"text", "pair"?, "label"} of a .csv / .tsv / .jsonl file (optionally .gz /
  .bz2); labels as written (`class_labels` / `regression_labels` check them)."""
  bad = bad or _default()
  before = dict(bad.counts)
  ext = os.path.splitext(path.removesuffix(".bz2").removesuffix(".gz"))[1].lower()
  if ext not in (".jsonl", ".json", ".csv", ".tsv"):
    raise DataError(f"{path}: unknown table format {ext!r}; use .csv, .tsv or .jsonl")
  cols = (text, label) + ((pair,) if pair else ())
  rows = []
  if ext in (".jsonl", ".json"):
    for n, line in _lines(path, bad):
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
    rows = _read_delimited(path, "\t" if ext == ".tsv" else ",", cols, bad)
  rows = [r for r in rows if r is not None]
  _need_rows(rows, path, bad, before)
  return rows


def _table_row(text, label, pair, where, bad) -> Optional[Row]:
  text = text if isinstance(text, str) else str(text)
  if not text.strip():
    bad.report("empty", where, "no text")
    return None
  row = Row(text=text, label=label)
  if pair is not None:
    row["pair"] = pair if isinstance(pair, str) else str(pair)
  return _located(row, where)


def _read_delimited(path: str, delimiter: str, cols: Tuple[str, ...],
                    bad: badinput.BadData) -> List[Optional[Row]]:
  consumed = []  # the file line numbers csv has read so far

  def feed():
    for n, line in _lines(path, bad):
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


def read_conll(path: str, bad: Optional[badinput.BadData] = None) -> List[Sentence]:
  """(words, tags) per sentence. Every token line has the same number of columns (at
  least 2: the token first, the tag last) as the file's first; a sentence with a line
  that does not is bad (corrupt_record) as a whole."""
  bad = bad or _default()
  before = dict(bad.counts)
  out, words, tags, first, width, broken = [], [], [], 0, None, False

  def close():
    if words and not broken:
      out.append(_located(Sentence((words, tags)), f"{path}:{first}"))

  for n, line in _lines(path, bad):
    parts = line.split()
    if not parts:
      close()
      words, tags, broken = [], [], False
      continue
    if parts[0] == "-DOCSTART-":
      continue
    if not words and not broken:
      first = n
    if broken:
      continue
    if len(parts) < 2 or (width is not None and len(parts) != width):
      want = f"{width} columns" if width is not None and len(parts) >= 2 else \
          "'token ... tag'"
      bad.report("corrupt_record", f"{path}:{n}", f"expected {want}, got {line.strip()!r}")
      broken = True
      continue
    width = width or len(parts)
    words.append(parts[0])
    tags.append(parts[-1])
  close()
  _need_rows(out, path, bad, before)
  return out


def read_squad(path: str, bad: Optional[badinput.BadData] = None) -> List[Row]:
  """Examples {"id", "question", "context", "answers": [{"text", "answer_start"}]}; a
  question with a missing field or an answer not at its answer_start is bad (named by
  its place in the file, data[i].paragraphs[j].qas[k], and its id)."""
  bad = bad or _default()
  before = dict(bad.counts)
  raw = _open_bytes(path)
  try:
    data = json.loads(raw.decode("utf-8"))
  except UnicodeDecodeError as e:
    raise DataError(f"{path}: not UTF-8 at byte {e.start} ({e.reason})") from None
  except json.JSONDecodeError as e:
    raise DataError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
  if not isinstance(data, dict) or not isinstance(data.get("data"), list):
    raise DataError(f"{path}: not SQuAD JSON (no top-level 'data' list)")
  out = []
  for i, article in enumerate(data["data"]):
    paras = article.get("paragraphs") if isinstance(article, dict) else None
    if not isinstance(paras, list):
      bad.report("corrupt_record", f"{path}: data[{i}]", "no 'paragraphs' list")
      continue
    for j, para in enumerate(paras):
      here = f"{path}: data[{i}].paragraphs[{j}]"
      if not isinstance(para, dict) or not isinstance(para.get("context"), str) or \
          not isinstance(para.get("qas"), list):
        bad.report("corrupt_record", here, "needs a 'context' string and a 'qas' list")
        continue
      ctx = para["context"]
      for k, qa in enumerate(para["qas"]):
        ex = _squad_question(qa, ctx, f"{here}.qas[{k}]", bad)
        if ex is not None:
          out.append(ex)
  _need_rows(out, path, bad, before)
  return out


def _squad_question(qa, ctx: str, where: str, bad) -> Optional[Row]:
  if not isinstance(qa, dict) or "id" not in qa or not isinstance(qa.get("question"), str):
    bad.report("corrupt_record", where, "a question needs an 'id' and a 'question'")
    return None
  where = f"{where} (id {qa['id']!r})"
  answers = [] if qa.get("is_impossible") else qa.get("answers", [])
  if not isinstance(answers, list):
    bad.report("corrupt_record", where, "'answers' is not a list")
    return None
  for a in answers:
    if not isinstance(a, dict) or not isinstance(a.get("text"), str) or \
        not isinstance(a.get("answer_start"), int) or isinstance(a["answer_start"], bool):
      bad.report("corrupt_record", where, f"an answer needs a 'text' and an integer "
                 f"'answer_start', got {a!r}")
      return None
    s = a["answer_start"]
    if s < 0 or ctx[s:s + len(a["text"])] != a["text"]:
      bad.report("corrupt_record", where, f"answer {a['text']!r} is not at answer_start {s}")
      return None
  return _located(Row(id=str(qa["id"]), question=qa["question"], context=ctx,
                      answers=list(answers)), where)


def read_tfds(name: str, split: str, data_dir: str = "", text: str = "sentence",
              pair: str = "", label: str = "label",
              bad: Optional[badinput.BadData] = None) -> List[Row]:
  """Rows of a TFDS dataset (data_dir may be gs://). With TensorFlow installed, any
  prepared format (tfds.load); without it, datasets prepared as array_record
  (tfds.data_source, which needs no TensorFlow). Text that is not UTF-8 is bad
  (non_utf8), an empty text too (empty), named by the example's index in the split."""
  import importlib.util
  import tensorflow_datasets as tfds
  bad = bad or _default()
  before = dict(bad.counts)
  where = f"TFDS {name} split {split!r}"
  try:
    n = tfds.builder(name, data_dir=data_dir or None).info.splits[split].num_examples
  except Exception:  # pylint: disable=broad-except  (the reads below name the problem)
    n = None
  if n == 0:  # array_record's reader fails on no files with a message naming nothing
    _need_rows([], where, bad, before)
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
  _need_rows(rows, where, bad, before)
  return rows


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


# ---- labels -----------------------------------------------------------------------------
#
# Class names are canonical strings: a number is one class however it is written (1, "1",
# 1.0, "1.0", " 1 " are all "1"; 0.5 and "0.50" are "0.5"), text is stripped. The label set
# is `finetune.labels` when given, else the distinct training labels: numbers in numeric
# order (0, 1, 2, ..., 10), then text in string order. An eval label outside the set is an
# error naming its file and line, or (finetune.unknown_eval_labels="skip") its row is
# skipped and counted.

_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
UNKNOWN_EVAL_LABELS = ("error", "skip")


def _number_name(d: decimal.Decimal) -> str:
  if d == d.to_integral_value():
    return str(int(d))
  return format(d.normalize(), "f")


def canonical_label(value) -> Optional[str]:
  """The class name of a label value (see above), or None for one that cannot name a
  class: missing, empty, NaN/inf, a list or object, text over several lines."""
  if isinstance(value, (bool, np.bool_)):
    return "true" if value else "false"
  if isinstance(value, (int, np.integer)):
    return str(int(value))
  if isinstance(value, (float, np.floating)):
    v = float(value)
    return _number_name(decimal.Decimal(repr(v))) if math.isfinite(v) else None
  if isinstance(value, bytes):
    try:
      value = value.decode("utf-8")
    except UnicodeDecodeError:
      return None
  if not isinstance(value, str):
    return None
  s = value.strip()
  if not s or "\n" in s or "\r" in s:
    return None
  return _number_name(decimal.Decimal(s)) if _NUMBER.fullmatch(s) else s


def _label_key(name: str):
  if _NUMBER.fullmatch(name):
    return (0, decimal.Decimal(name), "")
  return (1, 0, name)


def label_names(values: Sequence, given: Sequence = ()) -> Tuple[str, ...]:
  """The label vocabulary: `given` (canonical names, in the order given), else the
  distinct canonical values, numbers in numeric order before text in string order."""
  if given:
    names = [canonical_label(v) for v in given]
    bad = [g for g, n in zip(given, names) if n is None]
    if bad:
      raise ValueError(f"finetune.labels: {bad[0]!r} is not a label name")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
      raise ValueError(f"finetune.labels {list(given)} name {dup[0]!r} more than once "
                       "(1, '1' and 1.0 are one label)")
    return tuple(names)
  names = {canonical_label(v) for v in values}
  names.discard(None)
  return tuple(sorted(names, key=_label_key))


def _clean_labels(rows, what: str, bad: badinput.BadData, before=None):
  """Rows whose label names a class (canonical label set on the row); others reported."""
  before = dict(bad.counts) if before is None else before
  out = []
  for r in rows:
    name = canonical_label(r["label"])
    if name is None:
      bad.report("corrupt_record", getattr(r, "where", "") or what,
                 f"label {r['label']!r} is not a class name")
      continue
    r["label"] = name
    out.append(r)
  _need_rows(out, what, bad, before)
  return out


def _check_known(rows, labels_of, labels: Sequence[str], source: str, what: str,
                 unknown: str, skipped: Dict[str, int]):
  """Rows whose labels (labels_of(row)) are all in `labels`; an unknown one raises, or
  with unknown == "skip" its row is dropped and counted in `skipped` by label."""
  known, out = set(labels), []
  for r in rows:
    new = [x for x in labels_of(r) if x not in known]
    if not new:
      out.append(r)
      continue
    where = getattr(r, "where", "") or what
    if unknown != "skip":
      fix = ("add it to finetune.labels" if what == "training" else
             "name every class in finetune.labels, or set finetune.unknown_eval_labels="
             "'skip' to skip and count such eval rows")
      among = source if source == "finetune.labels" else f"the {source} labels"
      raise DataError(f"{where}: {what} label {new[0]!r} is not among {among} "
                       f"{list(labels)[:20]} ({fix})")
    for x in sorted(set(new)):
      skipped[x] = skipped.get(x, 0) + 1
  return out


def class_labels(train, evals, given=(), bad: Optional[badinput.BadData] = None,
                 unknown: str = "error", skipped: Optional[Dict[str, int]] = None,
                 names: Tuple[str, str] = ("the training rows", "the eval rows")):
  """Sequence classification: -> (labels, train rows, eval rows), every row's label its
  canonical name. A label that names no class is bad input (corrupt_record); a training
  label outside `given` is an error; an eval label outside the set per `unknown`
  (skipped ones counted by label in `skipped`). `names`: the two sources, for messages."""
  bad = bad or _default()
  skipped = {} if skipped is None else skipped
  train = _clean_labels(train, names[0], bad)
  evals = _clean_labels(evals, names[1], bad)
  labels = label_names([r["label"] for r in train], given)
  if given:
    _check_known(train, lambda r: [r["label"]], labels, "finetune.labels", "training",
                 "error", skipped)
  elif len(labels) < 2:
    raise DataError(f"{names[0]}: {len(labels)} distinct label(s) {list(labels)}; "
                     "classification needs 2 or more (or name them in finetune.labels)")
  evals = _check_known(evals, lambda r: [r["label"]], labels,
                       "finetune.labels" if given else "training", "eval", unknown, skipped)
  _need_known(evals, names[1], skipped)
  return labels, train, evals


def _need_known(evals, what: str, skipped: Dict[str, int]):
  if not evals:
    raise DataError(f"{what}: no rows left after skipping {sum(skipped.values())} with "
                     f"labels outside the label set ({sorted(skipped)[:5]}...)")


def regression_labels(rows, what: str):
  """Regression: every label a finite number (set on the row as a float); anything else
  is an error naming the row's file and line."""
  for r in rows:
    v = r["label"]
    ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(
        v, (bool, np.bool_))
    if not ok and isinstance(v, str) and _NUMBER.fullmatch(v.strip()):
      v, ok = float(v), True
    if not ok or not math.isfinite(float(v)):
      raise DataError(f"{getattr(r, 'where', '') or what}: regression label {r['label']!r}"
                       " is not a finite number")
    r["label"] = float(v)
  return rows


def tag_names(given: Sequence) -> Tuple[str, ...]:
  """`finetune.labels` as tag names (stripped); empty or repeated ones are an error."""
  labels = tuple(str(g).strip() for g in given)
  if len(set(labels)) != len(labels) or not all(labels):
    raise ValueError(f"finetune.labels {list(given)}: empty or repeated tag names")
  return labels


def tag_labels(train, evals, given=(), unknown: str = "error",
               skipped: Optional[Dict[str, int]] = None,
               names: Tuple[str, str] = ("the training sentences", "the eval sentences")):
  """Token classification: -> (tags, train sentences, eval sentences). The tag set is
  `given`, else the training tags (string order); a training tag outside `given` is an
  error; an eval tag outside the set per `unknown` (the whole sentence skipped)."""
  skipped = {} if skipped is None else skipped
  if given:
    labels = tag_names(given)
    _check_known(train, lambda s: s[1], labels, "finetune.labels", "training", "error",
                 skipped)
  else:
    labels = tuple(sorted({t for _, tags in train for t in tags}))
  evals = _check_known(evals, lambda s: s[1], labels,
                       "finetune.labels" if given else "training", "eval", unknown, skipped)
  _need_known(evals, names[1], skipped)
  return labels, train, evals


# ---- encoders -----------------------------------------------------------------------------

def _pad(seqs: Sequence[Sequence[int]], seq_len: int, value: int) -> np.ndarray:
  out = np.full((len(seqs), seq_len), value, np.int32)
  for i, s in enumerate(seqs):
    out[i, :len(s)] = s[:seq_len]
  return out


def encode_sequence(tok, rows: Sequence[Dict], seq_len: int, pad_id: int,
                    labels: Sequence[str] = (), regression: bool = False) -> Dict:
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
  return {"input_ids": _pad([e.ids for e in encs], seq_len, pad_id),
          "attention_mask": _pad([e.attention_mask for e in encs], seq_len, 0),
          "token_type_ids": _pad([e.type_ids for e in encs], seq_len, 0),
          "labels": y, "example_weight": np.ones(len(rows), np.float32)}


def encode_tokens(tok, sentences: Sequence[Tuple[List[str], List[str]]], seq_len: int,
                  pad_id: int, labels: Sequence[str]) -> Tuple[Dict, List[List[int]]]:
  """-> (arrays, per sentence the row position of each word's first sub-token, -1 for
  words cut off by the length limit)."""
  index = {name: i for i, name in enumerate(labels)}
  tok.enable_truncation(max_length=seq_len)
  encs = tok.encode_batch([list(w) for w, _ in sentences], is_pretokenized=True)
  tok.no_truncation()
  y = np.full((len(sentences), seq_len), IGNORE, np.int32)
  firsts = []
  for i, (enc, (words, tags)) in enumerate(zip(encs, sentences)):
    first = [-1] * len(words)
    for pos, w in enumerate(enc.word_ids):
      if w is not None and first[w] < 0:
        first[w] = pos
        if tags[w] not in index:
          raise ValueError(f"tag {tags[w]!r} is not among the labels {list(labels)}")
        y[i, pos] = index[tags[w]]
    firsts.append(first)
  arrays = {"input_ids": _pad([e.ids for e in encs], seq_len, pad_id),
            "attention_mask": _pad([e.attention_mask for e in encs], seq_len, 0),
            "token_type_ids": _pad([e.type_ids for e in encs], seq_len, 0),
            "labels": y, "example_weight": np.ones(len(sentences), np.float32)}
  return arrays, firsts


def encode_qa(tok, examples: Sequence[Dict], seq_len: int, pad_id: int, stride: int = 128
              ) -> Tuple[Dict, List[Dict]]:
  """-> (arrays, one meta dict per window: example index, token char offsets, and which
  positions are context)."""
  if stride >= seq_len // 2:
    raise ValueError(f"stride {stride} must be below half of seq_len {seq_len}")
  tok.enable_truncation(max_length=seq_len, stride=stride, strategy="only_second")
  rows, meta = {"input_ids": [], "attention_mask": [], "token_type_ids": [],
                "start_positions": [], "end_positions": []}, []
  for ei, ex in enumerate(examples):
    enc = tok.encode(ex["question"], ex["context"])
    for w in [enc] + list(enc.overflowing):
      seq = w.sequence_ids
      ctx = [j for j, s in enumerate(seq) if s == 1]
      start = end = 0
      if ex["answers"] and ctx:
        a = ex["answers"][0]
        s_char, e_char = a["answer_start"], a["answer_start"] + len(a["text"])
        lo, hi = w.offsets[ctx[0]][0], w.offsets[ctx[-1]][1]
        if lo <= s_char and e_char <= hi:
          start = next(j for j in ctx if w.offsets[j][1] > s_char)
          end = max(j for j in ctx if w.offsets[j][0] < e_char)
      for k, v in (("input_ids", w.ids), ("attention_mask", w.attention_mask),
                   ("token_type_ids", w.type_ids)):
        rows[k].append(v)
      rows["start_positions"].append(start)
      rows["end_positions"].append(end)
      meta.append({"example": ei, "offsets": list(w.offsets),
                   "context": [s == 1 for s in seq]})
  tok.no_truncation()
  arrays = {k: _pad(rows[k], seq_len, pad_id if k == "input_ids" else 0)
            for k in ("input_ids", "attention_mask", "token_type_ids")}
  arrays["start_positions"] = np.asarray(rows["start_positions"], np.int32)
  arrays["end_positions"] = np.asarray(rows["end_positions"], np.int32)
  arrays["example_weight"] = np.ones(len(meta), np.float32)
  return arrays, meta


def best_spans(start_logits, end_logits, meta: Dict, context: str, n_best: int = 20,
               max_answer_length: int = 30) -> Tuple[List[Dict], float]:
  """The n-best answer spans of one window (text, char start/end, score = start + end
  logit), best first, and its no-answer score (start + end logit at position 0)."""
  ctx = np.asarray(meta["context"] + [False] * (len(start_logits) - len(meta["context"])))
  s_idx = np.argsort(start_logits)[::-1][:n_best]
  e_idx = np.argsort(end_logits)[::-1][:n_best]
  spans = []
  for s in s_idx:
    for e in e_idx:
      if not (ctx[s] and ctx[e]) or e < s or e - s + 1 > max_answer_length:
        continue
      a, b = meta["offsets"][s][0], meta["offsets"][e][1]
      spans.append({"text": context[a:b], "start": int(a), "end": int(b),
                    "score": float(start_logits[s] + end_logits[e])})
  spans.sort(key=lambda x: -x["score"])
  return spans[:n_best], float(start_logits[0] + end_logits[0])


def config_errors(config) -> List[str]:
  """The fine-tuning settings that can be checked before any data is read: one message
  per bad key (its value and the fix)."""
  f, errs = config.finetune, []
  init_from = str(config.get("init_from", "") or "")
  if not init_from:
    errs.append("fine-tuning needs --config.init_from=DIR (an HF directory)")
  elif "://" not in init_from and not os.path.isdir(init_from):
    errs.append(f"init_from={init_from!r} is not a directory (an HF directory is needed)")
  task, fmt = f.get("task"), f.get("data_format")
  if task not in FORMATS:
    errs.append(f"finetune.task={task!r}; expected one of {tuple(FORMATS)}")
  elif fmt not in FORMATS[task]:
    errs.append(f"finetune.data_format={fmt!r} does not fit task {task!r}; expected one of "
                f"{FORMATS[task]}")
  regression = bool(f.get("regression", False))
  if regression and task != "sequence":
    errs.append(f"finetune.regression=True needs task 'sequence', not {task!r}")
  has_eval = bool(f.get("tfds_eval_split", "")) if fmt == "tfds" else bool(f.eval_file)
  if fmt == "tfds":
    if not f.get("tfds_name", ""):
      errs.append("finetune.data_format='tfds' needs finetune.tfds_name (e.g. glue/sst2)")
  else:
    for key in ("train_file", "eval_file"):
      path = str(f.get(key, "") or "")
      if key == "train_file" and not path:
        errs.append("finetune.train_file is empty: name the training file")
      elif path and "://" not in path and not os.path.isfile(path):
        errs.append(f"finetune.{key}={path!r} does not exist")
  if not has_eval:
    try:
      frac = float(f.eval_fraction)
    except (TypeError, ValueError):
      frac = math.nan
    if not 0 < frac < 1:
      errs.append(f"finetune.eval_fraction={f.eval_fraction!r} must be in (0, 1) (or give "
                  "finetune.eval_file)")
  if not isinstance(f.epochs, int) or f.epochs < 1:
    errs.append(f"finetune.epochs={f.epochs!r} must be an integer >= 1")
  if not isinstance(f.max_train_rows, int) or not (f.max_train_rows == -1
                                                   or f.max_train_rows >= 1):
    errs.append(f"finetune.max_train_rows={f.max_train_rows!r} must be -1 (all) or >= 1")
  if str(f.get("unknown_eval_labels", "error")) not in UNKNOWN_EVAL_LABELS:
    errs.append(f"finetune.unknown_eval_labels={f.get('unknown_eval_labels')!r}; expected "
                f"one of {UNKNOWN_EVAL_LABELS}")
  given = tuple(f.get("labels", ()) or ())
  if given and (task == "qa" or regression):
    errs.append(f"finetune.labels={list(given)} is for classification; the "
                f"{'regression' if regression else 'qa'} task has none")
  elif given:
    try:
      if task == "token":
        tag_names(given)
      else:
        label_names((), given)
      if len(given) < 2:
        errs.append(f"finetune.labels={list(given)}: a classifier needs 2 or more labels")
    except ValueError as e:
      errs.append(str(e))
  if fmt in ("table", "tfds"):
    for key in ("text_column", "label_column"):
      if not str(f.get(key, "") or ""):
        errs.append(f"finetune.{key} is empty: name the column")
  if f.get("packing", False) and task not in ("sequence", "token"):
    errs.append(f"finetune.packing=True supports the sequence and token tasks, not {task!r}")
  seq_len, gb = config.data.seq_len, config.data.global_batch
  if not isinstance(seq_len, int) or seq_len < 4:
    errs.append(f"data.seq_len={seq_len!r} must be an integer >= 4")
  else:
    try:
      length_buckets(f.get("length_buckets", "auto"), seq_len)
    except ValueError as e:
      errs.append(str(e))
    if task == "qa" and not 0 <= int(f.stride) < seq_len // 2:
      errs.append(f"finetune.stride={f.stride} must be in [0, data.seq_len // 2 = "
                  f"{seq_len // 2})")
  if not isinstance(gb, int) or gb < 1:
    errs.append(f"data.global_batch={gb!r} must be an integer >= 1")
  if task == "qa":
    for key in ("n_best", "max_answer_length"):
      if int(f.get(key)) < 1:
        errs.append(f"finetune.{key}={f.get(key)!r} must be >= 1")
  return errs


def load_data(config, tok, bad=None, report=None):
  """-> (train arrays, eval arrays, eval info for scoring, labels). Bad rows follow
  `bad` (a badinput.BadData: data.bad_data); `report` (a dict) receives what was skipped:
  per kind of bad input, and eval rows whose label is outside the label set."""
  f, m = config.finetune, config.model
  seq_len, pad = int(config.data.seq_len), int(m.pad_token_id)
  bad = bad if bad is not None else badinput.BadData.from_config(config.data)
  report = {} if report is None else report
  unknown = str(f.get("unknown_eval_labels", "error"))
  if f.task == "sequence":
    if f.data_format == "tfds":
      read = lambda split: read_tfds(f.tfds_name, split, f.tfds_data_dir, f.text_column,
                                        f.text_pair_column, f.label_column, bad=bad)
      train, evals = read(f.tfds_train_split), (read(f.tfds_eval_split)
                                                if f.tfds_eval_split else None)
      names = (f"TFDS {f.tfds_name} split {f.tfds_train_split!r}",
               f"TFDS {f.tfds_name} split {f.tfds_eval_split!r}")
    else:
      read = lambda p: read_table(p, f.text_column, f.text_pair_column, f.label_column,
                                     bad=bad)
      train, evals = read(f.train_file), (read(f.eval_file) if f.eval_file else None)
      names = (f.train_file, f.eval_file)
  elif f.task == "token":
    train = read_conll(f.train_file, bad=bad)
    evals = read_conll(f.eval_file, bad=bad) if f.eval_file else None
    names = (f.train_file, f.eval_file)
  elif f.task == "qa":
    train = read_squad(f.train_file, bad=bad)
    evals = read_squad(f.eval_file, bad=bad) if f.eval_file else None
    names = (f.train_file, f.eval_file)
  else:
    raise ValueError(f"unknown finetune.task {f.task!r}")
  if evals is None:
    if len(train) < 2:
      raise DataError(f"{names[0]}: {len(train)} usable row; holding out eval rows needs "
                         "2 or more (or give finetune.eval_file)")
    tr, ev = holdout(len(train), float(f.eval_fraction), int(f.split_seed))
    train, evals = [train[i] for i in tr], [train[i] for i in ev]
    names = (f"{names[0]} (training part)", f"{names[0]} (held-out part)")
  if int(f.max_train_rows) > 0:
    train = train[:int(f.max_train_rows)]
  if f.task == "sequence" and f.regression and len(evals) < 2:
    raise DataError(f"{names[1]}: {len(evals)} eval row; regression's correlations need 2 "
                     "or more")
  # The label set: finetune.labels, else the training rows' labels (never the eval's).
  skipped, labels = {}, ()
  if f.task == "sequence" and f.regression:
    train, evals = regression_labels(train, names[0]), regression_labels(evals, names[1])
  elif f.task == "sequence":
    labels, train, evals = class_labels(train, evals, tuple(f.labels), bad, unknown,
                                           skipped, names)
  elif f.task == "token":
    labels, train, evals = tag_labels(train, evals, tuple(f.labels), unknown, skipped,
                                         names)
  report["bad_data"] = {k: v for k, v in bad.counts.items() if v}
  report["skipped_bad_rows"] = bad.total
  report["skipped_eval_rows"] = sum(skipped.values())
  report["unknown_eval_labels"] = dict(sorted(skipped.items()))
  if bad.total or skipped:
    log.warning("fine-tuning data: skipped %d bad row(s) %s and %d eval row(s) with labels "
                "outside the label set %s", bad.total, report["bad_data"],
                report["skipped_eval_rows"], report["unknown_eval_labels"])
  if f.task == "sequence":
    enc = lambda rows: encode_sequence(tok, rows, seq_len, pad, labels, f.regression)
    return enc(train), enc(evals), {"rows": evals}, labels
  if f.task == "token":
    tr_arr, _ = encode_tokens(tok, train, seq_len, pad, labels)
    ev_arr, firsts = encode_tokens(tok, evals, seq_len, pad, labels)
    return tr_arr, ev_arr, {"rows": evals, "firsts": firsts}, labels
  tr_arr, _ = encode_qa(tok, train, seq_len, pad, int(f.stride))
  ev_arr, meta = encode_qa(tok, evals, seq_len, pad, int(f.stride))
  return tr_arr, ev_arr, {"rows": evals, "meta": meta}, labels


def score(config, outputs, info, labels):
  """(metrics, prediction records) from the eval rows' model outputs (numpy)."""
  f = config.finetune
  rows = info["rows"]
  if f.task == "sequence" and f.regression:
    pred = outputs["logits"][:, 0]
    gold = np.asarray([float(r["label"]) for r in rows])
    return tm.regression(gold, pred), [{"label": float(g), "prediction": float(p)}
                                       for g, p in zip(gold, pred)]
  if f.task == "sequence":
    index = {n: i for i, n in enumerate(labels)}
    gold = np.asarray([index[str(r["label"])] for r in rows])
    pred = outputs["logits"].argmax(-1)
    metrics = tm.classification(gold, pred, len(labels))
    metrics["confusion"] = tm.confusion_matrix(gold, pred, len(labels)).tolist()
    return metrics, [{"text": r["text"][:200], "label": str(r["label"]),
                      "prediction": labels[p]} for r, p in zip(rows, pred)]
  if f.task == "token":
    pred_ids = outputs["logits"].argmax(-1)
    golds, preds = [], []
    for i, ((words, tags), first) in enumerate(zip(rows, info["firsts"])):
      golds.append(list(tags))
      preds.append([labels[pred_ids[i, p]] if p >= 0 else "O" for p in first])
    return tm.entity_f1(golds, preds), [{"words": w, "tags": g, "prediction": p}
                                        for (w, _), g, p in zip(rows, golds, preds)]
  best = {}
  for w, meta in enumerate(info["meta"]):
    ex = rows[meta["example"]]
    spans, null = best_spans(outputs["start_logits"][w], outputs["end_logits"][w], meta,
                                ex["context"], int(f.n_best), int(f.max_answer_length))
    cur = best.setdefault(meta["example"], {"span": None, "null": math.inf})
    cur["null"] = min(cur["null"], null)
    if spans and (cur["span"] is None or spans[0]["score"] > cur["span"]["score"]):
      cur["span"] = spans[0]
  preds = []
  for i, ex in enumerate(rows):
    b = best.get(i, {"span": None, "null": math.inf})
    text = b["span"]["text"] if b["span"] else ""
    if f.version_2 and (b["span"] is None or b["null"] - b["span"]["score"] > f.null_threshold):
      text = ""
    preds.append(text)
  metrics = tm.squad([[a["text"] for a in ex["answers"]] for ex in rows], preds)
  return metrics, [{"id": ex["id"], "prediction": p, "answers": [a["text"] for a in
                                                                 ex["answers"]]}
                   for ex, p in zip(rows, preds)]


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


def trim_to_bucket(batch: Dict[str, np.ndarray], buckets: Sequence[int]) -> Dict:
  """The batch's (rows, seq_len) arrays cut to the smallest bucket that holds every
  column any row attends to, so only padding columns (attention_mask 0 in every row)
  go."""
  mask = batch["attention_mask"]
  seq_len = mask.shape[1]
  longest = int(mask.any(0).nonzero()[0].max()) + 1 if mask.any() else 1
  width = next(w for w in buckets if w >= longest)
  if width >= seq_len:
    return batch
  return {k: (v[:, :width] if v.ndim == 2 and v.shape[1] == seq_len else v)
          for k, v in batch.items()}


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


def pack_rows(batch: Dict[str, np.ndarray], task: str, rows: Sequence[int],
              pad_id: int = 0, seen: Optional[set] = None) -> Dict[str, np.ndarray]:
  """One batch of examples (rows padded on the right, `example_weight` 0 on filler rows)
  -> the same examples packed several to a row of the batch's width, first-fit by
  decreasing length (`finetune.packing`).

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
  if task not in ("sequence", "token"):
    raise ValueError(f"packing supports the sequence and token tasks, not {task!r}")
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
  regression = task == "sequence" and np.issubdtype(batch["labels"].dtype, np.floating)
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
    if task == "sequence":
      out["labels"][r, start] = batch["labels"][i]
      out["label_weight"][r, start] = 1.0
    else:
      out["labels"][r, cols] = batch["labels"][i, :n]
      out["label_weight"][r, cols] = (batch["labels"][i, :n] != IGNORE)
  return out


def batches(arrays: Dict[str, np.ndarray], batch_size: int, seed: Optional[int] = None,
            buckets: Optional[Sequence[int]] = None, pack: Optional[Dict] = None,
            start: int = 0):
  """Batches of `batch_size` rows (shuffled by `seed` when given); the last is padded
  with copies of row 0 at example_weight 0, so every batch has `batch_size` rows. With
  `buckets` (length_buckets), each batch's sequence arrays are cut to the smallest
  width that holds its longest row: a few shapes (one compiled step each) instead of
  computing every row at full seq_len. With `pack` (pack_rows' task, rows, pad_id,
  seen), each batch's `batch_size` examples are packed into rows of the arrays' width
  instead (no cut: the rows are full, their count adapts). `start`: the batches from
  that index on (a resumed epoch: the same order, the first `start` batches not built;
  pack's `seen` must then be the one saved with the position)."""
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
      yield trim_to_bucket(b, buckets) if buckets else b
