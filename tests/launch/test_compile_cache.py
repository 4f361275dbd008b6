"""train.compilation_cache_dir: JAX's persistent compilation cache for training runs
(launch/trainer/compile_cache.py). A restart reads the train step back from disk."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from launch.trainer import checks, compile_cache
from tests.launch.multiprocess_helpers import ROOT


def test_resolve_fills_in_the_workdir_and_rejects_other_placeholders():
  assert compile_cache.resolve("{workdir}/compilation_cache", "/runs/a") == (
      "/runs/a/compilation_cache")
  assert compile_cache.resolve("/shared/cache", "/runs/a") == "/shared/cache"
  assert compile_cache.resolve("", "/runs/a") == ""
  assert compile_cache.resolve("  ", "/runs/a") == ""
  with pytest.raises(ValueError, match=r"only placeholder is \{workdir\}"):
    compile_cache.resolve("{run}/cache", "/runs/a")
  with pytest.raises(ValueError, match="must be a string"):
    compile_cache.resolve(None, "/runs/a")


def test_a_bad_value_is_a_start_up_error_naming_the_key():
  from configs import bert
  config = bert.get_config("tiny")
  with config.unlocked():
    config.train.compilation_cache_dir = "{wrkdir}/cache"
  with pytest.raises(checks.ConfigError, match="train.compilation_cache_dir"):
    checks.check(config)


def test_an_existing_process_cache_is_kept(tmp_path):
  import jax
  # The test session's own cache (tests/conftest.py) is the process's here: it stays, and
  # nothing is created at the config's path.
  current = jax.config.jax_compilation_cache_dir
  assert current
  got = compile_cache.enable("{workdir}/cc", str(tmp_path))
  assert got == current
  assert not (tmp_path / "cc").exists()


_RUN = textwrap.dedent("""
  import json, sys
  import jax
  from jax import monitoring
  events = []
  monitoring.register_event_listener(lambda name, **kw: events.append(name))
  from launch.trainer import pretraining
  from tests.launch.multiprocess_helpers import tiny_config
  out = pretraining.train_and_evaluate(tiny_config(*json.loads(sys.argv[2])), sys.argv[1])
  print("RESULT", json.dumps({
      "step": out["step"], "cache_dir": jax.config.jax_compilation_cache_dir,
      "hits": events.count("/jax/compilation_cache/cache_hits"),
      "misses": events.count("/jax/compilation_cache/cache_misses")}))
""")


def _train(script, workdir, steps):
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  for k in ("JAX_COMPILATION_CACHE_DIR", "XLA_FLAGS"):
    env.pop(k, None)
  overrides = [f"--config.train.steps={steps}", "--config.train.eval_every=1000",
               "--config.checkpoint.every=1000"]  # after OVERRIDES (tiny_config): these win
  p = subprocess.run([sys.executable, str(script), workdir, json.dumps(overrides)], cwd=ROOT,
                     env=env, capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
  line = [s for s in p.stdout.splitlines() if s.startswith("RESULT ")][-1]
  return json.loads(line.removeprefix("RESULT "))


@pytest.mark.slow  # two fresh processes that each build a tokenizer and train (~55 s)
def test_a_restarted_run_reads_its_compiled_programs_back(tmp_path):
  script = tmp_path / "run.py"
  script.write_text(_RUN)
  workdir = str(tmp_path / "run")
  first = _train(script, workdir, 2)
  cache = os.path.join(workdir, "compilation_cache")
  assert first["step"] == 2 and first["cache_dir"] == cache
  assert first["hits"] == 0 and first["misses"] > 0
  written = [f for f in os.listdir(cache) if not f.startswith(".")]
  assert written, "the first run wrote no cache entries"
  second = _train(script, workdir, 4)  # the restart: resumes from step 2
  assert second["step"] == 4 and second["cache_dir"] == cache
  assert second["hits"] > 0, second


def test_a_second_run_in_the_process_switches_to_its_own_cache(tmp_path, monkeypatch):
  import jax
  session = jax.config.jax_compilation_cache_dir
  try:
    jax.config.update("jax_compilation_cache_dir", None)  # as in a process of its own
    monkeypatch.setattr(compile_cache, "_set_here", None)
    a = compile_cache.enable("{workdir}/cc", str(tmp_path / "a"))
    assert a == str(tmp_path / "a" / "cc") and os.path.isdir(a)
    assert jax.config.jax_compilation_cache_dir == a
    b = compile_cache.enable("{workdir}/cc", str(tmp_path / "b"))
    assert b == str(tmp_path / "b" / "cc") and jax.config.jax_compilation_cache_dir == b
    assert compile_cache.enable("", str(tmp_path / "c")) is None  # off: none at all
    assert not jax.config.jax_compilation_cache_dir
  finally:
    from jax.experimental.compilation_cache import compilation_cache as cc
    cc.reset_cache()
    jax.config.update("jax_compilation_cache_dir", session)
