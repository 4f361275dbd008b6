"""Issue 46, fine-tuning: labels are explicit, bad rows follow data.bad_data with their
file and line, the config is checked before any data, a stop mid-epoch resumes to the
same result, and nothing a user owns in the work directory is deleted."""
import json
import os
import re
import signal

import numpy as np
import pytest

from configs import finetune as finetune_configs
from encoders import outdir
from launch import cli
from launch import finetune
from launch.trainer import finetuning
from launch.data import badinput
from launch.data import finetune_data as fd
from launch.trainer import lock as lock_lib
from launch.trainer import loop
from tests.launch import finetune_helpers as fh


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
  return fh.tiny_bert_dir(str(tmp_path_factory.mktemp("bert") / "bert"))


def _config(task, bert, **overrides):
  c = finetune_configs.get_config(task).unlock()
  c.init_from = bert
  c.data.seq_len, c.data.global_batch = 24, 8
  c.optimizer.learning_rate = 3e-3
  for k, v in overrides.items():
    section, key = k.split("__") if "__" in k else ("finetune", k)
    c[section][key] = v
  return c


def _load(c, bad_data="skip"):
  c.data.bad_data = bad_data
  report = {}
  out = fd.load_data(c, fd.load_tokenizer(c.init_from), report=report)
  return out, report


def _csv(path, lines):
  path.write_text("text,label\n" + "".join(line + "\n" for line in lines))
  return str(path)


def _jsonl(path, records):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                          for r in records))
  return str(path)


GOOD = ["the movie was good,pos", "awful plot,neg", "great acting,pos", "poor movie,neg"]


# ---- labels -----------------------------------------------------------------------------

@pytest.mark.parametrize("values,want", [
    ([str(i) for i in range(11)], tuple(str(i) for i in range(11))),  # not "10" before "2"
    ([1, "1", 1.0, "1.0", " 1 ", 0, "0.0", 2], ("0", "1", "2")),  # one class per value
    ([0.5, "0.50", "-1", 3], ("-1", "0.5", "3")),
    (["b", 2, "a", 10, 1], ("1", "2", "10", "a", "b")),  # numbers first, numerically
    ([True, "true", False], ("false", "true")),
])
def test_label_names_are_canonical_and_numerically_ordered(values, want):
  assert fd.label_names(values) == want


@pytest.mark.parametrize("value", [None, "", "  ", float("nan"), float("inf"), [1], {"a": 1},
                                   "a\nb"])
def test_a_value_that_names_no_class_is_not_a_label(value):
  assert fd.canonical_label(value) is None


def test_given_labels_are_canonical_and_must_be_distinct():
  assert fd.label_names(["x"], given=(0, "1", 2.0)) == ("0", "1", "2")
  with pytest.raises(ValueError, match="more than once"):
    fd.label_names((), given=(1, "1.0"))


def test_mixed_numeric_labels_train_one_class_per_value(tmp_path, bert):
  rows = [{"text": "good movie", "label": v} for v in (1, "1", 1.0, "1.0") * 3] + \
         [{"text": "bad movie", "label": v} for v in (0, "0", 0.0) * 3] + \
         [{"text": "the plot", "label": v} for v in (10, "10", 2, "2.0") * 3]
  c = _config("sequence", bert, train_file=_jsonl(tmp_path / "t.jsonl", rows),
              eval_file=_jsonl(tmp_path / "e.jsonl", rows[:8]))
  (train, evals, info, labels), _ = _load(c)
  assert labels == ("0", "1", "2", "10")
  assert sorted(set(train["labels"].tolist())) == [0, 1, 2, 3]
  assert [r["label"] for r in info["rows"]] == ["1"] * 8


