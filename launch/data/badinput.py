"""Bad input data, found while streaming documents or reading shards: skip-and-count or stop.

`data.bad_data` chooses the policy for every kind of bad input:
- "skip" (default): the bad item is dropped, a warning names the first few with their file
  and byte offset, and `BadData.counts` counts every one by kind (the counts go into the
  preprocessing manifest and the run's data stats).
- "error": the first bad item raises a `BadDataError` naming the kind, file and offset.

Kinds: `non_utf8` (a document whose bytes are not valid UTF-8, a UTF-16 file), `binary`
(a file or document that is not text: a NUL byte, or fewer than `data.min_printable_ratio`
of the decodable characters of its first `BINARY_SAMPLE` bytes printable or white space),
`empty` (a file that holds no document at all, a document with no text: an empty file in
`text_document="file"` mode, a JSONL record or TFDS record with an empty text field),
`too_long` (a document longer than `data.max_document_bytes` bytes, e.g. one 50 MB
line), `bad_json` (a JSONL line that does not parse or lacks the text field),
`corrupt_file` (a `.gz` file that does not decompress), `corrupt_shard` (an ArrayRecord
shard that cannot be opened) and `corrupt_record` (a record that cannot be read or
decoded).

Input with no good document at all is always an error, whatever the policy
(`no_documents_error`): skipping everything would train on nothing.

`stream_text_file` reads one local or gs:// file (optionally .gz) as (offset, text)
documents without decoding the file as a whole, so each document's byte offset is known.
`check_document` applies the document checks to the bytes of one document from any source.
"""
from __future__ import annotations

import gzip
import json
import logging
import re
import zlib
from collections.abc import Iterator, Sequence

from etils import epath

from encoders.tasks.data import InputDataError  # noqa: F401  (the task readers' error)

POLICIES = ("skip", "error")
KINDS = ("non_utf8", "binary", "empty", "too_long", "bad_json", "corrupt_file",
         "corrupt_shard", "corrupt_record")
DEFAULT_MAX_DOCUMENT_BYTES = 8_000_000
DEFAULT_MIN_PRINTABLE_RATIO = 0.9  # data.min_printable_ratio
BINARY_SAMPLE = 8192  # bytes of a file (or document) the printable-ratio test reads
# Characters that are neither printable nor white space: C0/C1 controls and DEL.
_CONTROL = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f]")
WARN_FIRST = 5  # warnings logged per kind; the rest are only counted
_BLANK_LINES = re.compile(rb"\n[ \t\r\f\v]*\n")
log = logging.getLogger(__name__)


class BadDataError(InputDataError):
  """Bad input under `data.bad_data="error"`: names the kind, the file and the offset."""


class BadData:
  """The policy and the per-kind counts of one reader (or of one preprocessing worker)."""

  def __init__(self, policy: str = "skip", max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES,
               min_printable_ratio: float = DEFAULT_MIN_PRINTABLE_RATIO):
    check_settings(policy, max_document_bytes, min_printable_ratio)
    self.policy = policy
    self.max_document_bytes = int(max_document_bytes)
    self.min_printable_ratio = float(min_printable_ratio)
    self.counts = {k: 0 for k in KINDS}

  @classmethod
  def from_config(cls, data) -> "BadData":
    return cls(*settings(data))

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

  @property
  def total(self) -> int:
    return sum(self.counts.values())

  def nonzero(self) -> dict[str, int]:
    """{kind: count} of the kinds seen (plain ints: JSON-serializable)."""
    return {k: int(v) for k, v in self.counts.items() if v}

  def summary(self) -> str:
    """"3 non_utf8, 1 binary" or "nothing skipped"."""
    seen = self.nonzero()
    return ", ".join(f"{v} {k}" for k, v in seen.items()) if seen else "nothing skipped"


def settings(data) -> tuple[str, int, float]:
  """(policy, max_document_bytes, min_printable_ratio) of a config's `data` section."""
  return (data.get("bad_data", "skip"),
          data.get("max_document_bytes", DEFAULT_MAX_DOCUMENT_BYTES),
          data.get("min_printable_ratio", DEFAULT_MIN_PRINTABLE_RATIO))


def check_settings(policy, max_document_bytes, min_printable_ratio) -> None:
  """One-line ValueErrors for bad values of the three settings."""
  if policy not in POLICIES:
    raise ValueError(f"data.bad_data={policy!r}; expected one of {POLICIES}")
  try:
    size = int(max_document_bytes)
  except (TypeError, ValueError):
    size = 0
  if size <= 0:
    raise ValueError(f"data.max_document_bytes={max_document_bytes!r} must be a positive "
                     "number of bytes")
  try:
    ratio = float(min_printable_ratio)
  except (TypeError, ValueError):
    ratio = -1.0
  if not 0 <= ratio <= 1:
    raise ValueError(f"data.min_printable_ratio={min_printable_ratio!r} must be in [0, 1]")


def no_documents_error(what: str, paths: Sequence[str], bad: BadData) -> ValueError:
  """The error for input without a single good document: names the files and the counts."""
  shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
  return ValueError(f"{what}: no usable document in {shown or 'the input'} ({bad.summary()}"
                    f"; data.bad_data={bad.policy!r})")


