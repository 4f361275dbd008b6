"""Start-up checks and one-line command-line errors (launch/cli.py, launch/trainer/checks.py):
a bad setting fails in one line naming key, value and fix, before anything is written."""
import os
import re
import subprocess
import sys

import jax
import pytest

from configs import bert as bert_configs
from launch import cli
from launch import trainer as train
from launch.trainer import checks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _config(**overrides):
  c = bert_configs.get_config("tiny").unlock()
  c.mesh.shape = (1, 1, 1)
  for key, value in overrides.items():
    section, name = key.split("__")
    c[section][name] = value
  return c


def test_typo_in_an_override_is_one_line_with_exit_code_2(tmp_path):
  wd = tmp_path / "wd"
  proc = subprocess.run(
      [sys.executable, "-m", "launch.pretrain", "--config", "configs/bert.py:tiny",
       "--workdir", str(wd), "--config.train.stepz=3"],
      check=False, capture_output=True, text=True, cwd=REPO)
  assert proc.returncode == 2
  assert proc.stderr.strip() == "error: unknown config key train.stepz; did you mean train.steps?"
  assert not wd.exists()


def test_unknown_keys_and_bad_numbers_are_named():
  c = bert_configs.get_config("tiny")
  assert cli.unknown_key(c, "train.steps") is None
  assert cli.unknown_key(c, "trian.steps") == (
      "unknown config key trian.steps; did you mean train.steps?")
  assert cli.unknown_key(c, "optimizer.learning_rat") == (
      "unknown config key optimizer.learning_rat; did you mean optimizer.learning_rate?")
  msg = cli.unknown_key(c, "zzz")
  assert msg.startswith("unknown config key zzz; the config has ") and "train" in msg
  assert cli.bad_value(c, "train.steps", "abc") == "config key train.steps='abc' is not an int"
  assert cli.bad_value(c, "train.steps", "12") is None
  assert cli.bad_value(c, "optimizer.learning_rate", "2e-3") is None
  spec = os.path.join(REPO, "configs/bert.py:tiny")
  assert cli.override_error(["--config", spec, "--config.data.seq_len=64"]) is None
  assert "did you mean data.seq_len" in cli.override_error(
      ["--config", spec, "--config.data.seq_lenn", "64"])


@pytest.mark.parametrize("overrides,expected", [
    ({"data__seq_len": 100_000}, "data.seq_len=100000 is longer than the model's 512 pos"),
    ({"train__steps": 0}, "train.steps=0 must be positive"),
    ({"tokenizer__kind": "sentencepiece", "tokenizer__path": "/no/such/spm.model"},
     "tokenizer.path='/no/such/spm.model' does not exist"),
    ({"data__source": "text", "data__files": "/no/such/dir/*.txt"}, "matches no files"),
    ({"data__packing": "rows"}, "data.packing='rows'"),
    ({"optimizer__grad_accum_steps": 3}, ("data.global_batch=64 does not split over 1 "
     "data-parallel devices (mesh {'data': 1, 'fsdp': 1, 'tensor': 1}) x "
     "grad_accum_steps=3 micro-batches; use a multiple of 3")),
    ({"train__tpu_scoped_vmem_kib": -1}, "train.tpu_scoped_vmem_kib must be an integer >= 0"),
])
def test_bad_settings_fail_before_anything_is_written(tmp_path, overrides, expected):
  wd = tmp_path / "wd"
  with pytest.raises(cli.ConfigError, match=re.escape(expected)) as e:
    train.train_and_evaluate(_config(**overrides), str(wd), jax.devices()[:1])
  assert "\n" not in str(e.value)
  assert not wd.exists()


def test_batch_must_split_over_the_data_parallel_devices():
  c = _config(data__global_batch=12)
  c.mesh.shape = (-1, 1, 1)
  with pytest.raises(cli.ConfigError, match=r"global_batch=12 does not split over 8 "
                     r"data-parallel devices.*multiple of 8, e.g. --config.data.global_batch=8"):
    checks.check(c, jax.devices()[:8])
  c.data.global_batch = 16
  assert checks.check(c, jax.devices()[:8]).data.global_batch == 16


def test_warmup_longer_than_the_run_is_clamped_with_a_note(capsys):
  c = _config(train__steps=2)
  out = checks.check(c, jax.devices()[:1])
  assert out.optimizer.warmup_steps == 0 and c.optimizer.warmup_steps == 100  # a copy
  assert ("note: optimizer.warmup_steps=100 is longer than the run's 2 steps; clamped to 0"
          in capsys.readouterr().out)
  c = _config(train__steps=50, optimizer__schedule="wsd", optimizer__warmup_steps=48)
  assert checks.check(c, jax.devices()[:1]).optimizer.warmup_steps == 5  # 10% of the run
  c = _config(train__steps=500)
  assert checks.clamp_warmup(c) is None and c.optimizer.warmup_steps == 100