def test_the_label_set_comes_from_training_and_an_eval_only_label_is_an_error(tmp_path,
                                                                               bert):
  train = _csv(tmp_path / "train.csv", GOOD * 3)
  dev = _csv(tmp_path / "dev.csv", GOOD[:2] + ["fine movie,neutral", "bad,neg"])
  c = _config("sequence", bert, train_file=train, eval_file=dev)
  with pytest.raises(ValueError, match=r"dev\.csv:4: eval label 'neutral' is not among "
                     r"the training labels \['neg', 'pos'\]"):
    _load(c)
  c.finetune.unknown_eval_labels = "skip"
  (_, evals, info, labels), report = _load(c)
  assert labels == ("neg", "pos") and len(info["rows"]) == 3
  assert report["skipped_eval_rows"] == 1 and report["unknown_eval_labels"] == {"neutral": 1}
  c.finetune.labels = ("neg", "neutral", "pos")  # named: a class of its own, no skip
  (_, _, info, labels), report = _load(c)
  assert labels == ("neg", "neutral", "pos") and len(info["rows"]) == 4
  assert report["skipped_eval_rows"] == 0


def test_a_training_label_outside_the_given_labels_is_an_error(tmp_path, bert):
  c = _config("sequence", bert, train_file=_csv(tmp_path / "t.csv", GOOD * 3),
              labels=("neg", "positive"))
  with pytest.raises(ValueError, match=r"t\.csv:2: training label 'pos' is not among "
                     "finetune.labels"):
    _load(c)


def test_one_training_class_is_an_error(tmp_path, bert):
  c = _config("sequence", bert, train_file=_csv(tmp_path / "t.csv", ["good,pos"] * 8),
              eval_file=_csv(tmp_path / "e.csv", ["good,pos"]))
  with pytest.raises(ValueError, match="1 distinct label.*needs 2 or more"):
    _load(c)


def test_an_eval_tag_not_in_training_is_an_error_or_skipped(tmp_path, bert):
  train = fh.write_conll(tmp_path / "train.conll", [(["john", "visited"], ["B-PER", "O"])] * 4)
  dev = fh.write_conll(tmp_path / "dev.conll", [(["john"], ["B-PER"]),
                                                (["paris", "was"], ["B-LOC", "O"])])
  c = _config("token", bert, train_file=str(train), eval_file=str(dev))
  with pytest.raises(ValueError, match=r"dev\.conll:3: eval label 'B-LOC' is not among the "
                     "training labels"):
    _load(c)
  c.finetune.unknown_eval_labels = "skip"
  (_, _, info, labels), report = _load(c)
  assert labels == ("B-PER", "O") and len(info["rows"]) == 1
  assert report["unknown_eval_labels"] == {"B-LOC": 1}


@pytest.mark.parametrize("label", ["high", "nan", "", "1,5"])
def test_a_regression_label_that_is_not_a_number_is_an_error(tmp_path, bert, label):
  lines = ["good,0.5", "bad,-1", f"fine,\"{label}\"", "great,2"]
  c = _config("regression", bert, train_file=_csv(tmp_path / "t.csv", lines),
              eval_file=_csv(tmp_path / "e.csv", lines[:2]))
  with pytest.raises(ValueError, match=r"t\.csv:4: regression label .* is not a finite "
                     "number"):
    _load(c, bad_data="error")


def test_regression_labels_in_any_numeric_form_are_floats(tmp_path, bert):
  rows = [{"text": "good", "label": v} for v in (1, "2.5", 3.0, " -4 ", "1e1")] * 2
  c = _config("regression", bert, train_file=_jsonl(tmp_path / "t.jsonl", rows),
              eval_file=_jsonl(tmp_path / "e.jsonl", rows[:5]))
  (train, _, _, _), _ = _load(c)
  assert sorted(set(train["labels"].tolist())) == [-4.0, 1.0, 2.5, 3.0, 10.0]


# ---- bad rows ---------------------------------------------------------------------------

