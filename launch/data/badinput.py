"""Bad input data, found while streaming documents or reading shards: skip-and-count or stop.

`data.bad_data` chooses the policy for every kind of bad input:
- "skip" (default): the bad item is dropped, a warning names the first few with their file
  and byte offset, and `BadData.counts` counts every one by kind (the counts go into the
  preprocessing manifest and the run's data stats).
- "error": the first bad item raises a `BadDataError` naming the kind, file and offset.

Kinds: `non_utf8` (a document whose bytes are not valid UTF-8), `empty` (a document with
no text: an empty file in `text_document="file"` mode, a JSONL record with an empty text
field), `too_long` (a document longer than `data.max_document_bytes` bytes, e.g. one
50 MB line), `bad_json` (a JSONL line that does not parse or lacks the text field),
`corrupt_shard` (an ArrayRecord shard that cannot be opened) and `corrupt_record` (a
record that cannot be read or decoded).

`stream_text_file` reads one local or gs:// file (optionally .gz) as (offset, text)
documents without decoding the file as a whole, so each document's byte offset is known.
"""
from __future__ import annotations

import gzip
import json
import logging
import re
from collections.abc import Iterator

POLICIES = ("skip", "error")
KINDS = ("non_utf8", "empty", "too_long", "bad_json", "corrupt_shard", "corrupt_record")
DEFAULT_MAX_DOCUMENT_BYTES = 8_000_000
WARN_FIRST = 5  # warnings logged per kind; the rest are only counted
_BLANK_LINES = re.compile(rb"\n[ \t\r\f\v]*\n")
log = logging.getLogger(__name__)


class BadDataError(ValueError):
  """Bad input under `data.bad_data="error"`: names the kind, the file and the offset."""


class BadData:
  """The policy and the per-kind counts of one reader (or of one preprocessing worker)."""

  def __init__(self, policy: str = "skip", max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES):
    if policy not in POLICIES:
      raise ValueError(f"data.bad_data={policy!r}; expected one of {POLICIES}")
    if int(max_document_bytes) <= 0:
      raise ValueError(f"data.max_document_bytes={max_document_bytes} must be positive")
    self.policy = policy
    self.max_document_bytes = int(max_document_bytes)
    self.counts = {k: 0 for k in KINDS}

  @classmethod
  def from_config(cls, data) -> "BadData":
    return cls(data.get("bad_data", "skip"),
               data.get("max_document_bytes", DEFAULT_MAX_DOCUMENT_BYTES))

  def report(self, kind: str, where: str, detail: str = "") -> None:
    """One bad item at `where` ("file at byte N", "shard S record R"): count it or raise."""
    if kind not in KINDS:
      raise ValueError(f"unknown bad-data kind {kind!r}")
    message = f"bad input ({kind}) in {where}" + (f": {detail}" if detail else "")
    if self.policy == "error":
      raise BadDataError(message + " (data.bad_data='error'; set 'skip' to skip and count)")
    self.counts[kind] += 1
    if self.counts[kind] <= WARN_FIRST:
      log.warning("skipped %s%s", message,
                  " (further ones of this kind are only counted)"
                  if self.counts[kind] == WARN_FIRST else "")

  def merge(self, counts: dict) -> None:
    for k, v in counts.items():
      self.counts[k] = self.counts.get(k, 0) + int(v)

  @property
  def total(self) -> int:
    return sum(self.counts.values())


def _read_bytes(path: str) -> bytes:
  from etils import epath  # pylint: disable=g-import-not-at-top
  data = epath.Path(path).read_bytes()
  return gzip.decompress(data) if path.endswith(".gz") else data


def _check(raw: bytes, path: str, offset: int, bad: BadData) -> str | None:
  """The document's text, or None (after reporting) when it is bad."""
  if len(raw) > bad.max_document_bytes:
    bad.report("too_long", f"{path} at byte {offset}",
               f"{len(raw)} bytes > data.max_document_bytes={bad.max_document_bytes}")
    return None
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    bad.report("non_utf8", f"{path} at byte {offset + e.start}", str(e.reason))
    return None
  return text


def stream_text_file(path: str, mode: str, text_key: str, bad: BadData
                     ) -> Iterator[tuple[int, str]]:
  """(byte offset, document text) of one file, in order; bad documents per `bad`.

  Formats as `launch.data.sources` (`*.jsonl[.gz]`: one JSON record per line; other
  files: blank-line separated documents, or the whole file with mode="file"); offsets
  are in the decompressed bytes.
  """
  data = _read_bytes(path)
  name = path.removesuffix(".gz")
  if name.endswith(".jsonl"):
    offset = 0
    for n, line in enumerate(data.split(b"\n"), 1):
      start, offset = offset, offset + len(line) + 1
      if not line.strip():
        continue
      text = _check(line, path, start, bad)
      if text is None:
        continue
      try:
        record = json.loads(text)
      except json.JSONDecodeError as e:
        bad.report("bad_json", f"{path} line {n} (byte {start})", str(e))
        continue
      if not isinstance(record, dict) or text_key not in record:
        bad.report("bad_json", f"{path} line {n} (byte {start})",
                   f"no {text_key!r} field (data.text_key)")
        continue
      doc = str(record[text_key]).strip()
      if not doc:
        bad.report("empty", f"{path} line {n} (byte {start})")
        continue
      yield start, doc
    return
  if mode == "file":
    text = _check(data, path, 0, bad)
    if text is not None:
      if text.strip():
        yield 0, text.strip()
      else:
        bad.report("empty", f"{path} at byte 0")
    return
  data = data.replace(b"\r\n", b"\n")  # offsets then count "\r\n" as one byte
  start = 0
  for m in [*_BLANK_LINES.finditer(data), None]:
    end = m.start() if m is not None else len(data)
    raw = data[start:end]
    if raw.strip():
      text = _check(raw, path, start, bad)
      if text is not None and text.strip():
        yield start, text.strip()
    if m is not None:
      start = m.end()
