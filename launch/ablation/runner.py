"""The study loop: arms one after another in this process, or several at once as
subprocesses on disjoint device slices; a study-level state file; the report at the end.

<workdir>/study.json holds each arm's status (pending / running / done / failed) and
start and end times; <workdir>/arms/<arm>/fingerprint.txt the hash of the arm's resolved
config and evaluation settings. A finished arm (result.json) with the same fingerprint is
skipped; one with a different fingerprint is an error (the study file changed under a
work directory that holds results: use a new --workdir, or delete that arm's directory).
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

from launch.ablation import arm as arm_lib
from launch.ablation import report
from launch.ablation import study as study_lib

log = logging.getLogger("encoder_zoo")
# chips per arm -> TPU_CHIPS_PER_PROCESS_BOUNDS on one TPU VM host
TPU_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
TPU_PORT = 8476


def slice_env(platform: str, index: int, per_arm: int, env=None) -> dict:
  """The environment that gives worker `index` its own `per_arm` devices."""
  env = dict(os.environ if env is None else env)
  ids = ",".join(str(i) for i in range(index * per_arm, (index + 1) * per_arm))
  if platform == "cpu":
    flags = [f for f in env.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={per_arm}"])
    env["JAX_PLATFORMS"] = "cpu"
  elif platform == "gpu":
    env["CUDA_VISIBLE_DEVICES"] = ids
  elif platform == "tpu":
    if per_arm not in TPU_BOUNDS:
      raise study_lib.StudyError(f"--devices_per_arm={per_arm} on TPU: expected one of "
                                 f"{sorted(TPU_BOUNDS)} chips")
    port = TPU_PORT + index
    env.update(TPU_VISIBLE_CHIPS=ids, TPU_VISIBLE_DEVICES=ids,
               TPU_CHIPS_PER_PROCESS_BOUNDS=TPU_BOUNDS[per_arm], TPU_PROCESS_BOUNDS="1,1,1",
               TPU_PROCESS_PORT=str(port), TPU_MESH_CONTROLLER_ADDRESS=f"localhost:{port}",
               TPU_MESH_CONTROLLER_PORT=str(port))
  else:
    raise study_lib.StudyError(f"--platform={platform!r}: expected cpu, gpu or tpu")
  return env


class State:
  """<workdir>/study.json, written by the parent only."""

  def __init__(self, workdir, study):
    self.path = os.path.join(workdir, "study.json")
    self.data = arm_lib.read_json(self.path, None) or {"study": study.name, "arms": {}}
    if self.data.get("study") != study.name:
      raise study_lib.StudyError(f"{workdir} holds study {self.data.get('study')!r}, not "
                                 f"{study.name!r}: use another --workdir")

  def mark(self, arm, status, **extra):
    rec = self.data["arms"].setdefault(arm, {})
    rec.update(status=status, **extra)
    rec[f"{status}_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    arm_lib.write_json(self.path, self.data)


def _arm_steps(study, arm, workdir):
  """None, or the steps that give `arm` the pretraining FLOPs of its match_flops_of arm."""
  ref = study.arms[arm].get("match_flops_of", "")
  if not ref:
    return None
  done = arm_lib.read_json(os.path.join(workdir, "arms", ref, "result.json"))
  if done is None:
    return -1  # not known yet
  per_step = arm_lib.step_flops(study_lib.arm_config(study, arm))
  return max(1, int(round(done["pretrain_flops"] / per_step)))


def claim(study, arm, workdir, steps):
  """The arm's fingerprint written (or checked against the one there); True when the
  arm is already done."""
  arm_dir = os.path.join(workdir, "arms", arm)
  os.makedirs(arm_dir, exist_ok=True)
  fp = study_lib.fingerprint(study, arm, study_lib.arm_config(study, arm, steps))
  path = os.path.join(arm_dir, "fingerprint.txt")
  if os.path.isfile(path):
    old = open(path).read().strip()
    if old != fp:
      raise study_lib.StudyError(
          f"arm {arm!r} in {workdir} was run with another config or evaluation (fingerprint "
          f"{old} != {fp}): use a new --workdir or delete {arm_dir}")
  else:
    with open(path, "w") as f:
      f.write(fp + "\n")
  done = arm_lib.read_json(os.path.join(arm_dir, "result.json"))
  # A study given more (or other) seeds reruns the arm: its finished seeds are kept.
  return done is not None and list(done.get("seeds", [])) == list(study_lib.seeds_of(study))


def rows_of(study, workdir):
  out = []
  for arm in study_lib.arm_names(study):
    r = arm_lib.read_json(os.path.join(workdir, "arms", arm, "result.json"))
    if r is not None and r.get("seeds") == list(study_lib.seeds_of(study)):
      out.append(r)
  return out


def loadavg() -> str:
  """The 1, 5 and 15 minute load averages ("" where /proc/loadavg is missing)."""
  try:
    with open("/proc/loadavg") as f:
      return " ".join(f.read().split()[:3])
  except OSError:
    return ""


def run_study(study, workdir, arms=(), parallel=1, platform="cpu", devices_per_arm=1,
              worker_argv=None, command=""):
  """Runs the study's arms (all, or `arms`); writes the report; returns the rows."""
  t_start, load_start = time.time(), loadavg()
  study_lib.check_all(study)
  workdir = os.path.abspath(workdir)  # Orbax checkpoints need absolute paths
  names = study_lib.arm_names(study)
  for a in arms:
    if a not in names:
      raise study_lib.StudyError(f"--arms names {a!r}, not an arm of study {study.name!r} "
                                 f"({', '.join(names)})")
  todo = [a for a in names if not arms or a in arms]
  os.makedirs(workdir, exist_ok=True)
  state = State(workdir, study)
  if parallel <= 1:
    for a in todo:
      steps = _arm_steps(study, a, workdir)
      if steps == -1:
        raise study_lib.StudyError(f"arm {a!r} matches the FLOPs of "
                                   f"{study.arms[a].match_flops_of!r}, which has not run")
      if claim(study, a, workdir, steps):
        log.info("arm %s is done: skipped", a)
        state.mark(a, "done")
        continue
      state.mark(a, "running")
      try:
        arm_lib.run(study, a, workdir, steps)
      except BaseException:
        state.mark(a, "failed")
        raise
      state.mark(a, "done")
  else:
    _run_parallel(study, todo, workdir, state, parallel, platform, devices_per_arm,
                  worker_argv or [])
  rows = rows_of(study, workdir)
  ft = study.evaluate.get("finetune", None)
  baseline = arm_lib.majority_baseline(ft, workdir) if ft is not None else None
  info = {"load_start": load_start, "elapsed_s": time.time() - t_start}
  paths = report.write_all(study, rows, workdir, command, loadavg(), baseline, info)
  return rows, paths