BAD_TABLES = {  # name -> (file name, contents (bytes), bad line, kind)
    "ragged_csv": ("t.csv", b"text,label\ngood,pos\nbad movie\nawful,neg\n", 3,
                   "corrupt_record"),
    "extra_field_csv": ("t.csv", b"text,label\ngood,pos\nbad,neg,extra\nawful,neg\n", 3,
                        "corrupt_record"),
    "ragged_tsv": ("t.tsv", b"text\tlabel\ngood\tpos\nbad movie\nawful\tneg\n", 3,
                   "corrupt_record"),
    "empty_label_csv": ("t.csv", b"text,label\ngood,pos\nbad movie,\nawful,neg\n", 3,
                        "corrupt_record"),
    "stray_quote_csv": ("t.csv", b"text,label\ngood,pos\n\"bad\" movie,neg\nawful,neg\n",
                        3, "corrupt_record"),
    "non_utf8_csv": ("t.csv", b"text,label\ngood,pos\nbad \xff\xfe movie,neg\nawful,neg\n",
                     3, "non_utf8"),
    "bad_json": ("t.jsonl", b'{"text": "good", "label": "pos"}\n{"text": "bad", \n'
                 b'{"text": "awful", "label": "neg"}\n', 2, "bad_json"),
    "no_label_json": ("t.jsonl", b'{"text": "good", "label": "pos"}\n{"text": "bad"}\n'
                      b'{"text": "awful", "label": "neg"}\n', 2, "bad_json"),
    "null_label_json": ("t.jsonl", b'{"text": "good", "label": "pos"}\n'
                        b'{"text": "bad", "label": null}\n{"text": "awful", "label": "neg"}\n',
                        2, "bad_json"),
    "list_label_json": ("t.jsonl", b'{"text": "good", "label": "pos"}\n'
                        b'{"text": "bad", "label": [1]}\n{"text": "awful", "label": "neg"}\n',
                        2, "corrupt_record"),
    "empty_text_json": ("t.jsonl", b'{"text": "good", "label": "pos"}\n'
                        b'{"text": " ", "label": "neg"}\n{"text": "awful", "label": "neg"}\n',
                        2, "empty"),
    "non_utf8_json": ("t.jsonl", b'{"text": "good", "label": "pos"}\n'
                      b'{"text": "b\xc3", "label": "neg"}\n{"text": "awful", "label": "neg"}\n',
                      2, "non_utf8"),
}


def _skip_or_error(policy, fn):
  bad = badinput.BadData(policy)
  if policy == "error":
    with pytest.raises(badinput.BadDataError) as e:
      fn(bad)
    return str(e.value), bad
  return fn(bad), bad


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
@pytest.mark.parametrize("policy", ["skip", "error"])
def test_a_bad_table_row_is_skipped_and_counted_or_stops_naming_file_and_line(
    tmp_path, case, policy):
  name, data, line, kind = BAD_TABLES[case]
  (tmp_path / name).write_bytes(data)
  path = str(tmp_path / name)

  def read(bad):
    rows = fd.read_table(path, bad=bad)
    return fd.class_labels(rows, rows[:1], bad=bad)[1]

  got, bad = _skip_or_error(policy, read)
  if policy == "error":
    assert f"({kind}) in {path}:{line}" in got and "data.bad_data='error'" in got
  else:
    assert [r["label"] for r in got] == ["pos", "neg"]  # the good rows, nothing invented
    assert bad.counts[kind] == 1 and bad.total == 1


def test_an_over_long_line_is_too_long(tmp_path):
  path = _csv(tmp_path / "t.csv", ["good,pos", "x" * 500 + ",neg", "bad,neg"])
  bad = badinput.BadData("skip", max_document_bytes=100)
  assert len(fd.read_table(path, bad=bad)) == 2 and bad.counts["too_long"] == 1


