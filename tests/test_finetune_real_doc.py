"""docs/finetune_real.py: its throughput arithmetic, and its dataset preparation from the
fetched archives (skipped where .cache/finetune_data has not been fetched)."""
import importlib.util
import os

import pytest

from launch.data import finetune_data as fd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = importlib.util.spec_from_file_location(
    "finetune_real", os.path.join(ROOT, "docs", "finetune_real.py"))
real = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(real)


def test_result_leaves_the_first_epoch_out_of_the_steady_tokens_per_s():
  r = real._result([0.5, 0.7, 0.6], 1000, [10.0, 2.0, 2.0])
  assert r["metric"] == 0.7 and r["final"] == 0.6
  assert r["tokens_per_s"] == pytest.approx(3000 / 14)
  assert r["steady_tokens_per_s"] == pytest.approx(500.0)
  assert r["train_s"] == pytest.approx(14.0)
  assert real._result([0.5], 1000, [4.0])["steady_tokens_per_s"] is None


def test_frameworks_are_checked_before_anything_runs(monkeypatch):
  assert real.check_frameworks("ours") == ["ours"]
  with pytest.raises(SystemExit, match=r"unknown \['trainr'\]; choose from ours, trainer"):
    real.check_frameworks("ours,trainr")
  with pytest.raises(SystemExit, match="empty list"):
    real.check_frameworks(",")
  found = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda n, *a: None if n == "accelerate" else found(n, *a))
  with pytest.raises(SystemExit, match="pip install accelerate"):
    real.check_frameworks("ours,trainer")
  assert real.check_frameworks("ours") == ["ours"]


def _need(name):
  if not os.path.isfile(os.path.join(real.DATA, real.WHEELS[name])):
    pytest.skip(f"{real.WHEELS[name]} not fetched (see docs/finetune_real.py)")


def test_prepare_bbc_and_rotten_tomatoes_subsamples(tmp_path):
  for name, labels in (("bbc", {"business", "entertainment", "politics", "sports", "tech"}),
                       ("rt", {"fresh", "rotten"})):
    _need(name)
    path, task = real.prepare(name, str(tmp_path), max_rows=60, seed=0)
    rows = fd.read_table(path)
    assert task == "sequence" and len(rows) == 60
    assert {r["label"] for r in rows} <= labels and len({r["label"] for r in rows}) > 1
    assert all(r["text"].strip() for r in rows)
    again, _ = real.prepare(name, str(tmp_path / "again"), max_rows=60, seed=0)
    assert fd.read_table(again) == rows  # the subsample is seeded


def test_prepare_wnut_gives_bio_tagged_tweets(tmp_path):
  _need("wnut")
  path, task = real.prepare("wnut", str(tmp_path), max_rows=80, seed=0)
  sentences = fd.read_conll(path)
  assert task == "token" and len(sentences) == 80
  tags = {t for _, ts in sentences for t in ts}
  assert "O" in tags and any(t.startswith("B-") for t in tags)
  assert all(t == "O" or t[:2] in ("B-", "I-") for t in tags)
  assert all(len(w) == len(t) for w, t in sentences)


def test_prepare_full_datasets_have_the_documented_sizes(tmp_path):
  """BBC News 2,225 documents, Rotten Tomatoes 12,808 fresh/rotten snippets (the
  archive's `plot` rows left out), WNUT-16 2,394 tweets."""
  for name, n in (("bbc", 2225), ("rt", 12808), ("wnut", 2394)):
    _need(name)
    path, task = real.prepare(name, str(tmp_path / name))
    read = fd.read_conll if task == "token" else fd.read_table
    assert len(read(path)) == n, name
