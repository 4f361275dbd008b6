"""One trainer per work directory: an exclusive lock on `WORKDIR/.lock`.

  with lock.hold(workdir):        # raises WorkdirLocked when another trainer holds it
    ...                           # the run
  handle = lock.acquire(workdir)  # the same without a block; lock.release(handle)

The lock is an `fcntl.flock` on `WORKDIR/.lock`, held as long as the file stays open. The
holder writes its PID, host and start time into the file as JSON, so a second trainer
refuses in one line naming them (`WorkdirLocked`, a `cli.ConfigError`: exit status 2).
The kernel drops the lock when the holder exits, however it exits (kill -9 included), so
a stale file never blocks a restart; the file itself is left in place (removing it would
let two trainers lock two different files).

Only local (and locally mounted) directories are locked: a `gs://` work directory is
skipped with a log line (object stores have no advisory locks). `flock` on an NFS mount
may be local to one client, depending on the mount. In a multi-process run only process
0 takes the lock (`enabled=False` on the others): the processes share the directory.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import socket
from typing import Optional

from launch.cli import ConfigError

log = logging.getLogger("encoder_zoo")

LOCK_FILE = ".lock"


class WorkdirLocked(ConfigError):
  """Another live process holds the work directory's lock."""


class Handle:
  """A held lock: the open file whose `flock` it is (None when nothing was locked)."""

  def __init__(self, path: Optional[str], fd: Optional[int]):
    self.path, self.fd = path, fd

  @property
  def held(self) -> bool:
    return self.fd is not None


def holder(workdir: str) -> dict:
  """What the lock file says about its holder ({} when unreadable or empty)."""
  try:
    with open(os.path.join(workdir, LOCK_FILE)) as f:
      info = json.load(f)
  except (OSError, ValueError):
    return {}
  return info if isinstance(info, dict) else {}


def _refusal(workdir: str) -> WorkdirLocked:
  info = holder(workdir)
  who = f"pid {info.get('pid', '?')} on host {info.get('host', '?')}"
  since = f", since {info['started']}" if info.get("started") else ""
  return WorkdirLocked(
      f"work directory {workdir} is in use by another trainer ({who}{since}); wait for it "
      "to end, or use another --workdir")


def acquire(workdir: str, enabled: bool = True) -> Handle:
  """Locks `workdir` (which must exist) for this process; -> a Handle for `release`.
  Raises WorkdirLocked naming the holder when another process has it."""
  if not enabled:
    return Handle(None, None)
  if "://" in workdir:
    log.info("work directory %s is not a local path: not locked (a second trainer on it "
             "is not detected)", workdir)
    return Handle(None, None)
  path = os.path.join(workdir, LOCK_FILE)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    raise _refusal(workdir) from None
  except BaseException:
    os.close(fd)
    raise
  info = {"pid": os.getpid(), "host": socket.gethostname(),
          "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
              timespec="seconds")}
  os.ftruncate(fd, 0)
  os.pwrite(fd, json.dumps(info).encode() + b"\n", 0)
  return Handle(path, fd)


def release(handle: Handle) -> None:
  """Drops the lock (a no-op for a Handle that holds none, or one released already)."""
  if handle.fd is None:
    return
  fd, handle.fd = handle.fd, None
  try:
    os.ftruncate(fd, 0)  # the holder's details go with the lock
    fcntl.flock(fd, fcntl.LOCK_UN)
  finally:
    os.close(fd)


@contextlib.contextmanager
def hold(workdir: str, enabled: bool = True):
  """`acquire` for the block, `release` after it (also on an exception)."""
  handle = acquire(workdir, enabled)
  try:
    yield handle
  finally:
    release(handle)