@pytest.mark.parametrize("policy", ["skip", "error"])
def test_a_conll_line_with_the_wrong_columns_drops_its_sentence(tmp_path, policy):
  path = tmp_path / "t.conll"
  path.write_text("john NNP B-PER\nran VB O\n\nmary B-PER\n\nparis NNP B-LOC\n")
  got, bad = _skip_or_error(policy, lambda b: fd.read_conll(str(path), bad=b))
  if policy == "error":
    assert f"(corrupt_record) in {path}:4" in got and "expected 3 columns" in got
  else:
    assert got == [(["john", "ran"], ["B-PER", "O"]), (["paris"], ["B-LOC"])]
    assert got[1].where == f"{path}:6" and bad.counts["corrupt_record"] == 1


def _squad(path, qas):
  ctx = "john visited paris ."
  path.write_text(json.dumps({"data": [{"paragraphs": [{"context": ctx, "qas": qas}]}]}))
  return str(path)


@pytest.mark.parametrize("broken,detail", [
    ({"id": "b", "question": "where ?", "answers": [{"text": "paris", "answer_start": 3}]},
     "is not at answer_start 3"),
    ({"id": "b", "answers": []}, "needs an 'id' and a 'question'"),
    ({"id": "b", "question": "where ?", "answers": [{"text": "paris"}]},
     "integer 'answer_start'"),
])
@pytest.mark.parametrize("policy", ["skip", "error"])
def test_a_bad_squad_question_is_skipped_or_named(tmp_path, broken, detail, policy):
  good = {"id": "a", "question": "where ?", "answers": [{"text": "paris",
                                                           "answer_start": 13}]}
  path = _squad(tmp_path / "q.json", [good, broken])
  got, bad = _skip_or_error(policy, lambda b: fd.read_squad(path, bad=b))
  if policy == "error":
    assert f"{path}: data[0].paragraphs[0].qas[1]" in got and detail in got
  else:
    assert [ex["id"] for ex in got] == ["a"] and bad.counts["corrupt_record"] == 1


def test_squad_that_does_not_parse_names_file_and_line(tmp_path):
  (tmp_path / "q.json").write_text('{"data": [\n  {"paragraphs": \n')
  with pytest.raises(ValueError, match=r"q\.json:3:1: not valid JSON"):
    fd.read_squad(str(tmp_path / "q.json"))


@pytest.mark.parametrize("name,data", [
    ("t.csv", b""), ("t.csv", b"text,label\n"), ("t.jsonl", b"\n\n"), ("t.conll", b"\n"),
    ("t.json", b'{"data": []}')])
def test_empty_input_is_a_one_line_error_naming_the_file(tmp_path, name, data):
  (tmp_path / name).write_bytes(data)
  path = str(tmp_path / name)
  read = {".csv": fd.read_table, ".jsonl": fd.read_table, ".conll": fd.read_conll,
          ".json": fd.read_squad}[os.path.splitext(name)[1]]
  with pytest.raises(ValueError, match=re.escape(f"{path}: no usable rows (the input is "
                                                 "empty)")):
    read(path)


def test_input_with_every_row_skipped_is_an_error_with_the_counts(tmp_path):
  path = _csv(tmp_path / "t.csv", ["a", "b", "c,d,e"])
  with pytest.raises(ValueError, match=r"t\.csv: no usable rows \(3 corrupt_record skipped"):
    fd.read_table(path, bad=badinput.BadData("skip"))


def test_the_skip_counts_reach_the_run_report(tmp_path, bert):
  lines = GOOD * 3 + ["ragged row", "x,y,z"]
  c = _config("sequence", bert, train_file=_csv(tmp_path / "t.csv", lines))
  (train, _, _, _), report = _load(c)
  assert report["bad_data"] == {"corrupt_record": 2} and report["skipped_bad_rows"] == 2
  assert len(train["labels"]) + round(12 * 0.2) == 12
  c.data.bad_data = "error"
  with pytest.raises(badinput.BadDataError, match=r"t\.csv:14"):
    _load(c, bad_data="error")


