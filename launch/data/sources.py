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

For `text` and `tfds`, the evaluation documents are the named `data.eval_split`,
otherwise a fixed fraction (`data.eval_fraction`) of the documents chosen by a fixed seed
(independent of `shuffle_seed`, so runs with different seeds share one held-out set).
"""
from __future__ import annotations

import glob as globlib
import gzip
import json
import os
import re

from launch.data import corpus
from launch.data import split

SOURCES = ("default", "text", "tfds")
TEXT_DOCUMENT_MODES = ("blank_line", "file")
EVAL_MAX_DOCUMENTS = 20_000  # read at most this many documents of a named eval split
_BLANK_LINES = re.compile(r"\n[ \t\r\f\v]*\n")


def _read_text(path: str) -> str:
  from etils import epath  # pylint: disable=g-import-not-at-top
  data = epath.Path(path).read_bytes()
  if path.endswith(".gz"):
    data = gzip.decompress(data)
  return data.decode("utf-8", errors="replace")


def expand_globs(spec: str, what: str = "data.files") -> list[str]:
  """Sorted, de-duplicated files matching comma-separated globs; each glob must match."""
  patterns = [p.strip() for p in (spec or "").split(",") if p.strip()]
  if not patterns:
    raise ValueError(f"{what} is empty: source=text needs comma-separated file globs")
  out = []
  for pattern in patterns:
    if "://" in pattern:
      from etils import epath  # pylint: disable=g-import-not-at-top
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


def _file_documents(path: str, mode: str, text_key: str) -> list[str]:
  text = _read_text(path)
  name = path[:-3] if path.endswith(".gz") else path
  if name.endswith(".jsonl"):
    docs = []
    for n, line in enumerate(text.splitlines(), 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{n}: not a JSON line: {e}") from e
      if not isinstance(record, dict) or text_key not in record:
        raise ValueError(f"{path}:{n}: no {text_key!r} field (data.text_key)")
      docs.append(str(record[text_key]))
  elif mode == "file":
    docs = [text]
  else:
    docs = _BLANK_LINES.split(text.replace("\r\n", "\n"))
  return [d.strip() for d in docs if d.strip()]


def _text_documents(spec: str, mode: str, text_key: str, limit: int, what: str) -> list[str]:
  docs = []
  for path in expand_globs(spec, what):
    docs.extend(_file_documents(path, mode, text_key))
    if 0 <= limit <= len(docs):
      return docs[:limit]
  return docs


def _tfds_source(name: str, split_name: str, data_dir: str):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  if not name:
    raise ValueError("data.tfds_name is empty: source=tfds needs a dataset name")
  try:
    return tfds.data_source(name, split=split_name, data_dir=data_dir or None,
                            download=False)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"cannot open TFDS dataset {name!r} split {split_name!r} in data_dir="
                     f"{data_dir or '(default)'} (prepared ArrayRecord files are needed; "
                     f"nothing is downloaded): {e}") from e


def _tfds_documents(name: str, split_name: str, data_dir: str, text_key: str,
                    limit: int) -> list[str]:
  source = _tfds_source(name, split_name, data_dir)
  n = len(source) if limit < 0 else min(limit, len(source))
  docs = []
  for lo in range(0, n, 1024):
    idx = list(range(lo, min(n, lo + 1024)))
    records = source.__getitems__(idx) if hasattr(source, "__getitems__") else [
        source[i] for i in idx]
    for record in records:
      if text_key not in record:
        raise ValueError(f"TFDS {name}/{split_name}: no feature {text_key!r} "
                         f"(data.text_key); features: {sorted(record)}")
      value = record[text_key]
      text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)
      if text.strip():
        docs.append(text)
  return docs


def default_split(max_documents: int, fraction: float) -> tuple[list[str], list[str]]:
  """(train, held-out) documents of the default corpus: grouped, then decontaminated."""
  docs = corpus.grouped_documents(max_documents)
  is_eval = split.grouped_holdout([g for _, g in docs], fraction)
  train = [t for (t, _), e in zip(docs, is_eval) if not e]
  held_out = [t for (t, _), e in zip(docs, is_eval) if e]
  return train, split.decontaminate(train, held_out)


def load_documents(data) -> tuple[list[str], list[str]]:
  """(train documents, eval documents) for the config's `data` section."""
  source, limit = data.source, int(data.max_documents)
  fraction = float(data.eval_fraction)
  if source == "default":
    if data.eval_split:
      raise ValueError("source=default has no named splits; leave data.eval_split empty "
                       "and use data.eval_fraction")
    return default_split(limit, fraction)
  if source == "text":
    mode = data.get("text_document", "blank_line")
    train = _text_documents(data.files, mode, data.text_key, limit, "data.files")
    if not train:
      raise ValueError(f"data.files={data.files!r}: the files hold no text")
    if data.eval_split:
      return train, _text_documents(data.eval_split, mode, data.text_key,
                                    EVAL_MAX_DOCUMENTS, "data.eval_split")
    return split.random_holdout(train, fraction)
  if source == "tfds":
    train = _tfds_documents(data.tfds_name, data.train_split, data.tfds_data_dir,
                            data.text_key, limit)
    if not train:
      raise ValueError(f"TFDS {data.tfds_name}/{data.train_split} has no non-empty text")
    if data.eval_split:
      cap = EVAL_MAX_DOCUMENTS if limit < 0 else min(limit, EVAL_MAX_DOCUMENTS)
      return train, _tfds_documents(data.tfds_name, data.eval_split, data.tfds_data_dir,
                                    data.text_key, cap)
    return split.random_holdout(train, fraction)
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
