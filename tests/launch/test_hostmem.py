"""launch/trainer/hostmem.py: with the tuned allocator, a large buffer allocated and freed every
step (as XLA's CPU runtime does with a step's temporaries) stops page-faulting."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = """
import ctypes, resource, sys
from launch.trainer import hostmem
applied = hostmem.tune_malloc() if sys.argv[1] == "tuned" else False
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 64 << 20
def step():
  p = libc.malloc(size)
  ctypes.memset(p, 1, size)  # touch every page, as a step's temporaries are
  libc.free(p)
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
  step()
print(applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5)
"""


def _faults(mode, env=None):
  out = subprocess.run([sys.executable, "-c", CHILD, mode], cwd=REPO, check=True,
                       capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": REPO, **(env or {})}).stdout.split()
  return out[0] == "True", float(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tuned_malloc_reuses_a_large_freed_buffer():
  applied, tuned = _faults("tuned")
  assert applied
  _, system = _faults("system")
  pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
  assert system >= 0.9 * pages  # glibc: a fresh mmap every step, every page faults again
  assert tuned < 0.05 * pages  # tuned: the same heap pages every step
  applied, opted_out = _faults("tuned", {"ENCODER_ZOO_MALLOC": "system"})
  assert not applied and opted_out >= 0.9 * pages