# ---- config validation ------------------------------------------------------------------

def test_the_config_is_checked_in_one_line_before_any_data_or_write(tmp_path, bert):
  c = _config("sequence", bert, train_file=str(tmp_path / "missing.csv"), epochs=0,
              eval_fraction=1.5, unknown_eval_labels="drop", labels=("a", "a"),
              data_format="conll")
  c.data.bad_data = "ignore"
  work = tmp_path / "run"
  with pytest.raises(cli.ConfigError) as e:
    finetune.run(c, str(work))
  msg = str(e.value)
  assert "\n" not in msg
  for part in ("data_format='conll' does not fit task 'sequence'", "missing.csv' does not "
               "exist", "eval_fraction=1.5", "epochs=0", "unknown_eval_labels='drop'",
               "more than once", "data.bad_data='ignore'"):
    assert part in msg, part
  assert not work.exists()


@pytest.mark.parametrize("task,key,value,match", [
    ("sequence", "max_train_rows", 0, "max_train_rows=0"),
    ("sequence", "labels", ("pos",), "2 or more labels"),
    ("regression", "labels", ("a", "b"), "is for classification"),
    ("qa", "stride", 12, "finetune.stride=12"),
    ("sequence", "length_buckets", "short", "length_buckets='short'"),
    ("sequence", "data__global_batch", 0, "data.global_batch=0"),
    ("sequence", "checkpoint__every", -1, "checkpoint.every=-1"),
])
def test_each_bad_setting_is_refused_up_front(tmp_path, bert, task, key, value, match):
  train = _csv(tmp_path / "t.csv", GOOD)
  c = _config(task, bert, train_file=train, **{key: value})
  with pytest.raises(cli.ConfigError, match=match):
    finetuning.validate(c)


# ---- the work directory -----------------------------------------------------------------

def test_a_users_non_empty_directory_is_refused_and_untouched(tmp_path, bert):
  c = _config("sequence", bert, train_file=_csv(tmp_path / "t.csv", GOOD * 3))
  user = tmp_path / "mine"
  user.mkdir()
  (user / "thesis.tex").write_text("precious")
  with pytest.raises(outdir.OutputDirError, match="did not write"):
    finetune.run(c, str(user))
  assert sorted(p.name for p in user.iterdir()) == ["thesis.tex"]
  assert (user / "thesis.tex").read_text() == "precious"


def test_a_users_files_in_hf_of_our_workdir_are_refused_before_training(tmp_path, bert):
  c = _config("sequence", bert, train_file=_csv(tmp_path / "t.csv", GOOD * 3))
  work = tmp_path / "run"
  outdir.claim_dir(str(work), finetuning.WRITER)
  (work / "hf").mkdir()
  (work / "hf" / "notes.txt").write_text("mine")
  with pytest.raises(outdir.OutputDirError, match="hf/ export"):
    finetune.run(c, str(work))
  assert (work / "hf" / "notes.txt").read_text() == "mine"
  assert not (work / "checkpoints").exists()


def test_an_earlier_versions_workdir_is_accepted_as_ours(tmp_path):
  work = tmp_path / "old"
  (work / "checkpoints").mkdir(parents=True)
  (work / "best.json").write_text("{}")
  (work / "best").mkdir()
  (work / "best" / "config.json").write_text("{}")
  handle, _ = loop.claim(None, str(work), {}, finetuning.FinetuneJob())
  lock_lib.release(handle)
  assert outdir.is_ours(str(work)) and outdir.is_ours(str(work / "best"))


def test_a_second_finetune_on_a_locked_workdir_is_refused(tmp_path, bert):
  from launch.trainer import lock as lock_lib
  c = _config("sequence", bert, train_file=_csv(tmp_path / "t.csv", GOOD * 3))
  work = outdir.claim_dir(str(tmp_path / "run"), finetuning.WRITER)
  with lock_lib.hold(work):
    with pytest.raises(lock_lib.WorkdirLocked, match=f"pid {os.getpid()}"):
      finetune.run(c, work)


