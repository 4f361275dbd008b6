import os
import shutil
import tempfile

# A fake 8-device CPU mesh for the sharding tests; must be set before JAX starts.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# The suite compiles hundreds of small programs and runs each a few times: XLA's CPU
# backend optimisations cost more compile time than they save run time here. The numbers
# tests compare (float32 parity with transformers) do not depend on them. Subprocesses
# started by tests inherit these flags.
_FAST_COMPILE = ("--xla_backend_optimization_level=0",
                 "--xla_llvm_disable_expensive_passes=true")
for _flag in _FAST_COMPILE:
  if _flag.split("=")[0] not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " " + _flag
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# A fixed CPU peak for MFU (launch/trainer/devices.py): no test judges the CPU's MFU, and the
# measured one would cost a matmul benchmark per process and write ~/.cache/encoder_zoo.
os.environ.setdefault("ENCODER_ZOO_CPU_PEAK_FLOPS", "1e11")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

_CACHE_DIR = None


def pytest_configure(config):
  """A persistent compilation cache private to this test session: many tests build the
  same tiny models and steps, so identical programs compile once. Set through jax.config
  (not the environment) so subprocesses do not share it; removed when the session ends."""
  global _CACHE_DIR
  import jax  # pylint: disable=g-import-not-at-top
  _CACHE_DIR = tempfile.mkdtemp(prefix="encoder_zoo_test_jax_cache_")
  jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
  # Programs that compile in under 0.1 s (the tests' op-by-op calls: thousands of them) are
  # not written: writing costs more than recompiling them.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config):
  if _CACHE_DIR:
    shutil.rmtree(_CACHE_DIR, ignore_errors=True)
