"""docs/use_in_jax.md: every code block runs, in order, with a tiny random BERT checkpoint
in place of path/to/hf_dir (python blocks in this process, bash blocks as commands)."""
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.encoders import family_dirs as F

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                   "use_in_jax.md")
REPO = os.path.dirname(DOC)[:-len("/docs")]


def _blocks():
  text = open(DOC).read()
  return re.findall(r"```(python|bash)\n(.*?)```", text, re.S)


def test_the_doc_has_its_five_examples():
  text = open(DOC).read()
  titles = re.findall(r"^## \d\. (.+)$", text, re.M)
  assert titles == ["Load and embed", "Load sharded onto a mesh",
                    "A Linen model with a pretrained encoder as a field", "NNX",
                    "Export and serve"]
  assert len([b for b in _blocks() if b[0] == "python"]) == 5


def _run(blocks, tmp_path, monkeypatch, capsys):
  path = F.tiny_dir("bert")
  monkeypatch.chdir(tmp_path)
  printed = []
  for lang, code in blocks:
    code = code.replace("path/to/hf_dir", path)
    if lang == "bash":
      cmd = shlex.split(code.strip())
      assert cmd[0] == "python"
      env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
      run = subprocess.run([sys.executable] + cmd[1:], env=env, capture_output=True,
                           text=True, timeout=600)
      assert run.returncode == 0, run.stderr[-3000:]
      continue
    exec(compile(code, DOC, "exec"), {"__name__": "__doc_example__"})
    printed.append(capsys.readouterr().out.strip())
  return printed


def test_the_first_two_examples_run(tmp_path, monkeypatch, capsys):
  printed = _run(_blocks()[:2], tmp_path, monkeypatch, capsys)
  assert printed[0] == "(2, 32)"
  assert printed[1].startswith("P(") and printed[1].endswith(" 8")


@pytest.mark.slow  # all five: two fine-tunes and an export in a subprocess (minutes)
def test_every_example_runs(tmp_path, monkeypatch, capsys):
  printed = _run(_blocks(), tmp_path, monkeypatch, capsys)
  # what the examples print: shapes, shardings, finite losses, the served platforms
  assert printed[0] == "(2, 32)"
  assert printed[1].startswith("P(") and printed[1].endswith(" 8")
  for loss in printed[2:4]:
    assert 0 <= float(loss) < 1.0, printed
  assert "cpu" in printed[4] and printed[4].endswith("(1, 4, 32)")
