"""Two JAX processes on this machine (jax.distributed over 127.0.0.1, gloo collectives)
run the real entry point: per-process data shards, one global batch, a shared checkpoint,
and a resume."""
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from launch.trainer import metrics as metrics_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OVERRIDES = ["--config.model.num_hidden_layers=1", "--config.model.hidden_size=32",
             "--config.model.num_attention_heads=2", "--config.model.intermediate_size=64",
             "--config.tokenizer.vocab_size=500", "--config.tokenizer.train_sentences=10000",
             "--config.data.max_documents=60", "--config.data.eval_fraction=0.1",
             "--config.data.seq_len=32",
             "--config.data.global_batch=8", "--config.optimizer.warmup_steps=1",
             "--config.train.log_every=1", "--config.train.eval_every=4",
             "--config.train.eval_batches=1", "--config.checkpoint.every=2",
             "--config.logging.plot=False"]


def tiny_config(*extra):
  """configs/bert.py:tiny with OVERRIDES, then `extra` ("--config.section.name=value"; a
  later one wins) applied, as the command line would."""
  from configs import bert
  c = bert.get_config("tiny").unlock()
  for o in [*OVERRIDES, *extra]:
    key, value = o.removeprefix("--config.").split("=")
    section, name = key.split(".")
    kind = type(c[section][name])
    c[section][name] = value == "True" if kind is bool else kind(value)
  return c


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run(workdir, steps):
  port = _free_port()
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
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  logs = [open(f"{workdir}.{tag}.{i}.log", "w+") for i in range(2)]
  procs = [subprocess.Popen(
      [sys.executable, "-m", "launch.pretrain", "--config", "configs/bert.py:tiny",
       "--workdir", workdir, f"--config.train.steps={steps}", *OVERRIDES, *extra,
       "--coordinator_address", f"127.0.0.1:{port}", "--num_processes", "2",
       "--process_id", str(i)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
      for i, log in enumerate(logs)]
  return procs, logs


def _finish(procs, logs):
  texts = []
  for p, log in zip(procs, logs):
    p.wait(timeout=600)
    log.seek(0)
    text = log.read()
    log.close()
    assert p.returncode == 0, text[-3000:]
    texts.append(text)
  return texts


def preempt_one(wd, procs, logs, timeout_s):
  """Waits until the run in `wd` has logged step 3, sends SIGTERM to process 1 only, and
  returns every process's log (each must exit 0)."""
  deadline = time.time() + timeout_s
  try:
    while True:
      done = [r["step"] for r in metrics_lib.read(wd) if r.get("split") == "train"] if \
          os.path.exists(os.path.join(wd, metrics_lib.JSONL)) else []
      if done and max(done) >= 3:
        break
      assert time.time() < deadline and all(p.poll() is None for p in procs)
      time.sleep(0.05)
  except BaseException:
    for p in procs:
      p.kill()
    raise
  procs[1].send_signal(signal.SIGTERM)
  return _finish(procs, logs)


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
  _finish(*_launch(ref, steps, "ref", extra))
  wd = str(tmp_path / "run")
  texts = preempt_one(wd, *_launch(wd, steps, "pre", extra), timeout_s=900)
  saved = [int(t.split("stop requested: checkpoint of step ")[1].split()[0]) for t in texts]
  assert saved[0] == saved[1] < steps, saved
  assert not os.path.exists(os.path.join(wd, "hf"))
  _finish(*_launch(wd, steps, "resume", extra))

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
