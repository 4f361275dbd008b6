"""SLURM batch jobs for GPU nodes: one process per node (it drives all the node's GPUs)
or one process per GPU.

  python -m launch.cloud.slurm --nodes 2 --gpus_per_node 8 --per gpu \
      --config configs/bert.py:base --workdir /shared/runs/bert-base \
      --script /shared/runs/bert-base.sbatch -- --config.model.dtype=bfloat16 [--dry_run]

Writes an sbatch script and submits it with `sbatch` (`--dry_run`: prints the script and
the command, writes and submits nothing). `srun` starts the processes; each calls
jax.distributed.initialize(), which reads the SLURM environment (coordinator = the first
node, process id = SLURM_PROCID). With `--per gpu` each process sees only its own GPU
(CUDA_VISIBLE_DEVICES=$SLURM_LOCALID). `--requeue` lets SLURM requeue a preempted job;
SLURM sends SIGTERM first, every process saves the same step, and the requeued job
resumes from the workdir.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys

from launch.cloud import common


def script(a) -> str:
  tasks = a.gpus_per_node if a.per == "gpu" else 1
  cmd = shlex.join(common.train_command(a.config, a.workdir, a.overrides, module=a.module))
  lines = ["#!/bin/bash",
           f"#SBATCH --job-name={a.job_name}",
           f"#SBATCH --nodes={a.nodes}",
           f"#SBATCH --ntasks-per-node={tasks}",
           f"#SBATCH --gpus-per-node={a.gpus_per_node}",
           f"#SBATCH --cpus-per-task={a.cpus_per_task}",
           f"#SBATCH --time={a.time}",
           f"#SBATCH --output={a.workdir}/slurm-%j.out",
           "#SBATCH --signal=TERM@120",  # SIGTERM two minutes before the time limit
           "#SBATCH --exclusive"]
  if a.partition:
    lines.append(f"#SBATCH --partition={a.partition}")
  if a.requeue:
    lines.append("#SBATCH --requeue")
  lines += ["set -euo pipefail", f"mkdir -p {shlex.quote(a.workdir)}"]
  if a.setup:
    lines.append(a.setup)
  visible = "export CUDA_VISIBLE_DEVICES=$SLURM_LOCALID; " if a.per == "gpu" else ""
  inner = f"{visible}exec {cmd}"
  lines.append(f"srun --kill-on-bad-exit=1 bash -c {shlex.quote(inner)}")
  return "\n".join(lines) + "\n"


def main(argv=None, out=None) -> common.Runner:
  argv = sys.argv[1:] if argv is None else argv
  rest = []
  if "--" in argv:
    i = argv.index("--")
    argv, rest = argv[:i], argv[i + 1:]
  p = argparse.ArgumentParser(prog="python -m launch.cloud.slurm",
                              description=__doc__.split("\n")[0])
  p.add_argument("--nodes", type=int, default=1)
  p.add_argument("--gpus_per_node", type=int, default=8)
  p.add_argument("--per", choices=("node", "gpu"), default="node",
                 help="one process per node or per GPU")
  p.add_argument("--cpus_per_task", type=int, default=16)
  p.add_argument("--time", default="24:00:00")
  p.add_argument("--partition", default="")
  p.add_argument("--job_name", default="encoder-zoo")
  p.add_argument("--requeue", action="store_true")
  p.add_argument("--setup", default="", help="a shell line before srun (module load, venv)")
  p.add_argument("--script", default="", help="where to write the sbatch script")
  p.add_argument("--config", required=True)
  p.add_argument("--workdir", required=True)
  p.add_argument("--module", default="pretrain")
  p.add_argument("--dry_run", action="store_true")
  a = p.parse_args(argv)
  a.overrides = rest
  if a.nodes < 1 or a.gpus_per_node < 1:
    raise ValueError("--nodes and --gpus_per_node must be at least 1")
  text = script(a)
  path = a.script or os.path.join(a.workdir, f"{a.job_name}.sbatch")
  run = common.Runner(a.dry_run, out)
  if a.dry_run:
    print(f"# {path}\n{text}", file=run.out, end="")
  else:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
      f.write(text)
  run(["sbatch", path])
  return run


if __name__ == "__main__":
  main()
