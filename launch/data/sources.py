"""Where documents come from (`config.data.source`), and which of them are held out.

- `default`: the embedded corpus of `launch.data.corpus` (Python's own documentation and
  source, available offline). Held out: about `data.eval_fraction` of the documents, whole
  groups at a time (a module's reference page and its source, and all modules of one
  package, stay on one side), then decontaminated: every held-out paragraph that shares a
  13-word span with the training documents is dropped (`launch.data.split`).
- `text`: local (or gs://) files from the comma-separated globs in `data.files`.
  `*.jsonl` / `*.jsonl.gz`: one document per line, its `data.text_key` field. Other files
  (optionally `.gz`): with `data.text_document="blank_line"` (default) documents are
  separated by blank lines, the input format of BERT's create_pretraining_data (one
  sentence per line, a blank line between documents); with `"file"` each file is one
  document. For this source `data.eval_split`, when set, is a glob of evaluation files.
- `tfds`: `tfds.data_source(data.tfds_name, split=..., data_dir=data.tfds_data_dir)`,
  which reads ArrayRecord files without TensorFlow (never downloads); text field
  `data.text_key`.

- `arrayrecord`: pretokenized rows in the shards `launch.preprocess` wrote to `data.path`
  (`launch.data.arrayrecord`; nothing is read here).

For `text` and `tfds`, the evaluation documents are the named `data.eval_split`,
otherwise a fixed fraction (`data.eval_fraction`) of the documents chosen by a fixed seed
(independent of `shuffle_seed`, so runs with different seeds share one held-out set).
Either way a held-out document that is also a training document is dropped, and a named
split that is (part of) the training data is an error (`check_eval_split`).

Bad input (`data.bad_data`, `data.max_document_bytes`, `data.min_printable_ratio`; see
`launch.data.badinput`) is skipped and counted, or stops the run naming the file and the
byte offset (text) or record (TFDS): undecodable bytes, binary files or records, over-long
documents, empty files and records, broken JSON lines, corrupt `.gz` files and unreadable
TFDS records. Input without one good training document is an error naming the files.
"""
from __future__ import annotations

import glob as globlib
import logging
import os
import re
from collections.abc import Iterator

from etils import epath

from launch.data import badinput
from launch.data import corpus
from launch.data import split

DOCUMENT_SOURCES = ("default", "text", "tfds")  # read as documents (and by launch.preprocess)
SOURCES = (*DOCUMENT_SOURCES, "arrayrecord")
TEXT_DOCUMENT_MODES = ("blank_line", "file")
EVAL_MAX_DOCUMENTS = 20_000  # read at most this many documents of a named eval split
TFDS_READ_BATCH = 1024
log = logging.getLogger(__name__)


def expand_globs(spec: str, what: str = "data.files") -> list[str]:
  """Sorted, de-duplicated files matching comma-separated globs; each glob must match."""
  patterns = [p.strip() for p in (spec or "").split(",") if p.strip()]
  if not patterns:
    raise ValueError(f"{what} is empty: source=text needs comma-separated file globs")
  out = []
  for pattern in patterns:
    if "://" in pattern:
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


def _text_documents(spec: str, mode: str, text_key: str, limit: int, what: str,
                    bad: badinput.BadData) -> list[str]:
  docs = []
  for path in expand_globs(spec, what):
    for _, text in badinput.stream_text_file(path, mode, text_key, bad):
      docs.append(text)
      if 0 <= limit <= len(docs):
        return docs[:limit]
  return docs


def _tfds_source(name: str, split_name: str, data_dir: str):
  import tensorflow_datasets as tfds  # slow to import; only data.source=tfds uses it
  if not name:
    raise ValueError("data.tfds_name is empty: source=tfds needs a dataset name")
  try:
    return tfds.data_source(name, split=split_name, data_dir=data_dir or None,
                            download=False)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"cannot open TFDS dataset {name!r} split {split_name!r} in data_dir="
                     f"{data_dir or '(default)'} (prepared ArrayRecord files are needed; "
                     f"nothing is downloaded): {e}") from e


def _first_line(e: Exception) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def _tfds_read(source, idx: list[int]) -> list:
  """The records at `idx`; an exception in place of each one that cannot be read."""
  try:
    if hasattr(source, "__getitems__"):
      return list(source.__getitems__(idx))
    return [source[i] for i in idx]
  except Exception:  # pylint: disable=broad-except
    pass  # one bad record fails the whole read: find it, record by record
  out = []
  for i in idx:
    try:
      out.append(source[i])
    except Exception as e:  # pylint: disable=broad-except
      out.append(e)
  return out