def binary_reason(sample: bytes, min_printable_ratio: float) -> str | None:
  """Why `sample` (the first bytes of a file or document) is not text, or None.

  Not text: a NUL byte, or fewer than `min_printable_ratio` of its characters printable or
  white space (characters are decoded as UTF-8; undecodable bytes do not count either
  way, so text in another encoding is `non_utf8`, not binary).
  """
  sample = sample[:BINARY_SAMPLE]
  nul = sample.find(b"\x00")
  if nul >= 0:
    return f"a NUL byte at byte {nul} (not a text file)"
  text = sample.decode("utf-8", errors="ignore")
  if not text:
    return None
  control = len(_CONTROL.findall(text))
  ratio = 1 - control / len(text)
  if ratio < min_printable_ratio:
    return (f"only {ratio:.0%} of its first {len(sample)} bytes are printable text "
            f"(data.min_printable_ratio={min_printable_ratio})")
  return None


def _read_bytes(path: str, bad: BadData) -> bytes | None:
  """The (decompressed) bytes of `path`, or None after reporting a corrupt `.gz` file."""
  try:
    data = epath.Path(path).read_bytes()
  except OSError as e:
    raise ValueError(f"cannot read {path}: {e}") from e
  if not path.endswith(".gz"):
    return data
  try:
    return gzip.decompress(data)
  except (OSError, EOFError, zlib.error) as e:
    bad.report("corrupt_file", f"{path}", f"not a readable gzip file: {e}")
    return None


def check_document(raw: bytes, where: str, offset: int, bad: BadData) -> str | None:
  """The text of one document's bytes, or None (after reporting) when it is bad.

  `where` names the file (or record) and `offset` the document's first byte in it; the
  report names the byte where the problem is. Checks: too long, binary, not UTF-8.
  """
  at = f"{where} at byte {offset}"
  if len(raw) > bad.max_document_bytes:
    bad.report("too_long", at,
               f"{len(raw)} bytes > data.max_document_bytes={bad.max_document_bytes}")
    return None
  nul = raw.find(b"\x00")
  reason = (f"a NUL byte at byte {offset + nul}" if nul >= 0
            else binary_reason(raw, bad.min_printable_ratio))
  if reason is not None:
    bad.report("binary", at, reason)
    return None
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    bad.report("non_utf8", f"{where} at byte {offset + e.start}",
               f"{e.reason} ({raw[e.start:e.start + 4]!r})")
    return None
  return text


def stream_text_file(path: str, mode: str, text_key: str, bad: BadData
                     ) -> Iterator[tuple[int, str]]:
  """(byte offset, document text) of one file, in order; bad documents per `bad`.

  Formats as `launch.data.sources` (`*.jsonl[.gz]`: one JSON record per line; other
  files: blank-line separated documents, or the whole file with mode="file"); offsets
  are in the decompressed bytes. A file that is not text (`binary_reason` of its first
  bytes) is reported once as `binary`; a file that yields no document and had no other
  bad input reported is reported as `empty`.
  """
  before = bad.total
  yielded = 0
  for item in _stream_text_file(path, mode, text_key, bad):
    yielded += 1
    yield item
  if not yielded and bad.total == before:
    bad.report("empty", path, "the file holds no document")


def _stream_text_file(path: str, mode: str, text_key: str, bad: BadData
                      ) -> Iterator[tuple[int, str]]:
  data = _read_bytes(path, bad)
  if data is None:
    return
  if data.startswith((b"\xff\xfe", b"\xfe\xff")):
    bad.report("non_utf8", f"{path} at byte 0", "a UTF-16 byte-order mark: the file is "
               "UTF-16 text; convert it to UTF-8")
    return
  reason = binary_reason(data, bad.min_printable_ratio)
  if reason is not None:
    bad.report("binary", path, reason)
    return
  name = path.removesuffix(".gz")
  bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0  # a UTF-8 byte-order mark: not text
  if name.endswith(".jsonl"):
    offset = bom
    data = data[bom:]
    for n, line in enumerate(data.split(b"\n"), 1):
      start, offset = offset, offset + len(line) + 1
      if not line.strip():
        continue
      text = check_document(line, path, start, bad)
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
      if not isinstance(record[text_key], str):
        bad.report("bad_json", f"{path} line {n} (byte {start})",
                   f"the {text_key!r} field is a JSON {type(record[text_key]).__name__}, "
                   "not a string")
        continue
      doc = record[text_key].strip()
      if not doc:
        bad.report("empty", f"{path} line {n} (byte {start})")
        continue
      if "\x00" in doc:
        bad.report("binary", f"{path} line {n} (byte {start})", "a NUL character in the text")
        continue
      yield start, doc
    return
  if mode == "file":
    text = check_document(data[bom:], path, bom, bad)
    if text is not None:
      if text.strip():
        yield 0, text.strip()
      else:
        bad.report("empty", f"{path} at byte 0")
    return
  start = bom  # "\r\n" line ends: "\r" is blank space to the separator; offsets stay exact
  for m in [*_BLANK_LINES.finditer(data, bom), None]:
    end = m.start() if m is not None else len(data)
    raw = data[start:end]
    if raw.strip():
      text = check_document(raw, path, start, bad)
      if text is not None and text.strip():
        yield start, text.strip().replace("\r\n", "\n")
    if m is not None:
      start = m.end()
