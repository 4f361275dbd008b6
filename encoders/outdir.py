"""Output directories the project writes: never delete or overwrite what a user owns.

Every directory a writer of this project makes (an HF export, a converted checkpoint, a
`jax.export` artifact, preprocessed shards, a run's work directory) holds a marker file,
`MARKER`, naming the writer. A writer may replace a directory only when it is absent,
empty, or holds that marker: its own earlier output. Anything else is refused with an
`OutputDirError` naming the path, before any work is done.

`atomic_dir(path, what)` writes a whole directory atomically: the caller fills a temporary
sibling directory, which is renamed into place only when the block ends without an
exception. A crash leaves the old output (or nothing) in place, never a half-written one.
`claim_dir(path, what)` is for directories filled over time (a run's work directory,
resumable shards): it creates the directory with the marker, or accepts one that is
already ours.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import socket
import tempfile
import uuid

MARKER = ".encoder_zoo_output"


class OutputDirError(ValueError):
  """A writer was pointed at a path it must not write: names the path and the fix."""


def is_ours(path: str) -> bool:
  """True when `path` is a directory holding this project's marker file."""
  return os.path.isfile(os.path.join(path, MARKER))


def writer_of(path: str) -> str | None:
  """The writer named in `path`'s marker, or None."""
  try:
    with open(os.path.join(path, MARKER)) as f:
      return json.load(f).get("writer")
  except (OSError, ValueError, AttributeError):
    return None


def check_target(path: str, what: str, writers=None) -> None:
  """Raises OutputDirError unless `path` is absent, an empty directory, or ours; with
  `writers` (name prefixes), ours only when its marker names one of them (a directory
  holding nothing but a marker counts as empty)."""
  if not os.path.lexists(path):
    return
  if os.path.islink(path) or not os.path.isdir(path):
    raise OutputDirError(f"{what} {path} exists and is not a directory; choose a new path")
  names = os.listdir(path)
  if names and not is_ours(path):
    raise OutputDirError(
        f"{what} {path} is a non-empty directory this project did not write (no {MARKER} "
        "marker); refusing to overwrite it: choose a new or empty directory")
  writer = writer_of(path) or ""
  if (writers is not None and names not in ([], [MARKER])
      and not writer.startswith(tuple(writers))):
    raise OutputDirError(
        f"{what} {path} holds the output of {writer or 'another tool'}; refusing to write "
        "into it: choose a new or empty directory")


def write_marker(path: str, what: str) -> None:
  info = {"writer": what, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec="seconds"), "host": socket.gethostname(), "pid": os.getpid()}
  tmp = os.path.join(path, f"{MARKER}.{uuid.uuid4().hex}.tmp")
  with open(tmp, "w") as f:
    json.dump(info, f)
  os.replace(tmp, os.path.join(path, MARKER))


def modes_from_umask(directory: str) -> None:
  """mkdtemp makes 0700 directories and safetensors 0600 files: give the output the modes
  the user's umask gives every other file (0755 / 0644 under umask 022), recursively."""
  mask = os.umask(0)
  os.umask(mask)
  for root, _, files in os.walk(directory):
    os.chmod(root, 0o777 & ~mask)
    for name in files:
      os.chmod(os.path.join(root, name), 0o666 & ~mask)


@contextlib.contextmanager
def atomic_dir(path: str, what: str, check=None):
  """Yields a temporary directory to fill; on success it replaces `path` (which must be
  absent, empty or ours: checked before and again at the swap). On an exception the
  temporary directory is removed and `path` is untouched. `check(path)`, when given,
  replaces `check_target` (both times): a writer that may replace only some of this
  project's directories (e.g. an HF export, never a run's work directory) says which."""
  path = os.path.abspath(path)
  check = check or (lambda p: check_target(p, what))
  check(path)
  parent = os.path.dirname(path)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
  try:
    yield tmp
    write_marker(tmp, what)
    modes_from_umask(tmp)
    check(path)  # nothing of the user's (or another writer's) appeared meanwhile
    old = None
    if os.path.lexists(path) and os.listdir(path):
      old = os.path.join(parent, f".{os.path.basename(path)}.old-{uuid.uuid4().hex[:8]}")
      os.rename(path, old)
    os.replace(tmp, path)  # over an absent or empty directory
    if old is not None:
      shutil.rmtree(old, ignore_errors=True)  # our own earlier output (checked above)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def claim_dir(path: str, what: str, writers=None) -> str:
  """Creates `path` with the marker, or accepts it when it is empty or already ours (with
  `writers`: marked by one of them, as `check_target`). -> the absolute path. Raises
  OutputDirError for anything else."""
  path = os.path.abspath(path)
  check_target(path, what, writers)
  os.makedirs(path, exist_ok=True)
  if not is_ours(path):
    write_marker(path, what)
  return path