# ---- interruption -----------------------------------------------------------------------

def _rows_csv(path, n, seed):
  rows = fh.sentiment_rows(n, seed=seed)
  return _csv(path, [f"{r['text']},{r['label']}" for r in rows] + ["a ragged row"])


def _resume_config(tmp_path, bert, **overrides):
  # 40 rows (one more, ragged, skipped): 32 train = 4 steps per epoch, 2 epochs
  c = _config("sequence", bert, train_file=_rows_csv(tmp_path / "t.csv", 40, 5),
              **{"epochs": 2, **overrides})
  c.train.log_every = 3
  return c


def _same(a, b):
  import jax
  la, lb = jax.tree.leaves(a["state"].params), jax.tree.leaves(b["state"].params)
  assert len(la) == len(lb)
  for x, y in zip(la, lb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert a["history"] == b["history"] and a["best"] == b["best"]


def _hf_files(d):
  return {p.name: p.read_bytes() for p in d.iterdir() if p.name != outdir.MARKER}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, bert):
  """The uninterrupted run the resumed ones must reproduce."""
  d = tmp_path_factory.mktemp("reference")
  return d, finetune.run(_resume_config(d, bert, length_buckets="off"), str(d / "ref"))


@pytest.mark.parametrize("stop_at,where,every", [
    (6, (1, 2), 0),  # epoch 2, batch 2 of 4
    (4, (0, 4), 0),  # the last batch of epoch 1 (its eval runs before the stop)
    (6, (1, 2), 5),  # a crash at step 6: the checkpoint.every save of step 5 resumes
])
def test_a_stop_mid_epoch_resumes_to_the_uninterrupted_result(tmp_path, bert, reference,
                                                               stop_at, where, every):
  ref_dir, ref = reference
  work = str(tmp_path / "cut")
  c = _resume_config(tmp_path, bert, length_buckets="off", checkpoint__every=every,
                     checkpoint__keep=3)
  part = finetune.run(c, work, stop_after=stop_at)
  assert part["stopped"] and (part["epoch"], part["batch"], part["step"]) == where + (
      stop_at,)
  assert not os.path.exists(os.path.join(work, "results.json"))
  steps = sorted(int(p) for p in os.listdir(os.path.join(work, "checkpoints")) if p.isdigit())
  assert steps[-1] == stop_at and (5 in steps) == (every == 5)
  if every:  # as if killed before the stop's save: the periodic mid-epoch one is latest
    import shutil
    shutil.rmtree(os.path.join(work, "checkpoints", str(stop_at)))
  done = finetune.run(c, work)
  _same(done, ref)
  assert _hf_files(tmp_path / "cut" / "hf") == _hf_files(ref_dir / "ref" / "hf")
  runs = [json.loads(x) for x in open(os.path.join(work, "metrics.jsonl"))
          if '"split": "run"' in x]
  assert runs[0]["data"]["bad_data"] == {"corrupt_record": 1}


@pytest.mark.slow  # three packed runs with their compiles (~40 s on a loaded CPU)
def test_sigterm_mid_epoch_with_packing_and_periodic_checkpoints_resumes_bitwise(
    tmp_path, bert, monkeypatch):
  ov = {"packing": True, "checkpoint__every": 3}
  ref = finetune.run(_resume_config(tmp_path, bert, **ov), str(tmp_path / "ref"))
  real, served = fd.batches, []

  def batches(*a, **k):
    for b in real(*a, **k):
      served.append(k.get("pack") is not None)  # training batches (eval is not packed)
      if sum(served) == 6 and served[-1]:  # during the 6th step: SIGTERM, as a preemption sends it
        os.kill(os.getpid(), signal.SIGTERM)
      yield b

  monkeypatch.setattr(fd, "batches", batches)
  work = str(tmp_path / "cut")
  c = _resume_config(tmp_path, bert, **ov)
  part = finetune.run(c, work)
  assert part["stopped"] and (part["epoch"], part["batch"], part["step"]) == (1, 2, 6)
  assert signal.getsignal(signal.SIGTERM) is not None  # the previous handler is back
  monkeypatch.setattr(fd, "batches", real)
  _same(finetune.run(c, work), ref)


