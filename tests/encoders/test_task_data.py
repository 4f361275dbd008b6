"""The built-in tasks' data side: input files in another encoding (`finetune.encoding`),
with undecodable lines skipped and counted or named by file and line under
data.bad_data; token accuracy beside entity F1; each task's default selection metric and
the settings checked up front."""
import numpy as np
import pytest

from configs import finetune as finetune_configs
from encoders import tasks
from encoders.tasks import metrics
from encoders.tasks.sequence import read_table
from encoders.tasks.token import read_conll
from launch.data import badinput
from launch.data import finetune_data as fd


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16", "cp1252"])
def test_a_table_in_another_encoding_reads_as_text(tmp_path, encoding):
  path = tmp_path / "t.csv"
  path.write_bytes("text,label\ncafé crème,pos\nnaïve plot,neg\n".encode(encoding))
  rows = read_table(str(path), bad=badinput.BadData(), encoding=encoding)
  assert rows == [{"text": "café crème", "label": "pos"}, {"text": "naïve plot",
                                                            "label": "neg"}]
  assert [r.where for r in rows] == [f"{path}:2", f"{path}:3"]


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16"])
def test_an_undecodable_line_is_skipped_and_counted_or_named(tmp_path, encoding):
  if encoding == "utf-8":
    enc, start, bad_line = (lambda t: t.encode("utf-8")), b"", b"caf\xe9 noir O\n"
  else:  # a lone surrogate; UTF-16's line ends are two bytes, so it decodes first
    enc, start = (lambda t: t.encode("utf-16-le")), b"\xff\xfe"
    bad_line = b"\x00\xd8" + enc(" O\n")
  path = tmp_path / "c.conll"
  path.write_bytes(start + enc("John B-PER\nran O\n\n") + bad_line + enc("\nParis B-LOC\n"))
  bad = badinput.BadData("skip")
  got = read_conll(str(path), bad=bad, encoding=encoding)
  assert [words for words, _ in got] == [["John", "ran"], ["Paris"]]
  assert bad.counts["non_utf8"] == 1
  with pytest.raises(badinput.BadDataError, match=r"non_utf8.*c\.conll:4"):
    read_conll(str(path), bad=badinput.BadData("error"), encoding=encoding)


def test_token_accuracy_scores_tags_without_chunks():
  """Part-of-speech tags: entity F1 reads every bare tag as a one-token chunk and runs of
  one tag as one chunk; token accuracy counts the words tagged right."""
  gold = [["DT", "NN", "NN", "VBD"], ["PRP", "VBD"]]
  pred = [["DT", "NN", "VB", "VBD"], ["PRP", "NN"]]
  assert metrics.token_accuracy(gold, pred) == pytest.approx(4 / 6)
  assert metrics.token_accuracy(gold, gold) == 1.0
  with pytest.raises(ValueError, match="2 gold tags and 1 predicted"):
    metrics.token_accuracy([["a", "b"]], [["a"]])


def test_the_token_scorer_reports_token_accuracy_and_the_selection_defaults():
  token = tasks.get("token")
  rows = [(["John", "ran"], ["B-PER", "O"]), (["Paris"], ["B-LOC"])]
  logits = np.zeros((2, 4, 3))
  logits[0, 1, 1] = logits[0, 2, 0] = logits[1, 1, 0] = 1.0  # B-PER O | O (wrong)
  got, records = token.score({"logits": logits}, {"rows": rows, "firsts": [[1, 2], [1]]},
                             ("O", "B-PER", "B-LOC"), None)
  assert got["token_accuracy"] == pytest.approx(2 / 3)
  assert got["entity_f1"] == pytest.approx(2 / 3)  # 1 of 1 predicted, 1 of 2 gold
  assert records[1] == {"words": ["Paris"], "tags": ["B-LOC"], "prediction": ["O"]}
  for name, metric in (("sequence", "accuracy"), ("regression", "pearson"),
                       ("token", "entity_f1"), ("qa", "f1")):
    c = finetune_configs.get_config(name)
    assert c.finetune.task == name and fd.selection_metric(c) == metric
    assert metric in tasks.get(name).metrics
  c = finetune_configs.get_config("token").unlock()
  c.finetune.selection_metric = "token_accuracy"
  assert fd.selection_metric(c) == "token_accuracy"


@pytest.mark.parametrize("key,value,message", [
    ("encoding", "klingon", "finetune.encoding='klingon' is not a text encoding"),
    ("encoding", "rot13", "finetune.encoding='rot13' is not a text encoding"),
    ("selection_metric", "f1", "selection_metric='f1' is not a metric of the 'token' task"),
    ("task", "summarize", "finetune.task='summarize'; expected one of"),
])
def test_bad_task_settings_are_one_line_each(tmp_path, key, value, message):
  c = finetune_configs.get_config("token").unlock()
  c.init_from = str(tmp_path)
  (tmp_path / "t.conll").write_text("John B-PER\n")
  c.finetune.train_file = str(tmp_path / "t.conll")
  c.finetune[key] = value
  errs = fd.config_errors(c)
  assert any(message in e for e in errs), errs
  assert len(errs) == 1, errs
