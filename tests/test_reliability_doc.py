"""docs/reliability.md: at least 40 probe cases, and every test it names exists."""
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "reliability.md")
ABBREVIATIONS = {"TT": "launch/test_trust_trainer.py", "TD": "launch/test_trust_data.py",
                 "TF": "launch/test_trust_finetune.py",
                 "TE": "encoders/test_trust_encoders.py"}


def _rows():
  return [line for line in open(DOC).read().splitlines()
          if re.match(r"^\| \d+ \|", line)]


def _refs(row):
  """(test file, test name) pairs of the row's last cell."""
  cell = row.rstrip(" |").rsplit(" | ", 1)[1]
  for ref in re.split(r",\s*|;\s*", re.sub(r"\(slow\)", "", cell)):
    ref = ref.strip()
    if not ref:
      continue
    path, name = ref.split("::")
    yield ABBREVIATIONS.get(path, path), name


def test_the_table_has_at_least_40_numbered_cases():
  numbers = [int(re.match(r"^\| (\d+) \|", r).group(1)) for r in _rows()]
  assert len(numbers) >= 40
  assert numbers == list(range(1, len(numbers) + 1))


def test_every_named_test_exists():
  missing = []
  for row in _rows():
    refs = list(_refs(row))
    assert refs, row
    for path, name in refs:
      full = os.path.join(REPO, "tests", path)
      if not os.path.isfile(full) or not re.search(
          rf"^def {re.escape(name)}\(", open(full).read(), re.M):
        missing.append(f"{path}::{name}")
  assert not missing, missing
