"""What the tasks' readers share: located rows, decoded lines, canonical labels, padding.

Every reader takes `bad`, the run's bad-data policy (launch.data.badinput.BadData:
`data.bad_data`), and reports each bad item with its file and line: bytes that do not
decode in `finetune.encoding` (non_utf8), a line longer than data.max_document_bytes
(too_long), a JSONL line that does not parse or lacks a field (bad_json), a row without
text (empty), and anything else malformed (corrupt_record). Under "skip" the bad row is
dropped and counted. Each row keeps its origin as `row.where` ("file:line"), so later
checks (labels) can name it. A file with no usable rows is an error.

Class names are canonical strings: a number is one class however it is written (1, "1",
1.0, "1.0", " 1 " are all "1"; 0.5 and "0.50" are "0.5"), text is stripped. The label set
is `finetune.labels` when given, else the distinct training labels: numbers in numeric
order (0, 1, 2, ..., 10), then text in string order. An eval label outside the set is an
error naming its file and line, or (finetune.unknown_eval_labels="skip") its row is
skipped and counted.
"""
import bz2
import codecs
import decimal
import gzip
import math
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

IGNORE = -100  # a label position that is not scored
UNKNOWN_EVAL_LABELS = ("error", "skip")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_UNDECODABLE = "\udc80"  # what `_mark_undecodable` leaves; strict decoding never makes it
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")  # bytes.splitlines' line ends


class InputDataError(ValueError):
  """The input data cannot train this run (named: the file, the setting, the count). The
  entry points print it as one line (exit 1) instead of a traceback."""


DataError = InputDataError


class Row(dict):
  """A table row {"text", "pair"?, "label"} (or a QA example); `where` names its origin."""
  where = ""


class Sentence(tuple):
  """(words, tags) of a CoNLL sentence; `where` names its file and first line."""
  where = ""


def located(obj, where: str):
  obj.where = where
  return obj


def check_encoding(encoding: str) -> Optional[str]:
  """None, or why `encoding` cannot read text files."""
  try:
    info = codecs.lookup(encoding)
  except (LookupError, TypeError):
    return f"finetune.encoding={encoding!r} is not a text encoding Python knows"
  if not getattr(info, "_is_text_encoding", True):
    return f"finetune.encoding={encoding!r} is not a text encoding"
  return None


def open_bytes(path: str) -> bytes:
  """The bytes of a local file, decompressed when it ends in .gz or .bz2."""
  opener = bz2.open if path.endswith(".bz2") else gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    return f.read()


def _mark_undecodable(e: UnicodeDecodeError):
  return _UNDECODABLE, e.end


codecs.register_error("encoder_zoo_mark", _mark_undecodable)


def lines(path: str, bad, encoding: str = "utf-8"):
  """(line number, text) of each line of a local (.gz / .bz2) file, line ends kept; a
  line that does not decode in `encoding` or is over data.max_document_bytes is reported
  (and left out)."""
  raw = open_bytes(path)
  if "\r\n,\t".encode(encoding) == b"\r\n,\t":  # ASCII line ends: split, then decode
    for n, line in enumerate(raw.splitlines(keepends=True), 1):
      if n == 1 and line.startswith(codecs.BOM_UTF8) and codecs.lookup(
          encoding).name == "utf-8":
        line = line[3:]
      if len(line) > bad.max_document_bytes:
        bad.report("too_long", f"{path}:{n}", f"{len(line)} bytes > data.max_document_bytes"
                   f"={bad.max_document_bytes}")
        continue
      try:
        yield n, line.decode(encoding)
      except UnicodeDecodeError as e:
        bad.report("non_utf8", f"{path}:{n}", f"byte {e.start} of the line: {e.reason}"
                   + ("" if codecs.lookup(encoding).name == "utf-8" else f" ({encoding})"))
    return
  # UTF-16 / UTF-32: line ends are several bytes, so decode first (marking what fails)
  empty = len("".encode(encoding))  # a byte order mark the codec writes
  text = raw.decode(encoding, errors="encoder_zoo_mark")
  for n, m in enumerate(_LINE.finditer(text), 1):
    line = m.group(0).removeprefix("\ufeff") if n == 1 else m.group(0)
    size = len(line.encode(encoding, errors="surrogatepass")) - empty
    if size > bad.max_document_bytes:
      bad.report("too_long", f"{path}:{n}", f"{size} bytes > data.max_document_bytes="
                 f"{bad.max_document_bytes}")
    elif _UNDECODABLE in line:
      bad.report("non_utf8", f"{path}:{n}", f"bytes that are not {encoding}")
    else:
      yield n, line


def need_rows(rows: Sequence, what: str, bad, before: Dict[str, int]):
  """An InputDataError naming `what` when no row is left, with the kinds skipped since
  `before` (bad.counts when the read began)."""
  if rows:
    return
  skipped = {k: v - before.get(k, 0) for k, v in bad.counts.items() if v > before.get(k, 0)}
  raise DataError(f"{what}: no usable rows" + (
      f" ({', '.join(f'{v} {k}' for k, v in skipped.items())} skipped: data.bad_data="
      f"'skip')" if skipped else " (the input is empty)"))


# ---- labels -----------------------------------------------------------------------------

def _number_name(d: decimal.Decimal) -> str:
  if d == d.to_integral_value():
    return str(int(d))
  return format(d.normalize(), "f")


def is_number(text: str) -> bool:
  return bool(_NUMBER.fullmatch(text))


def canonical_label(value) -> Optional[str]:
  """The class name of a label value (module docstring), or None for one that cannot
  name a class: missing, empty, NaN/inf, a list or object, text over several lines."""
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
  return _number_name(decimal.Decimal(s)) if is_number(s) else s


def _label_key(name: str):
  if is_number(name):
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


def clean_labels(rows, what: str, bad):
  """Rows whose label names a class (canonical label set on the row); others reported."""
  before = dict(bad.counts)
  out = []
  for r in rows:
    name = canonical_label(r["label"])
    if name is None:
      bad.report("corrupt_record", getattr(r, "where", "") or what,
                 f"label {r['label']!r} is not a class name")
      continue
    r["label"] = name
    out.append(r)
  need_rows(out, what, bad, before)
  return out


def check_known(rows, labels_of, labels: Sequence[str], source: str, what: str,
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


def need_known(evals, what: str, skipped: Dict[str, int]):
  if not evals:
    raise DataError(f"{what}: no rows left after skipping {sum(skipped.values())} with "
                    f"labels outside the label set ({sorted(skipped)[:5]}...)")


# ---- arrays -------------------------------------------------------------------------------

def pad(seqs: Sequence[Sequence[int]], seq_len: int, value: int) -> np.ndarray:
  out = np.full((len(seqs), seq_len), value, np.int32)
  for i, s in enumerate(seqs):
    out[i, :len(s)] = s[:seq_len]
  return out


def text_arrays(encodings: List, seq_len: int, pad_id: int) -> Dict[str, np.ndarray]:
  """input_ids / attention_mask / token_type_ids (N, seq_len) of tokenizer encodings,
  padded on the right, and example_weight 1 per row."""
  return {"input_ids": pad([e.ids for e in encodings], seq_len, pad_id),
          "attention_mask": pad([e.attention_mask for e in encodings], seq_len, 0),
          "token_type_ids": pad([e.type_ids for e in encodings], seq_len, 0),
          "example_weight": np.ones(len(encodings), np.float32)}