def tfds_documents(name: str, split_name: str, data_dir: str, text_key: str, limit: int,
                   bad: badinput.BadData) -> Iterator[tuple[int, str]]:
  """(record index, text) of a TFDS split's good records, in order (at most `limit`
  records read; -1: all); bad records per `bad` (`launch.data.badinput`)."""
  source = _tfds_source(name, split_name, data_dir)
  n = len(source) if limit < 0 else min(limit, len(source))
  where = f"TFDS {name}/{split_name}"
  for lo in range(0, n, TFDS_READ_BATCH):
    idx = list(range(lo, min(n, lo + TFDS_READ_BATCH)))
    for i, record in zip(idx, _tfds_read(source, idx)):
      if isinstance(record, Exception):
        bad.report("corrupt_record", f"{where} record {i}", _first_line(record))
        continue
      if text_key not in record:
        raise ValueError(f"{where}: no feature {text_key!r} (data.text_key); features: "
                         f"{sorted(record)}")
      value = record[text_key]
      if isinstance(value, bytes):
        text = badinput.check_document(value, f"{where} record {i}", 0, bad)
      else:
        text = str(value)
        if len(text.encode("utf-8", "surrogatepass")) > bad.max_document_bytes:
          bad.report("too_long", f"{where} record {i}",
                     f"more than data.max_document_bytes={bad.max_document_bytes} bytes")
          continue
      if text is None:
        continue
      if not text.strip():
        bad.report("empty", f"{where} record {i}", f"an empty {text_key!r}")
        continue
      yield i, text


def _tfds_documents(name: str, split_name: str, data_dir: str, text_key: str, limit: int,
                    bad: badinput.BadData) -> list[str]:
  return [t for _, t in tfds_documents(name, split_name, data_dir, text_key, limit, bad)]


def check_eval_split(data) -> None:
  """A named `data.eval_split` that is (part of) the training data is an error: the
  held-out numbers would measure text the model trained on."""
  if not data.eval_split:
    return
  if data.source == "default":
    raise ValueError("source=default has no named splits; leave data.eval_split empty "
                     "and use data.eval_fraction")
  if data.source == "tfds" and data.eval_split == data.train_split:
    raise ValueError(f"data.eval_split={data.eval_split!r} is data.train_split: the "
                     "held-out set would be trained on; name another split")
  if data.source == "text" and data.files:
    shared = sorted(set(expand_globs(data.files)) &
                    set(expand_globs(data.eval_split, "data.eval_split")))
    if shared:
      raise ValueError(f"data.eval_split={data.eval_split!r} and data.files share "
                       f"{len(shared)} file(s) ({', '.join(shared[:3])}): the held-out set "
                       "would be trained on; keep the evaluation files out of data.files")


def default_split(max_documents: int, fraction: float) -> tuple[list[str], list[str]]:
  """(train, held-out) documents of the default corpus: grouped, then decontaminated."""
  docs = corpus.grouped_documents(max_documents)
  is_eval = split.grouped_holdout([g for _, g in docs], fraction)
  train = [t for (t, _), e in zip(docs, is_eval) if not e]
  held_out = [t for (t, _), e in zip(docs, is_eval) if e]
  return train, split.decontaminate(train, held_out)


def load_documents(data, bad: badinput.BadData | None = None
                   ) -> tuple[list[str], list[str]]:
  """(train documents, eval documents) for the config's `data` section.

  Bad input follows `bad` (default: the config's policy), which counts what is skipped.
  No good training document at all is an error naming the input (whatever the policy).
  """
  source, limit = data.source, int(data.max_documents)
  fraction = float(data.eval_fraction)
  bad = bad if bad is not None else badinput.BadData.from_config(data)
  if source == "default":
    if data.eval_split:
      raise ValueError("source=default has no named splits; leave data.eval_split empty "
                       "and use data.eval_fraction")
    return default_split(limit, fraction)
  if source == "text":
    mode = data.get("text_document", "blank_line")
    train = _text_documents(data.files, mode, data.text_key, limit, "data.files", bad)
    if not train:
      raise badinput.no_documents_error(f"data.files={data.files!r}",
                                        expand_globs(data.files), bad)
    if data.eval_split:
      return train, split.drop_training_copies(train, _text_documents(
          data.eval_split, mode, data.text_key, EVAL_MAX_DOCUMENTS, "data.eval_split", bad))
    return split.random_holdout(train, fraction)
  if source == "tfds":
    train = _tfds_documents(data.tfds_name, data.train_split, data.tfds_data_dir,
                            data.text_key, limit, bad)
    if not train:
      raise badinput.no_documents_error(f"data.tfds_name={data.tfds_name!r}",
                                        [f"TFDS {data.tfds_name}/{data.train_split}"], bad)
    if data.eval_split:
      cap = EVAL_MAX_DOCUMENTS if limit < 0 else min(limit, EVAL_MAX_DOCUMENTS)
      return train, split.drop_training_copies(train, _tfds_documents(
          data.tfds_name, data.eval_split, data.tfds_data_dir, data.text_key, cap, bad))
    return split.random_holdout(train, fraction)
  if source == "arrayrecord":
    raise ValueError("data.source='arrayrecord' holds pretokenized rows, not documents "
                     "(launch.data.arrayrecord reads them)")
  raise ValueError(f"data.source={source!r}; expected one of {SOURCES}")


def source_spec(data) -> dict:
  """Everything that determines the documents (for the cache key)."""
  spec = {"source": data.source, "max_documents": int(data.max_documents),
          "eval_split": data.eval_split, "eval_fraction": float(data.eval_fraction)}
  if data.source == "default":
    spec["corpus"] = corpus.fingerprint()
    spec["split"] = f"grouped-decontaminated-{split.NGRAM}"
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
