"""`--mode loop`: the whole training loop timed, not just the step, optionally next to a
plain PyTorch loop doing the same work in the same process.

Ours: the real trainer (`launch.trainer.train_and_evaluate`) for `--steps` steps in a
work directory (`--workdir`, default a temporary one): the real pipeline (Grain iteration,
tokenizer and data caches of the workdir), on-device masking, the step, metric logging
every `train.log_every` steps and the checkpoints (every `checkpoint.every` steps and at
the last). Held-out evaluation is off (`train.eval_batches=0`: the torch loop has none)
and the end-of-run export is outside the timing. The loop's phases
(launch/trainer/phases.py) split the wall time of the steps after the first (whose
compile is excluded): input iteration, host-to-device, step dispatch, device wait (at log
steps: the loop syncs nowhere else), metrics/logging, checkpoint.

Theirs (`--compare-hf`): transformers' class of the same architecture loaded with our
trained weights, `torch.optim.AdamW` (or the LAMB of launch/perf/bench/models.py) with the same
hyper-parameters, weight decay groups, clipping and linear warmup/decay schedule. Every
step reads the next batch from a fresh iterator of the same pipeline (the same rows in
the same order as ours), masks on the host as a data collator would (mask_rate of the
non-special tokens, at most the objective's prediction budget per row, 80/10/10
replacement), runs the encoder, the MLM head on the gathered masked positions only (the
same number of positions as our head: the same work as ours), the pair head if the
objective has one, backward, clipping and the optimizer step. The first step is excluded
too. Both sides report tokens/s (wall), CPU seconds (user, system) and minor page faults
per step over their timed window; the ratio is ours/theirs in tokens/s, and in tokens
per CPU second (more robust on a loaded machine).
"""
import os
import shutil
import tempfile
import time
from typing import Any, Dict

import jax
import ml_collections

from encoders import base
from launch import trainer
from launch.perf import runinfo
from launch.trainer import phases as phases_lib
from launch.trainer import pretraining as loop_lib

CACHES = ("tokenizer", "data_cache")  # launch/data's caches in a workdir


def loop_config(config, steps: int):
  """A private copy of `config` for `steps` timed steps: eval off, warmup within the run,
  a checkpoint at the end (and every `checkpoint.every` steps as configured)."""
  if steps < 2:
    raise ValueError(f"--steps={steps}: the loop needs at least 2 steps (the first one "
                     "compiles and is not timed)")
  c = ml_collections.ConfigDict(config.to_dict())
  c.train.steps = steps
  c.train.eval_batches = 0
  c.optimizer.warmup_steps = min(int(c.optimizer.warmup_steps), steps)
  c.logging.plot = False
  return c


def _side(tokens_per_step: int, rep: Dict[str, Any]) -> Dict[str, Any]:
  steps, wall, u = rep["steps"], rep["wall_s"], rep["usage"]
  cpu = u["user_s"] + u["sys_s"]
  return {**rep, "tokens_per_s": tokens_per_step * steps / wall if wall else float("nan"),
          "tokens_per_cpu_s": tokens_per_step * steps / cpu if cpu else float("nan"),
          "step_time_s": wall / steps if steps else float("nan"),
          "minflt_per_step": u["minflt"] / steps if steps else float("nan"),
          "sys_over_user": u["sys_s"] / u["user_s"] if u["user_s"] else float("nan")}


def run_ours(config, workdir: str) -> Dict[str, Any]:
  ph = phases_lib.Phases()
  result = trainer.train_and_evaluate(config, workdir, phases=ph)
  return {"report": ph.report(), "result": result}