def test_hf_is_replaced_atomically_on_a_rerun(tmp_path, bert, monkeypatch):
  c = _resume_config(tmp_path, bert, length_buckets="off", epochs=1)
  work = tmp_path / "run"
  finetune.run(c, str(work))
  before = _hf_files(work / "hf")
  import shutil
  real_copy, copied = shutil.copy, []

  def failing_copy(src, dst, *a, **k):
    copied.append(src)
    if len(copied) == 2:
      raise OSError("disk full")
    return real_copy(src, dst, *a, **k)

  monkeypatch.setattr(shutil, "copy", failing_copy)
  with pytest.raises(OSError, match="disk full"):
    finetune.run(c, str(work))  # finished: no training, only the exports again
  assert _hf_files(work / "hf") == before and outdir.is_ours(str(work / "hf"))
  assert not [p for p in work.iterdir() if p.name.startswith(".hf.tmp")]


@pytest.mark.slow  # two fresh Python + JAX processes (~60 s under load)
def test_sigterm_to_the_finetune_command_saves_and_the_same_command_resumes(tmp_path, bert):
  import subprocess
  import sys
  import time
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  work = tmp_path / "run"
  cmd = [sys.executable, "-m", "launch.finetune", "--config", "configs/finetune.py:sequence",
         f"--config.init_from={bert}", f"--workdir={work}",
         f"--config.finetune.train_file={_rows_csv(tmp_path / 't.csv', 40, 5)}",
         "--config.finetune.epochs=12", "--config.finetune.length_buckets=off",
         "--config.data.seq_len=24", "--config.data.global_batch=8",
         "--config.train.log_every=1"]
  env = dict(os.environ, PYTHONPATH=root)
  proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  metrics = work / "metrics.jsonl"
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None and not (
      metrics.is_file() and '"split": "train"' in metrics.read_text()):
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 0, out[-3000:]
  assert "stopped at epoch" in out and "run the same command to resume" in out, out[-3000:]
  assert not (work / "results.json").exists()
  done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert "resuming at epoch" in done.stdout + done.stderr
  result = json.loads((work / "results.json").read_text())
  assert [h["epoch"] for h in result["history"]] == list(range(1, 13))


def test_a_resume_on_other_training_data_or_settings_is_refused(tmp_path, bert):
  work = str(tmp_path / "run")
  c = _resume_config(tmp_path, bert, length_buckets="off")
  assert finetune.run(c, work, stop_after=2)["stopped"]
  saved = sorted(os.listdir(os.path.join(work, "checkpoints")))
  (tmp_path / "other").mkdir()
  other = _resume_config(tmp_path / "other", bert, length_buckets="off")
  other.finetune.train_file = _rows_csv(tmp_path / "other" / "t6.csv", 40, 6)  # 40 others
  other.train.seed = 7
  with pytest.raises(cli.ConfigError, match=r"other settings: .*finetune\.train_rows: "
                     r".*train\.seed: 0 -> 7.*allow_config_change="):
    finetune.run(other, work)
  assert sorted(os.listdir(os.path.join(work, "checkpoints"))) == saved


def test_a_nan_epoch_metric_never_stays_the_best():
  nan = float("nan")
  assert finetuning.better(nan, None)  # the first epoch is the best so far, whatever it is
  assert finetuning.better(0.1, nan) and not finetuning.better(nan, 0.1)
  assert finetuning.better(0.5, 0.4) and not finetuning.better(0.4, 0.4)


