"""Fine-tuning runs through the one loop (launch/trainer/loop.py): what pretraining has,
fine-tuning has too — config.json in the work directory, progress with an ETA, eval lines
with their numbers, step checkpoints, a resume that keeps the earlier epochs' history and
time, and trained tokens that never count the rows that only fill a batch."""
import inspect
import json
import os
import signal

import numpy as np
import pytest

from configs import finetune as finetune_configs
from launch import finetune
from launch.trainer import finetuning
from launch.data import finetune_data as fd
from launch.trainer import loop
from launch.trainer import metrics as metrics_lib
from tests.launch import finetune_helpers as fh


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
  return fh.tiny_bert_dir(str(tmp_path_factory.mktemp("bert") / "bert"))


def _config(bert, train_file, **finetune_keys):
  c = finetune_configs.get_config("sequence").unlock()
  c.init_from = bert
  c.data.seq_len, c.data.global_batch = 24, 8
  c.optimizer.learning_rate = 3e-3
  c.finetune.train_file = train_file
  c.finetune.length_buckets = "off"
  c.train.log_every = 2
  for k, v in finetune_keys.items():
    c.finetune[k] = v
  return c


def _rows(tmp_path, n):
  return fh.write_jsonl(str(tmp_path / "rows.jsonl"), fh.sentiment_rows(n, seed=3))


def _records(workdir, split):
  return [r for r in metrics_lib.read(workdir) if r.get("split") == split]


def test_finetune_has_no_loop_of_its_own():
  for module in (finetune, finetuning):
    src = inspect.getsource(module)
    assert "train_step" not in src and "manager.save" not in src and "for step" not in src
  assert issubclass(finetuning.FinetuneJob, loop.Job)


def test_a_finetune_run_records_its_config_progress_and_eval_numbers(tmp_path, bert, caplog):
  # 30 rows: 24 train (3 steps per epoch, the last one 0 rows short), 6 held out
  c = _config(bert, _rows(tmp_path, 30), epochs=2)
  work = str(tmp_path / "run")
  with caplog.at_level("INFO", logger="encoder_zoo"):
    out = finetune.run(c, work)
  saved = json.load(open(os.path.join(work, "config.json")))
  assert saved["finetune"]["task"] == "sequence" and saved["init_from"] == bert
  assert saved["train"]["steps"] == 6  # set from the epochs by the job
  train = _records(work, "train")
  assert train and all(r["eta_s"] >= 0 and r["tokens_per_s"] > 0 for r in train)
  assert train[-1]["step"] == 6 and train[-1]["eta_s"] == 0
  evals = _records(work, "eval")
  assert [r["epoch"] for r in evals] == [1, 2] and [r["step"] for r in evals] == [3, 6]
  eval_lines = [m for m in caplog.messages if m.startswith("[eval]")]
  assert len(eval_lines) == 2
  for line, rec in zip(eval_lines, evals):
    assert f"epoch {rec['epoch']}" in line
    assert f"accuracy {rec['accuracy']:.4f}" in line and f"macro_f1 {rec['macro_f1']:.4f}" in line
  assert [h["epoch"] for h in out["history"]] == [1, 2]


def test_trained_tokens_count_real_tokens_of_real_rows_only(tmp_path, bert):
  # 27 rows: the held-out split leaves a training set whose last batch is filled up
  c = _config(bert, _rows(tmp_path, 27), epochs=2)
  out = finetune.run(c, str(tmp_path / "run"))
  tok = fd.load_tokenizer(bert)
  train, _, _, _ = fd.load_data(c, tok)
  per_epoch = int(train["attention_mask"][train["example_weight"] > 0].sum())
  assert len(train["example_weight"]) % 8 and (train["example_weight"] > 0).all()
  assert out["train_tokens"] == 2 * per_epoch


def test_a_resumed_run_keeps_the_earlier_epochs_history_and_time(tmp_path, bert):
  c = _config(bert, _rows(tmp_path, 30), epochs=3)
  ref = finetune.run(c, str(tmp_path / "ref"))
  work = str(tmp_path / "cut")
  part = finetune.run(c, work, stop_after=4)  # in epoch 2, after epoch 1's evaluation
  assert part["stopped"] and part["step"] == 4 and [h["epoch"] for h in part["history"]] == [1]
  done = finetune.run(c, work)
  result = json.load(open(os.path.join(work, "results.json")))
  assert [h["epoch"] for h in result["history"]] == [1, 2, 3]
  assert result["history"] == ref["history"]
  assert len(result["epoch_train_s"]) == 3 and all(t > 0 for t in result["epoch_train_s"])
  assert result["train_s"] == pytest.approx(sum(result["epoch_train_s"]), rel=1e-6)
  assert result["train_tokens"] == ref["train_tokens"]
  np.testing.assert_array_equal(
      np.asarray(done["state"].params["encoder"]["sequence_head"]["out"]["kernel"]),
      np.asarray(ref["state"].params["encoder"]["sequence_head"]["out"]["kernel"]))


def test_eval_lines_show_every_score():
  line = metrics_lib.format_line(9, "eval", {"entity_f1": 0.5, "token_accuracy": 0.75,
                                             "epoch": 3, "pearson": 0.25})
  assert line.startswith("[eval] step 9  epoch 3")
  for part in ("entity_f1 0.5000", "token_accuracy 0.7500", "pearson 0.2500"):
    assert part in line


def test_a_sigterm_after_a_steps_poll_stops_at_the_next_step_with_its_checkpoint(
    tmp_path, bert, monkeypatch):
  """The flag is read once per step: a SIGTERM landing while step 2 is logged is seen at
  step 3, which is saved before the run stops (never "saved" without a checkpoint)."""
  c = _config(bert, _rows(tmp_path, 30), epochs=2)  # 3 steps per epoch, a log every 2
  real = metrics_lib.MetricWriter.write

  def write(self, step, split, metrics):
    real(self, step, split, metrics)
    if split == "train" and step == 2:
      os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(metrics_lib.MetricWriter, "write", write)
  work = tmp_path / "run"
  part = finetune.run(c, str(work))
  assert part["stopped"] and part["step"] == 3
  assert [p for p in os.listdir(work / "checkpoints") if p.isdigit()] == ["3"]
  assert [h["epoch"] for h in part["history"]] == [1]
