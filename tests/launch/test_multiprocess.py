"""Two JAX processes on this machine (jax.distributed over 127.0.0.1, gloo collectives)
run the real entry point: per-process data shards, one global batch, a shared checkpoint,
and a resume."""
import os
import subprocess
import sys

import pytest

from launch.trainer import metrics as metrics_lib
from tests.launch.multiprocess_helpers import (OVERRIDES, ROOT, finish, free_port, preempt_one,
                                               tiny_config)


def _run(workdir, steps):
  port = free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device each
  # Output goes to files: with pipes read one after the other, a full pipe would block
  # one process inside a collective and deadlock the other.
  logs = [open(f"{workdir}.{steps}.{i}.log", "w+") for i in range(2)]
  procs = [subprocess.Popen(
      [sys.executable, "-m", "launch.pretrain", "--config", "configs/bert.py:tiny",
       "--workdir", workdir, f"--config.train.steps={steps}", *OVERRIDES,
       "--coordinator_address", f"127.0.0.1:{port}", "--num_processes", "2",
       "--process_id", str(i)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
      for i, log in enumerate(logs)]
  for p, log in zip(procs, logs):
    p.wait(timeout=300)
    log.seek(0)
    assert p.returncode == 0, log.read()[-3000:]
    log.close()


@pytest.mark.slow
def test_two_processes_train_checkpoint_and_resume(tmp_path):
  wd = str(tmp_path / "run")
  _run(wd, 4)
  records = metrics_lib.read(wd)  # written by process 0 only
  run = [r for r in records if r.get("split") == "run"][0]
  assert run["devices"] == 2 and run["mesh"] == {"data": 2, "fsdp": 1, "tensor": 1}
  assert sorted(r["step"] for r in records if r.get("split") == "train") == [1, 2, 3, 4]
  _run(wd, 6)  # resumes from step 4
  steps = [r["step"] for r in metrics_lib.read(wd) if r.get("split") == "train"]
  assert steps == [1, 2, 3, 4, 5, 6]
  assert os.path.isfile(os.path.join(wd, "hf", "model.safetensors"))


def _launch(workdir, steps, tag, extra):
  """Two `launch.pretrain` processes (no wait); -> (processes, log files)."""
  port = free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  logs = [open(f"{workdir}.{tag}.{i}.log", "w+") for i in range(2)]
  procs = [subprocess.Popen(
      [sys.executable, "-m", "launch.pretrain", "--config", "configs/bert.py:tiny",
       "--workdir", workdir, f"--config.train.steps={steps}", *OVERRIDES, *extra,
       "--coordinator_address", f"127.0.0.1:{port}", "--num_processes", "2",
       "--process_id", str(i)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
      for i, log in enumerate(logs)]
  return procs, logs


@pytest.mark.slow  # a preprocessing run and three two-process runs: minutes under load
def test_two_processes_train_on_shards_sigterm_and_resume_bitwise(tmp_path):
  """launch.preprocess writes ArrayRecord shards (pairs, its own tokenizer); two processes
  train on them (each reads its share), one gets SIGTERM, both save one step, the resumed
  run ends bit for bit where an uninterrupted one does, and both evaluate on the held-out
  shards."""
  import numpy as np
  from safetensors.numpy import load_file

  from launch import preprocess
  shards = str(tmp_path / "shards")
  m = preprocess.preprocess(tiny_config(), shards, workers=1, progress=False)
  assert m["totals"]["eval"]["rows"] > 0 and m["label_key"] == "next_sentence_label"
  steps = 60
  extra = ["--config.data.source=arrayrecord", f"--config.data.path={shards}",
           "--config.checkpoint.every=1000"]
  ref = str(tmp_path / "ref")
  finish(*_launch(ref, steps, "ref", extra))
  wd = str(tmp_path / "run")
  texts = preempt_one(wd, *_launch(wd, steps, "pre", extra), timeout_s=900)
  saved = [int(t.split("stop requested: checkpoint of step ")[1].split()[0]) for t in texts]
  assert saved[0] == saved[1] < steps, saved
  assert not os.path.exists(os.path.join(wd, "hf"))
  finish(*_launch(wd, steps, "resume", extra))

  def losses(workdir, split):
    return {r["step"]: r for r in metrics_lib.read(workdir) if r.get("split") == split}

  a, b = losses(ref, "train"), losses(wd, "train")
  assert sorted(a) == sorted(b) == list(range(1, steps + 1))
  assert [a[s]["mlm_loss"] for s in a] == [b[s]["mlm_loss"] for s in a]  # bitwise
  ea, eb = losses(ref, "eval"), losses(wd, "eval")
  assert ea and sorted(ea) == sorted(eb)
  assert [ea[s]["mlm_loss"] for s in ea] == [eb[s]["mlm_loss"] for s in ea]
  run = [r for r in metrics_lib.read(ref) if r.get("split") == "run"][0]
  assert run["data"]["source"] == "arrayrecord" and run["devices"] == 2
  wa = load_file(os.path.join(ref, "hf", "model.safetensors"))
  wb = load_file(os.path.join(wd, "hf", "model.safetensors"))
  assert wa.keys() == wb.keys()
  for k in wa:
    np.testing.assert_array_equal(wa[k], wb[k], err_msg=k)  # bit for bit