def test_regression_with_one_eval_row_is_refused_before_training(tmp_path, bert):
  c = _config("regression", bert, train_file=_csv(tmp_path / "t.csv", ["good,1", "bad,0"] * 4),
              eval_file=_csv(tmp_path / "e.csv", ["fine,0.5"]))
  with pytest.raises(ValueError, match=r"e\.csv: 1 eval row; regression's correlations"):
    _load(c)


@pytest.mark.parametrize("section,key,value,match", [
    ("data", "seq_len", 128, "data.seq_len=128 is longer than the model's 64 positions"),
    ("train", "nonfinite_policy", "bogus", "train.nonfinite_policy='bogus'"),
    ("optimizer", "learning_rate", -1.0, "optimizer.learning_rate=-1.0"),
])
def test_the_trainers_checks_apply_to_finetuning_before_any_data(tmp_path, bert, section,
                                                                 key, value, match):
  c = _config("sequence", bert, train_file=_csv(tmp_path / "t.csv", GOOD))
  c[section][key] = value
  with pytest.raises(cli.ConfigError, match=re.escape(match)):
    finetune.run(c, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_a_byte_order_mark_does_not_hide_the_first_column(tmp_path):
  (tmp_path / "t.csv").write_bytes(b"\xef\xbb\xbftext,label\ngood,pos\n")
  assert fd.read_table(str(tmp_path / "t.csv")) == [{"text": "good", "label": "pos"}]


def test_one_row_cannot_be_held_out_from():
  with pytest.raises(ValueError, match="1 row.* cannot be split"):
    fd.holdout(1, 0.2, 0)
  tr, ev = fd.holdout(2, 0.9, 0)  # at least one row on each side
  assert len(tr) == 1 and len(ev) == 1


@pytest.mark.parametrize("policy,error", [
    ("stop", "training stopped at step"),
    pytest.param("skip", "updates in a row were skipped", marks=pytest.mark.slow)])
def test_a_diverging_finetune_stops_loudly_and_exports_nothing(tmp_path, bert, policy,
                                                                error):
  c = _config("sequence", bert, train_file=_csv(tmp_path / "t.csv", GOOD * 10),
              length_buckets="off", epochs=3)
  c.optimizer.learning_rate, c.optimizer.clip_norm = 1e30, 0.0
  c.train.nonfinite_policy, c.train.max_consecutive_skips, c.train.log_every = policy, 2, 1
  with pytest.raises(FloatingPointError, match=error):
    finetune.run(c, str(tmp_path / "run"))
  assert not (tmp_path / "run" / "best").exists() and not (tmp_path / "run" / "hf").exists()


def test_squad_that_is_not_utf8_names_file_and_byte(tmp_path):
  (tmp_path / "q.json").write_bytes(b'{"data": [{"title": "caf\xe9"}]}')
  with pytest.raises(ValueError, match=r"q\.json: not UTF-8 at byte 24"):
    fd.read_squad(str(tmp_path / "q.json"))


def test_the_command_says_a_data_error_in_one_line_naming_the_file(tmp_path, bert):
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  path = _csv(tmp_path / "one.csv", ["good,pos"])
  p = subprocess.run([sys.executable, "-m", "launch.finetune", "--config",
                      "configs/finetune.py:sequence", f"--config.init_from={bert}",
                      f"--workdir={tmp_path / 'run'}", f"--config.finetune.train_file={path}",
                      "--config.data.seq_len=32"], cwd=root, capture_output=True, text=True,
                     timeout=300, env=dict(os.environ, PYTHONPATH=root))
  assert p.returncode == 1, p.stderr[-2000:]
  assert p.stderr.strip().splitlines()[-1] == (
      f"error: {path}: 1 usable row; holding out eval rows needs 2 or more (or give "
      "finetune.eval_file)")
  assert "Traceback" not in p.stderr
