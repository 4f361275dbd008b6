import os

# A fake 8-device CPU mesh for the sharding tests; must be set before JAX starts.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Under pytest-xdist (one worker per core) each worker's torch keeps to one intra-op
# thread: two workers with two spinning OpenMP threads each oversubscribe the cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
  os.environ.setdefault("OMP_NUM_THREADS", "1")