def _run_parallel(study, todo, workdir, state, parallel, platform, per_arm, worker_argv):
  """Up to `parallel` workers at once, worker i on device slice i; an arm that matches
  another's FLOPs waits for it."""
  pending, running, free = list(todo), {}, list(range(parallel))
  logs = os.path.join(workdir, "logs")
  os.makedirs(logs, exist_ok=True)
  failed = []
  while pending or running:
    for a in list(pending):
      if not free:
        break
      steps = _arm_steps(study, a, workdir)
      if steps == -1:
        ref = study.arms[a].match_flops_of
        if ref not in running and ref not in pending:
          raise study_lib.StudyError(f"arm {a!r} waits for {ref!r}, which is not run")
        continue
      pending.remove(a)
      if claim(study, a, workdir, steps):
        log.info("arm %s is done: skipped", a)
        state.mark(a, "done")
        continue
      slot = free.pop(0)
      cmd = [sys.executable, "-m", "launch.ablate"] + worker_argv + ["--worker_arm", a]
      out = open(os.path.join(logs, f"{a}.log"), "a")
      proc = subprocess.Popen(cmd, env=slice_env(platform, slot, per_arm), stdout=out,
                              stderr=subprocess.STDOUT, cwd=study_lib.ROOT)
      running[a] = (proc, slot, out)
      state.mark(a, "running", slot=slot)
      log.info("arm %s started on slice %d (pid %d, log %s)", a, slot, proc.pid, out.name)
    time.sleep(1.0)
    for a, (proc, slot, out) in list(running.items()):
      if proc.poll() is None:
        continue
      out.close()
      del running[a]
      free.append(slot)
      ok = proc.returncode == 0 and os.path.isfile(
          os.path.join(workdir, "arms", a, "result.json"))
      state.mark(a, "done" if ok else "failed", returncode=proc.returncode)
      if not ok:
        failed.append(a)
        log.error("arm %s failed (exit %d): see %s", a, proc.returncode, out.name)
  if failed:
    raise RuntimeError(f"arms failed: {', '.join(failed)} (logs in {logs})")


def run_worker(study, workdir, arm):
  """One arm in this process (a --parallel worker): the parent has claimed it."""
  study_lib.check_all(study)
  workdir = os.path.abspath(workdir)
  steps = _arm_steps(study, arm, workdir)
  return arm_lib.run(study, arm, workdir, steps)
