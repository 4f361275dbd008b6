"""Faults: SIGTERM to one of two JAX processes (all save the same step, the resumed run is
bit-identical), kill -9 in the middle of an async checkpoint save (the previous step is
restored), and a committed but unreadable checkpoint (the step before it is used)."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from launch.trainer import checkpoint as ckpt_lib
from tests.launch.fault_helpers import CKPT, tiny_state
from tests.launch.multiprocess_helpers import (OVERRIDES, ROOT, finish, free_port, preempt_one,
                                               tiny_config)


def _abstract():
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      tiny_state(0))


def test_unreadable_latest_checkpoint_falls_back_to_the_previous_step(tmp_path):
  d = str(tmp_path / "ck")
  m = ckpt_lib.Manager(d, CKPT)
  m.save(1, tiny_state(1.0), {"pos": 1})
  m.save(2, tiny_state(2.0), {"pos": 2})
  m.close()
  for root, _, files in os.walk(os.path.join(d, "2", "state")):
    for f in files:  # a torn copy: the step is committed, its array data is gone
      if f != "_CHECKPOINT_METADATA":
        os.remove(os.path.join(root, f))
  state, data = ckpt_lib.Manager(d, CKPT).restore_latest(_abstract())
  assert int(state.step) == 1 and data == {"pos": 1}
  np.testing.assert_array_equal(state.params["w"], np.full((64, 64), 1.0, np.float32))


_KILL_SCRIPT = textwrap.dedent("""
  import sys, time
  import jax.numpy as jnp
  import ml_collections
  from orbax.checkpoint._src.path import atomicity
  from launch.trainer import checkpoint as ckpt_lib
  from tests.launch.fault_helpers import CKPT, tiny_state
  m = ckpt_lib.Manager(sys.argv[1], CKPT)
  m.save(1, tiny_state(1.0), {"pos": 1})
  m.wait()
  for cls in (atomicity.AtomicRenameTemporaryPath, atomicity.CommitFileTemporaryPath):
    orig = cls.finalize
    async def stalled(self, *a, _orig=orig, **k):  # step 2's bytes are written; not committed
      print("FINALIZING", flush=True)
      time.sleep(600)
    cls.finalize = stalled
  m.save(2, tiny_state(2.0), {"pos": 2})
  print("SAVE2_STARTED", flush=True)
  time.sleep(600)
""")


@pytest.mark.slow  # ~25 s under load (a fresh Python + JAX); the fallback test stays default
def test_kill_9_during_async_save_keeps_the_previous_step(tmp_path):
  d = str(tmp_path / "ck")
  script = tmp_path / "kill_me.py"
  script.write_text(_KILL_SCRIPT)
  env = dict(os.environ, PYTHONPATH=ROOT)
  env.pop("XLA_FLAGS", None)
  log = open(tmp_path / "out.log", "w+")
  p = subprocess.Popen([sys.executable, str(script), d], cwd=ROOT, env=env, stdout=log,
                       stderr=subprocess.STDOUT)
  try:
    deadline = time.time() + 240
    while "FINALIZING" not in open(tmp_path / "out.log").read():
      assert p.poll() is None and time.time() < deadline, open(tmp_path / "out.log").read()
      time.sleep(0.1)
    os.kill(p.pid, signal.SIGKILL)  # in the middle of the async save of step 2
    p.wait(timeout=30)
  finally:
    if p.poll() is None:
      p.kill()
  entries = os.listdir(d)
  assert "1" in entries and "2" not in entries, entries
  assert any(e.startswith("2.") for e in entries), entries  # step 2's unfinished temp dir
  state, data = ckpt_lib.Manager(d, CKPT).restore_latest(_abstract())
  assert int(state.step) == 1 and data == {"pos": 1}
  np.testing.assert_array_equal(state.params["w"], np.full((64, 64), 1.0, np.float32))


def _launch(workdir, steps, tag, n=2):
  port = free_port()
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  logs = [open(f"{workdir}.{tag}.{i}.log", "w+") for i in range(n)]
  overrides = [o for o in OVERRIDES if not o.startswith(("--config.checkpoint.every",
                                                         "--config.train.eval_every"))]
  procs = [subprocess.Popen(
      [sys.executable, "-m", "launch.pretrain", "--config", "configs/bert.py:tiny",
       "--workdir", workdir, f"--config.train.steps={steps}", *overrides,
       "--config.checkpoint.every=1000", "--config.train.eval_every=1000",
       "--coordinator_address", f"127.0.0.1:{port}", "--num_processes", str(n),
       "--process_id", str(i)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
      for i, log in enumerate(logs)]
  return procs, logs


def _weights(workdir):
  from safetensors.numpy import load_file
  return load_file(os.path.join(workdir, "hf", "model.safetensors"))


def _prepared_workdir(path, steps):
  """A workdir whose tokenizer and token cache exist: under load, training the tokenizer
  on process 0 while process 1 waits can outlast gloo's connect timeout."""
  from launch import data as data_lib
  c = tiny_config(f"--config.train.steps={steps}")
  data_lib.make_pipeline(c, path, process_index=0, process_count=1)
  return path


@pytest.mark.slow  # three two-process runs: minutes under load
def test_sigterm_to_one_process_saves_one_step_everywhere_and_resumes_exactly(tmp_path):
  steps = 120
  template = _prepared_workdir(str(tmp_path / "template"), steps)
  ref = str(tmp_path / "ref")
  shutil.copytree(template, ref)
  finish(*_launch(ref, steps, "ref"))
  wd = str(tmp_path / "run")
  shutil.copytree(template, wd)
  # start-up and compile take minutes under heavy load
  texts = preempt_one(wd, *_launch(wd, steps, "pre"), timeout_s=1200)
  saved = [int(t.split("stop requested: checkpoint of step ")[1].split()[0]) for t in texts]
  assert saved[0] == saved[1] < steps, saved  # the same step on both processes
  assert "SIGTERM" in texts[1] and "preemption: all 2 processes stop" in texts[0]
  ckpts = sorted(int(e) for e in os.listdir(os.path.join(wd, "checkpoints")) if e.isdigit())
  assert ckpts == [saved[0]]
  assert not os.path.exists(os.path.join(wd, "hf"))
  finish(*_launch(wd, steps, "resume"))
  a, b = _weights(ref), _weights(wd)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)  # bit for bit
