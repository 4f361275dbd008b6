"""Issue 46, the pretraining data side: bad input never trains silently, an empty held-out
split is an error, launch.preprocess never writes into a user's directory, and training
on ArrayRecord shards works end to end (preprocess, train, stop, resume bit for bit, eval).

Each test names the probe case it covers (docs/reliability.md lists them)."""
import gzip
import json
import os

import numpy as np
import pytest

from launch import data
from launch import preprocess
from launch.data import arrayrecord
from launch.data import badinput
from launch.data import pipeline as pipeline_lib
from launch.data import sources
from tests.launch.data_helpers import make_config, spm, spm_config, spm_path  # noqa: F401

WORDS = ["alpha", "beta", "gamma", "delta", "the", "cat", "sat", "on", "mat", "runs.",
         "river", "stone", "light", "paper", "window", "north"]


def _docs(n, words=40, seed=0):
  rng = np.random.default_rng(seed)
  return ["\n".join(" ".join(rng.choice(WORDS, words // 4)) for _ in range(4))
          for _ in range(n)]


def _good_file(d, n=20, name="good.txt", seed=0):
  (d / name).write_text("\n\n".join(_docs(n, seed=seed)))
  return d / name


def _text_config(spm_path, files, **kw):
  return spm_config(spm_path, source="text", files=str(files), **kw)


def _pipeline(c, workdir=None):
  return data.make_pipeline(c, workdir, process_index=0, process_count=1)


# ------------------------------------------------------------------ undecodable bytes


def test_non_utf8_text_is_skipped_and_counted_never_decoded_as_replacement(spm_path,
                                                                          tmp_path):
  _good_file(tmp_path)
  (tmp_path / "latin1.txt").write_bytes(b"fine text here.\n\ncaf\xe9 au lait\n\nmore text.")
  c = _text_config(spm_path, tmp_path / "*.txt", eval_fraction=0.1)
  train, held_out = data.load_documents(c.data)
  assert len(train) + len(held_out) == 22
  assert not any("\ufffd" in d or "caf" in d for d in train + held_out)
  p = _pipeline(c)
  assert p.stats["bad_data"] == {"non_utf8": 1}
  json.dumps(p.stats)  # JSON-serializable (the run summary and metrics hold it)


def test_non_utf8_under_error_names_the_file_and_the_byte(spm_path, tmp_path):
  _good_file(tmp_path)
  (tmp_path / "latin1.txt").write_bytes(b"fine text here.\n\ncaf\xe9 au lait\n\nmore text.")
  c = _text_config(spm_path, tmp_path / "*.txt", bad_data="error")
  with pytest.raises(badinput.BadDataError, match=r"non_utf8.*latin1\.txt at byte 20"):
    _pipeline(c)


def test_byte_offsets_are_exact_in_crlf_files(tmp_path):
  (tmp_path / "crlf.txt").write_bytes(b"one line.\r\ntwo.\r\n\r\nbad \xff here.")
  bad = badinput.BadData("error")
  with pytest.raises(badinput.BadDataError, match=r"crlf\.txt at byte 23"):
    list(badinput.stream_text_file(str(tmp_path / "crlf.txt"), "blank_line", "text", bad))
  docs = list(badinput.stream_text_file(str(tmp_path / "crlf.txt"), "blank_line", "text",
                                        badinput.BadData("skip")))
  assert docs == [(0, "one line.\ntwo.")]


def test_utf16_file_bom_and_non_string_json_fields(tmp_path):
  (tmp_path / "u16.txt").write_bytes("some text".encode("utf-16"))
  (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfa document.\n\nbad \xff")
  (tmp_path / "n.jsonl").write_text('{"text": 12}\n{"text": ["a", "b"]}\n{"text": "ok."}\n')
  bad = badinput.BadData()
  docs = {p.name: list(badinput.stream_text_file(str(p), "blank_line", "text", bad))
          for p in sorted(tmp_path.iterdir())}
  assert docs == {"bom.txt": [(3, "a document.")], "n.jsonl": [(34, "ok.")], "u16.txt": []}
  assert bad.nonzero() == {"non_utf8": 2, "bad_json": 2}
  with pytest.raises(badinput.BadDataError, match=r"u16\.txt at byte 0.*UTF-16"):
    list(badinput.stream_text_file(str(tmp_path / "u16.txt"), "blank_line", "text",
                                   badinput.BadData("error")))
  with pytest.raises(badinput.BadDataError, match=r"bom\.txt at byte 20"):
    list(badinput.stream_text_file(str(tmp_path / "bom.txt"), "blank_line", "text",
                                   badinput.BadData("error")))
  with pytest.raises(badinput.BadDataError, match=r"n\.jsonl line 1.*JSON int, not a string"):
    list(badinput.stream_text_file(str(tmp_path / "n.jsonl"), "blank_line", "text",
                                   badinput.BadData("error")))


# ----------------------------------------------------------------------------- binary


def _binary_files(d):
  (d / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 8)
  (d / "controls.txt").write_bytes(b"\x01\x02\x03\x1b[0m data \x1c\x1d\x1e" * 300)
  (d / "nul.jsonl").write_text(json.dumps({"text": "a \u0000 hidden NUL"}) + "\n"
                               + json.dumps({"text": "a fine json document."}) + "\n")


def test_binary_files_are_skipped_and_counted(spm_path, tmp_path):
  _good_file(tmp_path)
  _binary_files(tmp_path)
  c = _text_config(spm_path, f"{tmp_path}/*.txt,{tmp_path}/*.jsonl", eval_fraction=0.1)
  p = _pipeline(c)
  assert p.stats["bad_data"] == {"binary": 3}
  assert p.stats["train_documents"] + p.stats["eval_documents"] == 21


def test_binary_file_under_error_is_named(spm_path, tmp_path):
  _good_file(tmp_path)
  _binary_files(tmp_path)
  c = _text_config(spm_path, tmp_path / "image.txt", bad_data="error")
  with pytest.raises(badinput.BadDataError, match=r"binary.*image\.txt.*NUL byte at byte 8"):
    data.load_documents(c.data)
  c.data.files = str(tmp_path / "controls.txt")
  with pytest.raises(badinput.BadDataError, match=r"controls\.txt.*printable"):
    data.load_documents(c.data)


def test_text_in_another_encoding_is_non_utf8_not_binary():
  assert badinput.binary_reason("Größe und Maß, déjà vu.".encode("latin-1"), 0.9) is None
  assert badinput.binary_reason("机器学习的文本".encode("gbk"), 0.9) is None
  assert "NUL" in badinput.binary_reason(b"abc\x00def", 0.9)
  assert badinput.binary_reason(b"tabs\tand\r\nnewlines\f", 0.9) is None


# -------------------------------------------------------------------------- too long


def test_over_long_document_is_counted(spm_path, tmp_path):
  _good_file(tmp_path)
  (tmp_path / "huge.txt").write_bytes(b"short doc.\n\n" + b"x" * 5000 + b"\n\nend doc.")
  c = _text_config(spm_path, tmp_path / "*.txt", eval_fraction=0.1, max_document_bytes=2000)
  p = _pipeline(c)
  assert p.stats["bad_data"] == {"too_long": 1}
  c.data.bad_data = "error"
  with pytest.raises(badinput.BadDataError, match=r"too_long.*huge\.txt at byte 12.*5000"):
    _pipeline(c)


def test_over_long_line_emptying_the_held_out_split_is_an_error(spm_path, tmp_path):
  """The probe: one huge line beside a small document left no held-out document, and the
  run trained without evaluation and without a word."""
  (tmp_path / "one.txt").write_bytes(b"the only short document here.\n\n" + b"y" * 5000)
  c = _text_config(spm_path, tmp_path / "one.txt", max_document_bytes=2000, global_batch=1)
  with pytest.raises(ValueError, match=r"held-out split is empty: data\.eval_fraction=0\.02 "
                                       r"of 1 usable documents held out 0.*1 too_long"):
    _pipeline(c)
  c.train.eval_batches = 0  # no evaluation asked for: fine
  p = _pipeline(c)
  assert p.num_eval_rows == 0 and p.stats["bad_data"] == {"too_long": 1}


def test_empty_held_out_split_from_a_named_eval_split_is_an_error(spm_path, tmp_path):
  _good_file(tmp_path)
  (tmp_path / "eval.bin").write_bytes(bytes(range(256)))
  c = _text_config(spm_path, tmp_path / "good.txt", eval_split=str(tmp_path / "eval.bin"))
  with pytest.raises(ValueError, match=r"held-out split is empty: data\.eval_split=.*1 binary"):
    _pipeline(c)


def test_no_held_out_split_asked_for_is_allowed(spm_path, tmp_path):
  _good_file(tmp_path)
  c = _text_config(spm_path, tmp_path / "good.txt", eval_fraction=0.0)
  assert _pipeline(c).eval_batches(4) == []


def test_default_corpus_too_small_for_a_held_out_split_is_an_error(spm_path):
  c = spm_config(spm_path, max_documents=1, global_batch=1)
  with pytest.raises(ValueError, match=r"held-out split is empty: data\.eval_fraction=0\.02 "
                                       r"of 1 usable documents"):
    _pipeline(c)


def test_eval_split_that_is_training_data_is_an_error(spm_path, tmp_path):
  _good_file(tmp_path)
  c = _text_config(spm_path, tmp_path / "*.txt", eval_split=str(tmp_path / "good.txt"))
  with pytest.raises(ValueError, match=r"share 1 file.*good\.txt.*would be trained on"):
    pipeline_lib.validate(c)
  c = spm_config(spm_path, source="tfds", tfds_name="x", eval_split="train")
  with pytest.raises(ValueError, match=r"data\.eval_split='train' is data\.train_split"):
    pipeline_lib.validate(c)


def test_duplicated_documents_never_straddle_the_held_out_split():
  docs = _docs(40) + ["the same boilerplate page."] * 30
  train, held_out = data.random_holdout(docs, 0.3)
  assert held_out and not set(train) & set(held_out)
  assert "the same boilerplate page." in train


def test_named_eval_split_copies_of_training_documents_are_dropped(spm_path, tmp_path):
  docs = _docs(20)
  (tmp_path / "train.txt").write_text("\n\n".join(docs))
  (tmp_path / "eval.txt").write_text("\n\n".join(docs[:3] + ["a document only here."]))
  c = _text_config(spm_path, tmp_path / "train.txt", eval_split=str(tmp_path / "eval.txt"))
  train, held_out = data.load_documents(c.data)
  assert held_out == ["a document only here."] and len(train) == 20
  streamed = list(preprocess.stream_documents(c.data, badinput.BadData()))
  assert [t for s, _, t in streamed if s == "eval"] == ["a document only here."]
  assert [t for s, _, t in streamed if s == "train"] == train


# ----------------------------------------------------------------------- empty input


def test_empty_input_is_an_error_naming_the_file(spm_path, tmp_path):
  (tmp_path / "empty.txt").write_bytes(b"")
  c = _text_config(spm_path, tmp_path / "empty.txt")
  with pytest.raises(ValueError, match=r"no usable document in .*empty\.txt \(1 empty"):
    data.load_documents(c.data)
  (tmp_path / "blank.txt").write_bytes(b"\n \n\t\n")
  c.data.files = str(tmp_path / "blank.txt")
  with pytest.raises(ValueError, match=r"blank\.txt"):
    data.load_documents(c.data)


def test_all_bad_input_is_an_error_even_under_skip(spm_path, tmp_path):
  (tmp_path / "a.bin").write_bytes(bytes(range(256)) * 4)
  (tmp_path / "b.txt").write_bytes(b"caf\xe9 latin\n\nmore \xe0 bad")
  c = _text_config(spm_path, f"{tmp_path}/a.bin,{tmp_path}/b.txt")
  with pytest.raises(ValueError, match=r"a\.bin, .*b\.txt \(2 non_utf8, 1 binary"):
    _pipeline(c)


def test_empty_file_among_good_ones_is_counted_or_named(spm_path, tmp_path):
  _good_file(tmp_path)
  (tmp_path / "zero.txt").write_bytes(b"")
  c = _text_config(spm_path, tmp_path / "*.txt", eval_fraction=0.1)
  assert _pipeline(c).stats["bad_data"] == {"empty": 1}
  c.data.bad_data = "error"
  with pytest.raises(badinput.BadDataError, match=r"empty.*zero\.txt"):
    data.load_documents(c.data)


def test_corrupt_gzip_file_is_counted_or_named(spm_path, tmp_path):
  _good_file(tmp_path)
  (tmp_path / "ok.txt.gz").write_bytes(gzip.compress(b"a compressed document."))
  (tmp_path / "torn.txt.gz").write_bytes(gzip.compress(b"x" * 1000)[:20])
  c = _text_config(spm_path, f"{tmp_path}/*.txt,{tmp_path}/*.gz", eval_fraction=0.1)
  train, held_out = data.load_documents(c.data)
  assert "a compressed document." in train + held_out
  bad = badinput.BadData()
  data.load_documents(c.data, bad)
  assert bad.nonzero() == {"corrupt_file": 1}
  c.data.bad_data = "error"
  with pytest.raises(badinput.BadDataError, match=r"corrupt_file.*torn\.txt\.gz"):
    data.load_documents(c.data)


# ------------------------------------------------------------------------------ TFDS


class _FakeTfdsSource:
  """What `tfds.data_source` returns, with bad records; record 5 cannot be read."""

  def __init__(self, records):
    self.records = records

  def __len__(self):
    return len(self.records)

  def __getitem__(self, i):
    if self.records[i] is None:
      raise OSError(f"Checksum mismatch reading record {i}")
    return self.records[i]

  def __getitems__(self, idx):
    return [self[i] for i in idx]


def _fake_tfds(monkeypatch, max_bytes=2000):
  records = [{"text": t.encode()} for t in _docs(30)]
  records[1] = {"text": b"caf\xe9 au lait"}
  records[2] = {"text": b"PK\x03\x04\x00\x00binary"}
  records[3] = {"text": b"   "}
  records[4] = {"text": b"z" * (max_bytes + 1)}
  records[5] = None
  monkeypatch.setattr(sources, "_tfds_source",
                      lambda name, split_name, data_dir: _FakeTfdsSource(records))


def test_tfds_bad_records_are_counted_or_named(spm_path, monkeypatch):
  _fake_tfds(monkeypatch)
  c = spm_config(spm_path, source="tfds", tfds_name="fake", max_documents=-1,
                 max_document_bytes=2000, eval_fraction=0.1)
  bad = badinput.BadData.from_config(c.data)
  train, held_out = data.load_documents(c.data, bad)
  assert len(train) + len(held_out) == 25
  assert bad.nonzero() == {"non_utf8": 1, "binary": 1, "empty": 1, "too_long": 1,
                           "corrupt_record": 1}
  assert _pipeline(c).stats["bad_data"] == bad.nonzero()
  # launch.preprocess reads TFDS through the same reader.
  streamed = badinput.BadData.from_config(c.data)
  assert len(list(preprocess.stream_documents(c.data, streamed))) == 25
  assert streamed.nonzero() == bad.nonzero()
  c.data.bad_data = "error"
  with pytest.raises(badinput.BadDataError, match=r"non_utf8.*TFDS fake/train record 1"):
    data.load_documents(c.data)


# -------------------------------------------------------------------- start-up checks


@pytest.mark.parametrize("overrides, message", [
    ({"bad_data": "sometimes"}, "data.bad_data='sometimes'"),
    ({"max_document_bytes": 0}, "data.max_document_bytes=0"),
    ({"min_printable_ratio": 1.5}, "data.min_printable_ratio=1.5"),
    ({"max_documents": 0}, "data.max_documents=0"),
    ({"source": "arrayrecord", "path": ""}, "needs --config.data.path"),
    ({"source": "arrayrecord", "path": "/nonexistent/shards"}, "does not exist"),
    ({"source": "arrayrecord", "path": "gs://bucket/shards"}, "gcsfuse"),
])
def test_bad_data_settings_fail_at_start_up(overrides, message):
  with pytest.raises(ValueError, match=message):
    pipeline_lib.validate(make_config(**overrides))


def test_shard_path_without_manifest_fails_the_start_up_checks(tmp_path):
  from launch.cli import ConfigError
  from launch.trainer import checks
  (tmp_path / "notes.txt").write_text("not shards")
  c = make_config(source="arrayrecord", path=str(tmp_path))
  with pytest.raises(ValueError, match=r"no manifest\.json there"):
    pipeline_lib.validate(c)
  with pytest.raises(ConfigError, match=r"^data\.path=.*no manifest\.json there[^\n]*$"):
    checks.check(c)


def test_stats_and_counts_survive_the_token_cache(spm_path, tmp_path):
  _good_file(tmp_path)
  (tmp_path / "latin1.txt").write_bytes(b"caf\xe9")
  c = _text_config(spm_path, tmp_path / "*.txt", eval_fraction=0.1)
  wd = str(tmp_path / "wd")
  first = _pipeline(c, wd)
  again = _pipeline(c, wd)
  assert not first.stats["cached"] and again.stats["cached"]
  assert first.stats["bad_data"] == again.stats["bad_data"] == {"non_utf8": 1}
  assert json.loads(json.dumps(again.stats)) == again.stats
  c.data.bad_data = "error"  # another policy is another cache entry: it is read again
  with pytest.raises(badinput.BadDataError):
    _pipeline(c, wd)


# ---------------------------------------------------------------- preprocess --out


def _pre_config(spm_path, files, **kw):
  kw.setdefault("eval_fraction", 0.1)
  return _text_config(spm_path, files, packing="documents", **kw)


def _ar_config(c, out, **kw):
  return make_config(tokenizer_kind=c.tokenizer.kind, tokenizer_path=c.tokenizer.path,
                     source="arrayrecord", path=str(out), seq_len=c.data.seq_len,
                     packing=c.data.packing, **kw)


def test_preprocess_refuses_a_users_non_empty_directory(spm_path, tmp_path):
  from encoders import outdir
  corpus = _good_file(tmp_path, 40)
  c = _pre_config(spm_path, corpus)
  mine = tmp_path / "my_results"
  mine.mkdir()
  (mine / "thesis.tex").write_text("years of work")
  with pytest.raises(outdir.OutputDirError, match=r"my_results is a non-empty directory"):
    preprocess.preprocess(c, str(mine), workers=1, progress=False)
  assert os.listdir(mine) == ["thesis.tex"]  # nothing written, nothing deleted
  with pytest.raises(outdir.OutputDirError, match="not a directory"):
    preprocess.preprocess(c, str(mine / "thesis.tex"), workers=1, progress=False)
  assert (mine / "thesis.tex").read_text() == "years of work"
  run = tmp_path / "run"  # another tool's output (a training work directory)
  run.mkdir()
  outdir.write_marker(str(run), "launch.pretrain")
  (run / "metrics.jsonl").write_text("{}")
  with pytest.raises(outdir.OutputDirError, match="holds the output of launch.pretrain"):
    preprocess.preprocess(c, str(run), workers=1, progress=False)
  assert sorted(os.listdir(run)) == [outdir.MARKER, "metrics.jsonl"]


def test_preprocess_command_line_refusal_is_one_line(spm_path, tmp_path):
  import subprocess
  import sys
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "keep.txt").write_text("mine")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  p = subprocess.run([sys.executable, "-m", "launch.preprocess", "--config",
                      "configs/bert.py:tiny-mlm", "--out", str(mine), "--workers", "1"],
                     cwd=root, capture_output=True, text=True, timeout=300)
  assert p.returncode == 1
  assert p.stderr.strip().splitlines()[-1].startswith("error: launch.preprocess --out ")
  assert "Traceback" not in p.stderr and os.listdir(mine) == ["keep.txt"]


def test_preprocess_resumes_its_own_output_and_an_earlier_versions(spm_path, tmp_path):
  from encoders import outdir
  c = _pre_config(spm_path, _good_file(tmp_path, 40))
  out = tmp_path / "shards"
  m = preprocess.preprocess(c, str(out), workers=1, docs_per_shard=10, progress=False)
  assert outdir.is_ours(str(out))
  mtimes = {f: os.stat(out / f).st_mtime_ns for f in os.listdir(out)
            if f.endswith(".arrayrecord")}
  os.remove(out / outdir.MARKER)  # as an earlier version (no marker) left it
  again = preprocess.preprocess(c, str(out), workers=1, docs_per_shard=10, progress=False)
  assert again["shards"] == m["shards"] and outdir.is_ours(str(out))
  assert mtimes == {f: os.stat(out / f).st_mtime_ns for f in mtimes}  # reused, not rewritten


def test_preprocess_with_an_empty_held_out_split_is_an_error(spm_path, tmp_path):
  c = _pre_config(spm_path, _good_file(tmp_path, 30), eval_fraction=1e-9)
  with pytest.raises(ValueError, match=r"held-out split is empty: 0 of 30 documents"):
    preprocess.preprocess(c, str(tmp_path / "o"), workers=1, progress=False)
  assert not (tmp_path / "o" / "manifest.json").exists()
  c.train.eval_batches = 0
  m = preprocess.preprocess(c, str(tmp_path / "o"), workers=1, progress=False)
  assert m["totals"]["eval"]["rows"] == 0 and m["held_out"]["eval_fraction"] == 1e-9


def test_preprocess_of_all_bad_input_names_the_files(spm_path, tmp_path):
  (tmp_path / "x.bin").write_bytes(bytes(range(256)) * 4)
  c = _pre_config(spm_path, tmp_path / "x.bin")
  with pytest.raises(ValueError, match=r"no usable document in .*x\.bin \(1 binary"):
    preprocess.preprocess(c, str(tmp_path / "o"), workers=1, progress=False)


# ------------------------------------------------------------ shards: held out, corrupt


def test_shards_hold_a_disjoint_held_out_split_and_evaluate_on_it(spm_path, tmp_path):
  c = _pre_config(spm_path, _good_file(tmp_path, 60))
  out = tmp_path / "s"
  m = preprocess.preprocess(c, str(out), workers=1, docs_per_shard=20, progress=False)
  assert m["held_out"]["rule"].startswith("sha256") and m["totals"]["eval"]["rows"] > 0
  p = _pipeline(_ar_config(c, out))
  train_rows = {p._train_rows(i)["input_ids"].tobytes() for i in range(len(p._train_rows))}
  eval_rows = [p._eval_rows(i)["input_ids"].tobytes() for i in range(len(p._eval_rows))]
  assert eval_rows and not train_rows & set(eval_rows)
  batches = p.eval_batches(100)
  real = sum(int(b["segment_ids"][r].any()) for b in batches for r in range(p.batch_size))
  assert real == len(eval_rows)


def test_shards_carry_the_preprocessing_bad_input_counts_into_the_run(spm_path, tmp_path):
  _good_file(tmp_path, 40)
  (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 au lait")
  (tmp_path / "x.bin").write_bytes(bytes(range(256)))
  c = _pre_config(spm_path, f"{tmp_path}/*.txt,{tmp_path}/x.bin")
  out = tmp_path / "s"
  m = preprocess.preprocess(c, str(out), workers=1, progress=False)
  assert {k: v for k, v in m["bad_data"].items() if v} == {"non_utf8": 1, "binary": 1}
  p = _pipeline(_ar_config(c, out))
  assert p.stats["preprocess_bad_data"] == {"non_utf8": 1, "binary": 1}
  assert p.stats["bad_data"] == {} and json.loads(json.dumps(p.stats)) == p.stats


def test_shards_whose_held_out_rows_are_unreadable_stop_at_start_up(spm_path, tmp_path):
  c = _pre_config(spm_path, _good_file(tmp_path, 60))
  out = tmp_path / "s"
  m = preprocess.preprocess(c, str(out), workers=1, docs_per_shard=100, progress=False)
  victim = out / m["shards"]["eval"][0]["file"]
  victim.write_bytes(victim.read_bytes()[:victim.stat().st_size // 2])
  ac = _ar_config(c, out)
  with pytest.raises(ValueError, match=r"held-out split is empty: data\.path=.* 0 readable "
                                       r"held-out rows.*1 corrupt_shard"):
    _pipeline(ac)
  ac.train.eval_batches = 0
  assert _pipeline(ac).stats["bad_data"] == {"corrupt_shard": 1}


def test_corrupt_record_in_training_shards_is_never_a_padding_row(spm_path, tmp_path):
  """A record that does not decode, inside real preprocessed shards: the batches hold no
  padding row, the count is reported, and "error" names the shard and record."""
  from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter
  c = _pre_config(spm_path, _good_file(tmp_path, 60), eval_fraction=0.0)
  out = tmp_path / "s"
  m = preprocess.preprocess(c, str(out), workers=1, docs_per_shard=100, progress=False)
  shard = out / m["shards"]["train"][0]["file"]
  reader = ArrayRecordReader(str(shard))
  records = reader.read_all()
  reader.close()
  records[3] = records[3][:-1]  # a torn record: the decoder refuses it
  writer = ArrayRecordWriter(str(shard), "group_size:64")
  for r in records:
    writer.write(r)
  writer.close()
  ac = _ar_config(c, out, global_batch=1, num_epochs=1)
  p = _pipeline(ac)
  batches = list(p.train_iter())  # one epoch: every row read once
  assert len(batches) == len(records)
  assert all(b["segment_ids"].any() for b in batches)  # no padding row among them
  assert p.bad_data() == {"corrupt_record": 1}
  ac.data.bad_data = "error"
  with pytest.raises(badinput.BadDataError, match=rf"{shard.name} record 3"):
    list(_pipeline(ac).train_iter())


# ------------------------------------------------------------- shards: end to end


def _small_model(c):
  c.model.num_hidden_layers = 1
  c.model.hidden_size = 32
  c.model.num_attention_heads = 2
  c.model.intermediate_size = 64
  c.train.steps = 6
  c.train.log_every = 1
  c.train.eval_every = 3
  c.train.eval_batches = 2
  c.optimizer.warmup_steps = 1
  c.checkpoint.every = 100
  c.mesh.shape = (1, 1, 1)
  c.logging.plot = False
  return c


@pytest.mark.slow  # three short training runs (compiles): about a minute under load
def test_arrayrecord_training_end_to_end_resumes_bitwise(tmp_path):
  """configs/bert.py:tiny-mlm: launch.preprocess writes shards (its own tokenizer), the
  trainer runs on them, stops at step 3 (a preemption), resumes, and ends bit for bit
  where an uninterrupted run ends, with the held-out evaluation on the eval shards."""
  import jax
  from safetensors.numpy import load_file
  from configs import bert
  from launch import trainer
  from launch.trainer import metrics as metrics_lib
  c = bert.get_config("tiny-mlm").unlock()
  c.tokenizer.vocab_size, c.tokenizer.train_sentences = 500, 10_000
  c.data.max_documents, c.data.seq_len, c.data.global_batch = 80, 32, 8
  c.data.eval_fraction = 0.1
  out = str(tmp_path / "shards")
  m = preprocess.preprocess(c, out, workers=1, progress=False)
  assert m["totals"]["eval"]["rows"] > 0
  c = _small_model(c)
  c.data.source, c.data.path = "arrayrecord", out
  devices = jax.devices()[:1]
  full, split = str(tmp_path / "full"), str(tmp_path / "split")
  trainer.train_and_evaluate(c, full, devices)
  assert trainer.train_and_evaluate(c, split, devices, stop_after=3)["step"] == 3
  assert not os.path.exists(os.path.join(split, "hf"))
  trainer.train_and_evaluate(c, split, devices)

  def records(wd, kind):
    return [r for r in metrics_lib.read(wd) if r.get("split") == kind]

  a, b = records(full, "train"), records(split, "train")
  assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 7))
  assert [r["mlm_loss"] for r in a] == [r["mlm_loss"] for r in b]  # bitwise
  ea, eb = records(full, "eval"), records(split, "eval")
  assert [r["step"] for r in ea] == [r["step"] for r in eb] == [3, 6]
  assert [(r["mlm_loss"], r["mlm_accuracy"]) for r in ea] == [
      (r["mlm_loss"], r["mlm_accuracy"]) for r in eb]
  run = records(full, "run")[0]
  assert run["data"]["source"] == "arrayrecord" and run["data"]["eval_rows"] > 0
  wa, wb = load_file(os.path.join(full, "hf", "model.safetensors")), load_file(
      os.path.join(split, "hf", "model.safetensors"))
  assert wa.keys() == wb.keys()
  for k in wa:
    np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)


# ------------------------------------------------------------- a real TFDS dataset


def _bad_tfds(data_dir):
  """A TFDS dataset (array_record files) whose train split holds 30 good documents, one
  non-UTF-8, one with a NUL byte, one empty, and one record whose bytes are damaged on
  disk (a Riegeli chunk hash mismatch on read)."""
  import glob
  import tensorflow_datasets as tfds

  class ZooBadText(tfds.core.GeneratorBasedBuilder):
    __module__ = "zoo_bad_text"  # no package resources to look up (see test_data.py)
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
          {"text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      rows = [d.encode() for d in _docs(30)] + [b"caf\xe9 au lait", b"x\x00y", b"",
                                                 b"DAMAGED-RECORD " * 4]
      for i, r in enumerate(rows):
        yield i, {"text": r}

  builder = ZooBadText(data_dir=data_dir, file_format="array_record")
  builder.download_and_prepare()
  (shard,) = glob.glob(f"{data_dir}/{builder.name}/1.0.0/*.array_record*")
  raw = bytearray(open(shard, "rb").read())
  at = raw.find(b"DAMAGED-RECORD")
  assert at > 0
  raw[at + 3] ^= 0xFF
  with open(shard, "wb") as f:
    f.write(raw)
  return builder.name


def test_real_tfds_bad_records_are_counted_or_named(spm_path, tmp_path):
  name = _bad_tfds(str(tmp_path))
  c = spm_config(spm_path, source="tfds", tfds_name=name, tfds_data_dir=str(tmp_path),
                 max_documents=-1, eval_fraction=0.1)
  bad = badinput.BadData()
  train, held_out = data.load_documents(c.data, bad)
  assert len(train) + len(held_out) == 30
  assert not any("\ufffd" in d or "\x00" in d for d in train + held_out)
  assert bad.nonzero() == {"non_utf8": 1, "binary": 1, "empty": 1, "corrupt_record": 1}
  c.data.bad_data = "error"
  with pytest.raises(badinput.BadDataError, match=rf"TFDS {name}/train record \d+"):
    data.load_documents(c.data)
