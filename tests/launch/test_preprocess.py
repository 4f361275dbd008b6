"""launch.preprocess -> ArrayRecord shards -> data.source=arrayrecord, and bad input."""
import copy
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from launch import preprocess
from launch.data import arrayrecord
from launch.data import badinput
from launch.data import pipeline as pipeline_lib
from launch.data import tokenization
from tests.launch.data_helpers import (assert_batches_equal, build_tiny_tfds, make_config,  # noqa: F401
                                       spm, spm_path, take)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _docs(n, words=60):
  rng = np.random.default_rng(0)
  vocab = ["alpha", "beta", "gamma", "delta", "the", "cat", "sat", "on", "mat", "runs."]
  return ["\n".join(" ".join(rng.choice(vocab, words // 4)) for _ in range(4))
          for _ in range(n)]


def _text_corpus(tmp_path, n=60):
  path = tmp_path / "corpus.txt"
  path.write_text("\n\n".join(_docs(n)))
  return str(path)


def _config(spm_path, files, **kw):
  kw.setdefault("eval_fraction", 0.1)
  c = make_config(tokenizer_kind="sentencepiece", tokenizer_path=spm_path, source="text",
                  files=files, **kw)
  return c


def _ar_config(c, out):
  c = make_config(tokenizer_kind=c.tokenizer.kind, tokenizer_path=c.tokenizer.path,
                  source="arrayrecord", path=out, seq_len=c.data.seq_len,
                  packing=c.data.packing)
  return c


def test_row_codec_roundtrip_documents_and_pairs(spm):
  from launch.data import packing, tokenized
  from launch.data import pairs
  tok = tokenized.tokenize_documents(spm, _docs(8), "sentence")
  for rows, label in [(packing.pack_documents(tok, spm, 32), None),
                      (pairs.build_pairs(tok, spm, 32, task="nsp"), "next_sentence_label")]:
    dec = arrayrecord.RowDecoder(32, "uint16", spm.vocab_size, spm.cls_id, spm.sep_id,
                                 spm.pad_id, spm.word_start, label)
    for i in range(min(len(rows), 6)):
      row = rows(i) if label is None else rows(i, np.random.default_rng(i))
      back = dec(arrayrecord.encode_row(row, "uint16", label))
      assert back.keys() == row.keys()
      for k in row:
        np.testing.assert_array_equal(back[k], row[k], err_msg=k)
    with pytest.raises(ValueError, match="not a row record"):
      dec(arrayrecord.encode_row(row, "uint16", label)[:-1])


def _preprocess_and_train(spm_path, tmp_path, workers, monkeypatch=None):
  out = str(tmp_path / "shards")
  c = _config(spm_path, _text_corpus(tmp_path), packing="documents")
  m = preprocess.preprocess(c, out, workers=workers, docs_per_shard=20, progress=False)
  assert len(m["shards"]["train"]) >= 2 and m["totals"]["train"]["rows"] > 0
  assert m["tokenizer"]["fingerprint"] == tokenization.load_sentencepiece(spm_path).fingerprint()
  assert m["totals"]["train"]["documents"] + m["totals"]["eval"]["documents"] == 60
  mtimes = {f: os.stat(os.path.join(out, f)).st_mtime_ns for f in os.listdir(out)
            if f.endswith(".arrayrecord")}
  again = preprocess.preprocess(c, out, workers=1, docs_per_shard=20, progress=False)
  assert again["shards"] == m["shards"]  # finished shards are reused, not rewritten
  assert mtimes == {f: os.stat(os.path.join(out, f)).st_mtime_ns for f in mtimes}
  with pytest.raises(ValueError, match="other settings"):
    preprocess.preprocess(c, out, workers=1, docs_per_shard=7, progress=False)

  ac = _ar_config(c, out)
  if monkeypatch:  # nothing is read as text or tokenized at start-up
    from launch.data import sources, tokenized
    for mod, name in [(tokenized, "tokenize_documents"), (sources, "load_documents")]:
      monkeypatch.setattr(mod, name, lambda *a, **k: pytest.fail("tokenized at start-up"))
  p = pipeline_lib.make_pipeline(ac, None, process_index=0, process_count=1)
  assert p.stats["train_rows"] == m["totals"]["train"]["rows"] and not p.stats["bad_data"]
  # The rows equal the in-memory pipeline's packing of the same tokens (per shard).
  first = p._train_rows(0)
  clone = copy.deepcopy(p._train_rows)  # as sent to Grain worker processes: no open readers
  assert not clone._readers
  np.testing.assert_array_equal(clone(0)["input_ids"], first["input_ids"])
  assert first["input_ids"][0] == p.tokenizer.cls_id and first["segment_ids"][0] == 1
  it = p.train_iter()
  take(it, 2)
  state = it.get_state()
  expected = take(it, 3)
  assert_batches_equal(take(p.train_iter(start_state=json.loads(json.dumps(state))), 3),
                       expected)
  # Two processes read disjoint shares that together make one epoch.
  shares = [pipeline_lib.make_pipeline(ac, None, process_index=i, process_count=2)
            for i in range(2)]
  ids = [{tuple(b["input_ids"][r]) for b in take(s.train_iter(), s.steps_per_epoch)
          for r in range(s.batch_size)} for s in shares]
  assert ids[0] and ids[1] and not ids[0] & ids[1]


def test_preprocess_then_train_rows_resume_and_skip_finished(spm_path, tmp_path,
                                                            monkeypatch):
  _preprocess_and_train(spm_path, tmp_path, workers=1, monkeypatch=monkeypatch)


@pytest.mark.slow
def test_preprocess_with_worker_processes(spm_path, tmp_path):
  _preprocess_and_train(spm_path, tmp_path, workers=2)


def test_arrayrecord_config_mismatch_is_an_error(spm_path, tmp_path):
  out = str(tmp_path / "s")
  c = _config(spm_path, _text_corpus(tmp_path, 30), packing="documents")
  preprocess.preprocess(c, out, workers=1, docs_per_shard=50, progress=False)
  ac = _ar_config(c, out)
  ac.data.seq_len = 48
  with pytest.raises(ValueError, match="seq_len"):
    pipeline_lib.make_pipeline(ac, None, process_index=0, process_count=1)
  with pytest.raises(ValueError, match="gcsfuse"):
    pipeline_lib.make_pipeline(_ar_config(c, "gs://bucket/shards"), None, process_index=0,
                               process_count=1)
  with pytest.raises(ValueError, match="no manifest.json"):
    pipeline_lib.make_pipeline(_ar_config(c, str(tmp_path)), None, process_index=0,
                               process_count=1)


def test_pairs_shards_carry_the_label(spm_path, tmp_path):
  out = str(tmp_path / "p")
  c = _config(spm_path, _text_corpus(tmp_path, 40), packing="pairs")
  m = preprocess.preprocess(c, out, workers=1, docs_per_shard=100, progress=False)
  assert m["label_key"] == "next_sentence_label"
  p = pipeline_lib.make_pipeline(_ar_config(c, out), None, process_index=0, process_count=1)
  labels = np.concatenate([b["next_sentence_label"] for b in take(p.train_iter(), 4)])
  assert set(labels.tolist()) == {0, 1}


def _bad_files(tmp_path):
  d = tmp_path / "bad"
  d.mkdir()
  good = "\n\n".join(_docs(12)).encode()
  (d / "a_good.txt").write_bytes(good)
  (d / "b_latin1.txt").write_bytes(b"fine text here.\n\ncaf\xe9 au lait\n\nmore fine text.")
  lines = [json.dumps({"text": t}) for t in _docs(6)] + [json.dumps({"text": ""}),
                                                         "{not json", json.dumps({"x": 1})]
  (d / "c.jsonl.gz").write_bytes(gzip.compress("\n".join(lines).encode()))
  (d / "d_huge.txt").write_bytes(b"short doc.\n\n" + b"x" * 2_000_000 + b"\n\nend doc.")
  return str(d / "*")


def test_bad_documents_are_counted_or_named(spm_path, tmp_path):
  files = _bad_files(tmp_path)
  c = _config(spm_path, files, packing="documents", max_document_bytes=1_000_000)
  m = preprocess.preprocess(c, str(tmp_path / "o"), workers=1, docs_per_shard=100,
                            progress=False)
  assert {k: v for k, v in m["bad_data"].items() if v} == {
      "non_utf8": 1, "empty": 1, "bad_json": 2, "too_long": 1}
  docs = m["totals"]["train"]["documents"] + m["totals"]["eval"]["documents"]
  assert docs == 12 + 2 + 6 + 2
  c.data.bad_data = "error"
  with pytest.raises(badinput.BadDataError, match=r"non_utf8.*b_latin1.txt at byte 20"):
    preprocess.preprocess(c, str(tmp_path / "o2"), workers=1, progress=False)


def test_corrupt_shard_skipped_or_named(spm_path, tmp_path):
  out = tmp_path / "s"
  c = _config(spm_path, _text_corpus(tmp_path, 60), packing="documents", eval_fraction=0.0)
  m = preprocess.preprocess(c, str(out), workers=1, docs_per_shard=20, progress=False)
  victim = out / m["shards"]["train"][1]["file"]
  victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])  # truncated
  ac = _ar_config(c, str(out))
  p = pipeline_lib.make_pipeline(ac, None, process_index=0, process_count=1)
  assert p.stats["bad_data"] == {"corrupt_shard": 1}
  assert p.stats["train_rows"] == m["totals"]["train"]["rows"] - m["shards"]["train"][1]["rows"]
  ac.data.bad_data = "error"
  with pytest.raises(badinput.BadDataError, match=f"corrupt_shard.*{victim.name}"):
    pipeline_lib.make_pipeline(ac, None, process_index=0, process_count=1)


def _shard_with_a_bad_record(spm, path, bad_at=2, n=5):
  """A shard of `n` document rows whose record `bad_at` is not a row record; -> the rows."""
  from array_record.python.array_record_module import ArrayRecordWriter
  from launch.data import packing, tokenized
  tok = tokenized.tokenize_documents(spm, _docs(n), "document")
  rows = packing.pack_documents(tok, spm, 16)
  good = [rows(i) for i in range(n)]
  w = ArrayRecordWriter(str(path), "group_size:1")
  for i, row in enumerate(good):
    w.write(b"\x07garbage" if i == bad_at else arrayrecord.encode_row(row, "uint16"))
  w.close()
  return good


def test_corrupt_record_is_replaced_by_a_readable_row_never_padding(spm, tmp_path):
  dec = arrayrecord.RowDecoder(16, "uint16", spm.vocab_size, spm.cls_id, spm.sep_id,
                               spm.pad_id, spm.word_start, None)
  shard = tmp_path / "train-00000.arrayrecord"
  good = _shard_with_a_bad_record(spm, shard)
  rows = arrayrecord.ShardRows([str(shard)], [5], dec, "skip")
  row = rows(2)  # record 2 is corrupt: the next readable row (3) is served
  assert row["segment_ids"].any() and not row["special_tokens_mask"].all()
  np.testing.assert_array_equal(row["input_ids"], good[3]["input_ids"])
  np.testing.assert_array_equal(rows(4)["input_ids"], good[4]["input_ids"])
  assert rows.bad_counts() == {"corrupt_record": 1}
  with pytest.raises(badinput.BadDataError, match="train-00000.arrayrecord record 2"):
    arrayrecord.ShardRows([str(shard)], [5], dec, "error")(2)

  class Broken(arrayrecord.ShardRows):
    def _reader(self, s):
      raise OSError("checksum mismatch")

  with pytest.raises(badinput.BadDataError, match="no readable record"):
    Broken([str(shard)], [5], dec, "skip")(2)


@pytest.mark.slow  # builds a TFDS dataset: over a minute under load
def test_tfds_source_is_preprocessed(spm_path, tmp_path):
  name = build_tiny_tfds(str(tmp_path / "tfds"))
  c = make_config(tokenizer_kind="sentencepiece", tokenizer_path=spm_path, source="tfds",
                  tfds_name=name, tfds_data_dir=str(tmp_path / "tfds"),
                  eval_split="validation", max_documents=-1, packing="documents")
  m = preprocess.preprocess(c, str(tmp_path / "o"), workers=1, progress=False)
  assert m["totals"]["train"]["documents"] == 30 and m["totals"]["eval"]["documents"] == 4
  p = pipeline_lib.make_pipeline(_ar_config(c, str(tmp_path / "o")), None, process_index=0,
                                 process_count=1)
  assert "tiny set" in p.tokenizer.decode(next(p.train_iter())["input_ids"].ravel())
  assert p.eval_batches(1)


def test_preprocess_never_starts_a_jax_backend(tmp_path):
  """launch.preprocess is a host-only job: on a TPU VM a JAX backend would claim the chips
  a training job may hold. A platform name JAX does not know fails any backend start, so
  this run (which trains its sentencepiece tokenizer: the path that asked JAX for the
  process index) proves none starts."""
  out = tmp_path / "out"
  env = dict(os.environ, JAX_PLATFORMS="no_such_platform")
  p = subprocess.run([sys.executable, "-m", "launch.preprocess", "--config",
                      "configs/bert.py:tiny-mlm", "--config.data.source=text",
                      f"--config.data.files={_text_corpus(tmp_path)}",
                      "--config.tokenizer.vocab_size=32", "--out", str(out), "--workers",
                      "1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stdout + p.stderr[-3000:]
  assert (out / "manifest.json").is_file() and (out / "tokenizer" / "spm.model").is_file()
