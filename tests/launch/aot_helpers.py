"""Shared helpers of the launch.aot tests: libtpu (the TPU compiler), installed into
`.cache/libtpu` of the repository when the environment has none, and the command run
with it."""
import os
import subprocess
import sys

import pytest

from launch.perf import aot

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def libtpu():
  path = aot.find_libtpu()
  if path:
    return path
  target = os.path.dirname(os.path.dirname(aot.LOCAL_LIBTPU))
  cmd = [sys.executable, "-m", "pip", "install", "-q", "--target", target,
         aot.libtpu_requirement()]
  try:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
  except (OSError, subprocess.TimeoutExpired) as e:
    pytest.skip(f"libtpu could not be installed ({e}); the TPU compiler comes with it")
  if p.returncode != 0 or aot.find_libtpu() is None:
    pytest.skip("libtpu could not be installed (pip said: "
                f"{(p.stderr or p.stdout).strip()[-300:]}); the TPU compiler comes with it")
  return aot.find_libtpu()


def run_aot(args, libtpu_path, timeout=600, **env_vars):
  """`python -m launch.aot ARGS` with the TPU compiler of `libtpu_path`."""
  env = dict(os.environ, TPU_LIBRARY_PATH=libtpu_path, XLA_FLAGS="", **env_vars)
  return subprocess.run([sys.executable, "-m", "launch.aot", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)
