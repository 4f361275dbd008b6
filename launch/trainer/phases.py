"""Where the training loop's wall time goes: a per-phase timer the loop can be given
(`train_and_evaluate(..., phases=Phases())`), used by `python -m launch.bench --mode loop`.

The loop wraps each part of its step body in `phases(name)`: input iteration, host-to-
device copy, step dispatch, waiting for the device (only at log steps: the loop never
syncs otherwise), metrics/logging, eval and checkpoint. The host thread's wall time is
split between them, so the phases add up to the loop's wall time. The timed window opens
when the first step has been dispatched (its compilation excluded) and closes when the
last checkpoint is written; the process's CPU time (user, system) and minor page faults
over the same window are taken with `resource.getrusage`.

Without a `Phases` the loop uses `NULL`, whose context manager does nothing.
"""
import contextlib
import resource
import time
from typing import Dict, Optional


def usage() -> Dict[str, float]:
  """The process's CPU seconds (user, system) and minor/major page faults so far."""
  r = resource.getrusage(resource.RUSAGE_SELF)
  return {"user_s": r.ru_utime, "sys_s": r.ru_stime, "minflt": r.ru_minflt,
          "majflt": r.ru_majflt}


def usage_delta(a: Dict[str, float], b: Dict[str, float]) -> Dict[str, float]:
  return {k: b[k] - a[k] for k in a}


class Phases:
  """Accumulated wall seconds per phase, over the steps after the first."""

  def __init__(self):
    self.seconds: Dict[str, float] = {}
    self._open: Dict[str, float] = {}
    self.first_step: Optional[int] = None
    self.steps = 0
    self._t0 = self._u0 = None
    self.wall_s = 0.0
    self.usage: Dict[str, float] = {}

  @contextlib.contextmanager
  def __call__(self, name: str):
    self.start(name)
    try:
      yield
    finally:
      self.stop(name)

  def start(self, name: str):
    self._open[name] = time.perf_counter()

  def stop(self, name: str):
    t = self._open.pop(name)
    if self._t0 is not None:
      self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t

  def step_dispatched(self, step: int):
    """Called after each step's dispatch; the first call opens the timed window (the
    compile of the first step stays outside it)."""
    if self._t0 is None:
      self.first_step = step
      self._u0, self._t0 = usage(), time.perf_counter()
    else:
      self.steps += 1

  def finish(self):
    if self._t0 is not None:
      self.wall_s = time.perf_counter() - self._t0
      self.usage = usage_delta(self._u0, usage())

  def report(self) -> Dict[str, float]:
    """{"wall_s", "steps" (timed), "phases_s": {name: s} with "other" the rest,
    "usage": CPU and page-fault deltas}."""
    phases = dict(self.seconds)
    phases["other"] = max(0.0, self.wall_s - sum(phases.values()))
    return {"wall_s": self.wall_s, "steps": self.steps, "phases_s": phases,
            "usage": dict(self.usage)}


class _Null:
  """The loop's default: no timing."""

  def __call__(self, name):
    return contextlib.nullcontext()

  def start(self, name):
    pass

  def stop(self, name):
    pass

  def step_dispatched(self, step):
    pass

  def finish(self):
    pass


NULL = _Null()