def bench_loop(config, steps: int, compare_hf: bool = False, workdir: str = "",
               log=print) -> Dict[str, Any]:
  """Runs ours (and theirs) for `steps` steps; see the module docstring."""
  config = loop_config(config, steps)
  tmp = None
  if not workdir:
    tmp = tempfile.TemporaryDirectory()
    workdir = tmp.name
  run_dir = os.path.join(os.path.abspath(workdir), f"loop_run_{os.getpid()}")
  try:
    # A fresh run (no checkpoint to resume) that shares the workdir's tokenizer and data
    # caches, so a kept --workdir trains the tokenizer once.
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    for cache in CACHES:
      os.makedirs(os.path.join(workdir, cache), exist_ok=True)
      os.symlink(os.path.abspath(os.path.join(workdir, cache)), os.path.join(run_dir, cache))
    t = time.perf_counter()
    ours = run_ours(config, run_dir)
    ours_total = time.perf_counter() - t
    setup = ours["result"]["setup"]
    prepared, pipeline = loop_lib.prepare(config, run_dir)
    base.resolve_auto(prepared.model, jax.devices()[0].platform)
    tokens = int(prepared.data.global_batch) * int(prepared.data.seq_len)
    result = {"mode": "loop", "steps": steps, "batch": int(prepared.data.global_batch),
              "seq": int(prepared.data.seq_len), "dtype": prepared.model.dtype,
              "config": runinfo.config_summary(prepared, setup.objective),
              "log_every": int(prepared.train.log_every),
              "checkpoint_every": int(prepared.checkpoint.every),
              "ours": _side(tokens, ours["report"]), "ours_total_s": ours_total}
    if compare_hf:
      state = ours["result"]["state"]
      params = jax.device_get({**state.params, **state.frozen})
      from launch.perf.bench import theirs as theirs_lib  # torch: the hf extra, only for --compare-hf
      theirs = theirs_lib.TorchLoop(prepared, setup.objective, params, pipeline)
      result["theirs"] = _side(tokens, theirs.run(steps))
      result["theirs"]["architecture"] = theirs.theirs.arch
      result["ratio_tokens_per_s"] = (result["ours"]["tokens_per_s"]
                                      / result["theirs"]["tokens_per_s"])
      result["ratio_tokens_per_cpu_s"] = (result["ours"]["tokens_per_cpu_s"]
                                          / result["theirs"]["tokens_per_cpu_s"])
  finally:
    shutil.rmtree(run_dir, ignore_errors=True)  # removes the links, not the caches
    if tmp is not None:
      tmp.cleanup()
  return result


PHASE_ORDER = ("input", "host_to_device", "step", "device_wait", "metrics", "eval",
               "checkpoint", "other")


def format_loop(r: Dict[str, Any]) -> list:
  """The report lines of a loop run."""
  sides = [("ours (jax)", r["ours"])] + (
      [("transformers (torch)", r["theirs"])] if "theirs" in r else [])
  lines = [f"loop: {r['steps']} steps ({r['ours']['steps']} timed), log every "
           f"{r['log_every']}, checkpoint every {r['checkpoint_every']} and at the end"]
  head = f"{'':24}" + "".join(f"{n:>24}" for n, _ in sides)
  lines.append(head)
  rows = [("tokens/s (wall)", lambda s: f"{s['tokens_per_s']:,.0f}"),
          ("tokens per CPU second", lambda s: f"{s['tokens_per_cpu_s']:,.0f}"),
          ("step time (wall)", lambda s: f"{s['step_time_s'] * 1e3:,.1f} ms"),
          ("CPU user", lambda s: f"{s['usage']['user_s']:,.2f} s"),
          ("CPU system", lambda s: f"{s['usage']['sys_s']:,.2f} s"),
          ("system / user", lambda s: f"{100 * s['sys_over_user']:.1f}%"),
          ("minor faults / step", lambda s: f"{s['minflt_per_step']:,.0f}")]
  for name, f in rows:
    lines.append(f"{name:24}" + "".join(f"{f(s):>24}" for _, s in sides))
  lines.append("where the wall time goes (host thread, timed steps):")
  for name, s in sides:
    ph = s["phases_s"]
    parts = [f"{k} {ph[k]:.2f}s ({100 * ph[k] / s['wall_s']:.0f}%)"
             for k in PHASE_ORDER if k in ph and s["wall_s"]]
    lines.append(f"  {name}: " + ", ".join(parts))
  if "theirs" in r:
    lines.append(f"transformers: {r['theirs']['architecture']}, MLM head on the gathered "
                 "masked positions only")
    lines.append(f"ratio ours/theirs: {r['ratio_tokens_per_s']:.2f}x tokens/s (wall), "
                 f"{r['ratio_tokens_per_cpu_s']:.2f}x tokens per CPU second")
  return lines
