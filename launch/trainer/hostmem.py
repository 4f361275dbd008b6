"""Host allocator settings for the training loop (glibc only; a no-op elsewhere).

Why: XLA's CPU runtime allocates each execution's temporaries as ONE buffer (for the
tiny BERT main job's train step, 187,523,072 bytes, seen with strace) and frees it when
the step ends. glibc serves any request above its mmap threshold (at most 32 MiB) with a
fresh `mmap` and returns it with `munmap`, and a thread's own arena cannot hold it
either (its heaps are at most 64 MiB), so every step the kernel maps and zeroes those
pages again: ~46,000 minor page faults per step, and ~25% of the process's CPU time in
the kernel. With `tune_malloc()`:
  - M_ARENA_MAX=1: one arena (the brk heap), which can grow to hold the buffer;
  - M_MMAP_MAX=0: no allocation is served by its own mmap;
  - M_TRIM_THRESHOLD=-1 (glibc: trimming disabled): free memory at the top of the heap is
    kept, not given back to the kernel, so the next step reuses the same (already
    mapped) pages. It was 2 GiB - 1 (the largest positive value) until ModernBERT-base's
    train step at batch 8 x 128 freed more than that at once: the top was trimmed every
    step and refaulted (12.8 s a step, 75 s of system time over the bench; with -1:
    9.2 s, and the faults no longer grow with the number of steps).
The cost: freed memory stays in the process (its RSS stays at its peak) instead of
going back to the OS, and threads share one arena.

What it cannot fix: XLA allocates with posix_memalign, and glibc before its memalign
rework (this machine's 2.36 included) cannot serve an aligned request of n bytes from a
freed block of exactly n bytes (sourceware bug 14581). With BERT-base at batch 32 x 128
(a ~4.9 GB block a step) the heap grows by one block in each of the first three steps of
a training loop, faulting ~1.2 M pages each time, then stays put, at ~2.6x the memory
the step needs (docs/benchmarks.md, "Why BERT-base faults"). The main job's tiny model
faults ~2-3k pages a step with these settings.

It must run before JAX creates its CPU client (and its worker threads, which would pick
their arenas), so the entry points call it first thing (launch/pretrain.py,
launch/bench). `ENCODER_ZOO_MALLOC=system` leaves glibc's defaults alone.
"""
import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8  # glibc's <malloc.h>
SETTINGS = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))
ENV = "ENCODER_ZOO_MALLOC"

_applied = None


def tune_malloc() -> bool:
  """Applies SETTINGS once per process; True when they are in effect."""
  global _applied
  if _applied is not None:
    return _applied
  _applied = False
  if os.environ.get(ENV, "") == "system" or not sys.platform.startswith("linux"):
    return False
  try:
    libc = ctypes.CDLL("libc.so.6")
    libc.gnu_get_libc_version  # glibc, not musl
  except (OSError, AttributeError):
    return False
  _applied = all(libc.mallopt(param, value) == 1 for param, value in SETTINGS)
  return _applied
