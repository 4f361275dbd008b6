"""A generated block of a markdown file: the text between two marker lines, rewritten by a
tool (the AOT table in docs/benchmarks.md, the ablation summary in docs/ablations/)."""
import os
import tempfile


def replace_block(path: str, start: str, end: str, body: str) -> None:
  """Replaces what lies between `start` and `end` in `path` with `body` (on lines of its
  own), the file written whole or not at all; a file without both markers, in order, is
  a ValueError naming them, and nothing is written."""
  with open(path) as f:
    text = f.read()
  if start not in text or end not in text or text.index(start) > text.index(end):
    raise ValueError(f"{path} has no {start} ... {end} block to write into")
  head, rest = text.split(start, 1)
  _, tail = rest.split(end, 1)
  write_whole(path, f"{head}{start}\n{body}\n{end}{tail}")


def write_whole(path: str, text: str) -> None:
  """`text` into `path` whole or not at all (a new temporary file renamed over it)."""
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".partial")
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    os.unlink(tmp)
    raise
