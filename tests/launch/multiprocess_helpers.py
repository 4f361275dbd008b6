"""Shared helpers of the multi-process tests: the tiny run's overrides, free ports, and
waiting for (or preempting) two `launch.pretrain` processes."""
import os
import signal
import socket
import time

from configs import bert
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
  c = bert.get_config("tiny").unlock()
  for o in [*OVERRIDES, *extra]:
    key, value = o.removeprefix("--config.").split("=")
    section, name = key.split(".")
    kind = type(c[section][name])
    c[section][name] = value == "True" if kind is bool else kind(value)
  return c


def free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def finish(procs, logs):
  """Waits for every process (each must exit 0); -> their logs."""
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
  return finish(procs, logs)
