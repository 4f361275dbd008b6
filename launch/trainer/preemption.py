"""Stopping on SIGTERM (spot / preemptible capacity) so that every process saves the same step.

One process: a SIGTERM handler sets a flag; the loop finishes the step, saves and returns.

Several JAX processes (`jax.distributed.initialize`): the signal usually reaches one host
first (or only one), and a checkpoint saved at different steps on different hosts would be
torn. JAX's preemption sync point agrees on the step: `jax.distributed` installs a SIGTERM
notifier in every process, the coordination service spreads the notice, and
`multihost_utils.reached_preemption_sync_point(step)`, called by every process at every
step, returns True on all processes at the same step. No Python signal handler is
installed then (it would replace JAX's notifier).
"""
import logging
import signal
import threading

import jax
from jax._src import distributed  # private: no public way to ask for the preemption sync manager
from jax.experimental import multihost_utils

log = logging.getLogger("encoder_zoo")


def _sync_manager_ready() -> bool:
  try:
    return distributed.global_state.preemption_sync_manager is not None
  except Exception:  # pylint: disable=broad-except
    return False


class StopFlag:
  """`requested` turns True on every process at the same step after a SIGTERM anywhere."""

  def __init__(self):
    self.requested = False
    self.multihost = jax.process_count() > 1 and _sync_manager_ready()

  def install(self):
    if self.multihost:
      return  # JAX's own notifier catches SIGTERM (see the module docstring)
    if threading.current_thread() is threading.main_thread():
      signal.signal(signal.SIGTERM, lambda *_: setattr(self, "requested", True))

  def poll(self, step: int) -> bool:
    """Called by every process after every step; True when the run must save and stop."""
    if self.multihost and not self.requested:
      if multihost_utils.reached_preemption_sync_point(step):
        log.info("preemption: all %d processes stop at step %d", jax.process_count(), step)
        self.requested = True
    return self.requested
