"""What we know about the machines: published chip peaks and HBM sizes, the CPU's measured
matmul rate, devices per chip, and memory use of a compiled program. Shared by the
trainer (MFU), launch.bench and launch.aot.

Peak: a TPU/GPU chip's published dense bf16 FLOP/s (table below); on the CPU the
measured FLOP/s of a large dense matmul in the compute dtype (`measure_cpu_matmul_flops`),
measured once per machine and cached (`cpu_peak_flops`), so that MFU is comparable
between runs instead of moving with the load at start-up.
"""
import json
import os
import platform
import resource
import time
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp

# Published dense bf16 peak FLOP/s per chip (TPU: per chip; GPU: dense, no sparsity).
PEAK_BF16 = {
    "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12,
    "TPU v5": 459e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12,
    "NVIDIA A100": 312e12, "NVIDIA H100": 989e12, "NVIDIA H200": 989e12,
    "NVIDIA B200": 2250e12,
}

# HBM per chip in GiB, by the device_kind the topology reports.
HBM_GIB = {
    "TPU v2": 16, "TPU v3": 32, "TPU v4": 32, "TPU v5 lite": 16, "TPU v5e": 16,
    "TPU v5p": 95, "TPU v5": 95, "TPU v6 lite": 32, "TPU v6e": 32,
}

_CPU_PEAK = {}


def lookup(table, device_kind: str):
  """`table`'s value for a device kind (the longest name it starts with or contains)."""
  for name, value in sorted(table.items(), key=lambda kv: -len(kv[0])):
    if device_kind.startswith(name) or name in device_kind:
      return value
  return None


def measure_cpu_matmul_flops(sizes=(1024, 2048), dtype="float32", repeats: int = 5,
                             cached: bool = True) -> float:
  """Measured dense-matmul FLOP/s of this CPU: the best over square matmuls of `sizes`
  (jitted, all cores, `repeats` timings each) — the CPU's "peak". Cached per process
  unless `cached=False` (a benchmark measures it again at each end of its run)."""
  if isinstance(sizes, int):
    sizes = (sizes,)
  key = (tuple(sizes), str(dtype))
  if key not in _CPU_PEAK or not cached:
    f = jax.jit(lambda x, y: x @ y)
    rates = []
    for n in sizes:
      a = jnp.ones((n, n), dtype)
      b = jnp.full((n, n), 0.5, dtype)
      rates.append(best_rate(lambda: f(a, b).block_until_ready(), 2 * n ** 3, repeats))
    _CPU_PEAK[key] = max(rates)
  return _CPU_PEAK[key]


def best_rate(run, flops: float, repeats: int) -> float:
  """FLOP/s of the fastest of `repeats` timed calls of `run` (which does `flops` and
  returns when done), after one untimed call. Shared by JAX's and torch's peak probes."""
  run()
  best = 0.0
  for _ in range(repeats):
    t = time.perf_counter()
    run()
    best = max(best, flops / (time.perf_counter() - t))
  return best


def peak_devices(devices) -> int:
  """How many devices' peaks a step has: one on the CPU, whose "devices" (real or
  --xla_force_host_platform_device_count) share the cores its measured matmul already
  used in full; else each device."""
  devices = list(devices)
  return 1 if devices[0].platform == "cpu" else len(devices)


CPU_PEAK_ENV = "ENCODER_ZOO_CPU_PEAK_FLOPS"  # a fixed CPU peak (FLOP/s) instead
IDLE_LOAD_PER_CORE = 0.25  # a measurement under less load per core than this is final...
CPU_PEAK_MAX_AGE_S = 24 * 3600  # ...for a day: a cloud VM's matmul rate moves between days


def cpu_peak_cache_path() -> str:
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "encoder_zoo", "cpu_peak.json")


def _cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def cpu_peak_flops(dtype="float32", path=None, measure=None) -> float:
  """The CPU's peak FLOP/s for MFU: `$ENCODER_ZOO_CPU_PEAK_FLOPS` if set, else the dense
  matmul rate measured once on this machine (CPU model, core count, dtype) and cached in
  `~/.cache/encoder_zoo/cpu_peak.json`. A measurement taken while the machine was busy
  (load average above IDLE_LOAD_PER_CORE per core) is used but measured again at the
  next start, keeping the best; one taken on an idle machine holds for CPU_PEAK_MAX_AGE_S.
  An older entry is measured again and replaced: the same VM type gave 185 to 383
  GFLOP/s in float32 on different days, and a stale peak makes every MFU wrong. (The
  benchmarks measure the peak in their own run instead: launch/perf/bench/runs.py.)"""
  if os.environ.get(CPU_PEAK_ENV):
    return float(os.environ[CPU_PEAK_ENV])
  path = path or cpu_peak_cache_path()
  measure = measure or (lambda: measure_cpu_matmul_flops(dtype=dtype))
  key = f"{_cpu_name()} x{os.cpu_count()} {dtype}"
  try:
    with open(path) as f:
      table = json.load(f)
  except (OSError, ValueError):
    table = {}
  now = time.time()
  entry = table.get(key)
  if entry and now - float(entry.get("measured_at", 0)) > CPU_PEAK_MAX_AGE_S:
    entry = None  # from another day: this machine may not run at that rate now
  if entry and entry.get("idle"):
    return float(entry["flops"])
  load = os.getloadavg()[0] / max(1, os.cpu_count() or 1)
  flops = measure()
  if entry:
    flops = max(flops, float(entry["flops"]))
  table[key] = {"flops": flops, "idle": bool(load < IDLE_LOAD_PER_CORE),
                "load_per_core": round(load, 3), "measured_at": now}
  try:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
      json.dump(table, f, indent=1)
    os.replace(tmp, path)
  except OSError:  # a read-only home: the peak is still used, just not kept
    pass
  return flops


def chip_peak_flops(device_kind: str) -> float:
  """Published dense bf16 peak of a TPU/GPU chip by `device_kind`; 0.0 when unknown."""
  return lookup(PEAK_BF16, device_kind) or 0.0


def peak_flops(device, dtype: str = "float32") -> float:
  """Peak FLOP/s of one device: the published bf16 peak for TPU/GPU; on the CPU measured
  once per machine and cached (`cpu_peak_flops`, in the compute dtype)."""
  if device.platform == "cpu":
    return cpu_peak_flops(dtype)
  return chip_peak_flops(getattr(device, "device_kind", ""))


def hbm_per_chip(device_kind: str) -> Optional[float]:
  """HBM bytes of one chip by `device_kind`; None when unknown."""
  gib = lookup(HBM_GIB, device_kind)
  return None if gib is None else gib * 2**30


def cores_per_chip(devices) -> int:
  """JAX devices per physical chip (1 with megacore; 2 where each TensorCore is one)."""
  coords = {tuple(getattr(d, "coords", (i,))) for i, d in enumerate(devices)}
  return max(1, len(devices) // max(1, len(coords)))


def memory_bytes(compiled, code: bool = False) -> Optional[int]:
  """Per-device bytes XLA assigned to the compiled program's buffers at once: arguments
  + outputs - donated (aliased) + temporaries (+ the program's code with `code`)."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # pragma: no cover - backends without the analysis
    return None
  if m is None:
    return None
  return int(m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
             + m.temp_size_in_bytes + (m.generated_code_size_in_bytes if code else 0))


def measured_peak_bytes() -> Dict[str, Any]:
  """The device's measured peak memory where it reports one, else the process's RSS."""
  stats = jax.devices()[0].memory_stats()
  if stats and "peak_bytes_in_use" in stats:
    return {"device_peak_bytes": int(stats["peak_bytes_in_use"])}
  return {"process_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
