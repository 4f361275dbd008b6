"""JAX's persistent compilation cache for training runs (`train.compilation_cache_dir`).

A restarted run (a preempted spot TPU, a crash, a rerun with more steps) compiles the
same programs again: BERT-large's train step takes ~3 minutes of XLA compilation
(`launch.aot`, docs/benchmarks.md), paid again at every restart. With the cache on, the
compiled executables are written to disk the first time and read back on the next start.

`train.compilation_cache_dir`:
  "{workdir}/compilation_cache" (the default): the run's own work directory, so the
      cache is exactly as trusted as the run's checkpoints, and a resume finds it;
  any other path (local, or gs:// with etils installed): e.g. one cache shared by a
      study's runs of the same model;
  "": off.

JAX keys each entry by the program, the compile options, the jaxlib and backend version
and the device kind, so an entry from another machine or version is not used. The cache
is trusted code (JAX's warning): a directory that others may write to lets them run code
in your process, so do not point it at one.

If the process already has a cache directory (`JAX_COMPILATION_CACHE_DIR`, or set by the
caller, e.g. the test suite), that one is kept and the config's is not applied. One set
here by an earlier run in the same process (the ablation runner's arms) is replaced by
the next run's.
Programs that compile in under a second are not written (JAX's default threshold).
"""
from __future__ import annotations

import logging
import os
from typing import Optional

import jax
from jax.experimental.compilation_cache import compilation_cache as cc

log = logging.getLogger(__name__)

WORKDIR = "{workdir}"
_set_here: Optional[str] = None  # the directory this module set, if it set one


def resolve(template: str, workdir: str) -> str:
  """The config value with `{workdir}` filled in; "" stays "" (off)."""
  if not isinstance(template, str):
    raise ValueError(f"train.compilation_cache_dir must be a string (a path, or '' for "
                     f"off), got {template!r}")
  template = template.strip()
  if not template:
    return ""
  rest = template.replace(WORKDIR, "")
  if "{" in rest or "}" in rest:
    raise ValueError(f"train.compilation_cache_dir={template!r}: the only placeholder is "
                     f"{WORKDIR}")
  return template.replace(WORKDIR, workdir)


def enable(template: str, workdir: str) -> Optional[str]:
  """Turns the cache on for this process; returns the directory in use (None: off)."""
  global _set_here
  path = resolve(template, workdir)
  current = jax.config.jax_compilation_cache_dir
  if current and current == _set_here:  # an earlier run in this process (e.g. an ablation)
    if path == current:
      return current
    cc.reset_cache()  # JAX reads the directory once; let the next compile read the new one
    jax.config.update("jax_compilation_cache_dir", None)
    _set_here = current = None
  if current:
    if path and path != current:
      log.info("compilation cache: keeping the process's %s (train.compilation_cache_dir "
               "%s not applied)", current, path)
    return current
  if not path:
    return None
  if "://" not in path:
    os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  _set_here = path
  log.info("compilation cache: %s", path)
  return path
