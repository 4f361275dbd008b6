"""XPK workloads on GKE TPU slices (https://github.com/AI-Hypercomputer/xpk).

  python -m launch.cloud.xpk create --cluster my-cluster --workload bert-base \
      --tpu_type v5p-128 --num_slices 1 --docker_image gcr.io/P/encoder-zoo:latest \
      --project P --zone us-east5-a --config configs/bert.py:base \
      --workdir gs://BUCKET/runs/bert-base -- --config.data.path=/mnt/data/wiki [--dry_run]

`create` starts the workload: every pod of the slice runs the same `python3 -m
launch.pretrain ... --multihost` in the image (which holds this checkout installed with
the `tpu` extra; see docs/cloud_tpu.md), and jax.distributed.initialize() finds its peers
from the GKE environment. `--spot` / `--on_demand` are passed to XPK for the capacity.
XPK restarts a preempted workload up to `--max_restarts` times; each restart resumes from
the workdir's latest checkpoint. Also `list`, `delete`, `logs` (via kubectl).
"""
from __future__ import annotations

import argparse
import shlex
import sys

from launch.cloud import common


def _where(a) -> list[str]:
  return [f"--cluster={a.cluster}", f"--project={a.project}", f"--zone={a.zone}"]


def create(a, run: common.Runner):
  cmd = common.train_command(a.config, a.workdir, a.overrides, module=a.module)
  xpk = ["xpk", "workload", "create", *_where(a), f"--workload={a.workload}",
         f"--tpu-type={a.tpu_type}", f"--num-slices={a.num_slices}",
         f"--docker-image={a.docker_image}", f"--max-restarts={a.max_restarts}",
         f"--command={shlex.join(cmd)}"]
  if a.spot:
    xpk.append("--spot")
  run(xpk)


def delete(a, run: common.Runner):
  run(["xpk", "workload", "delete", *_where(a), f"--workload={a.workload}"])


def listing(a, run: common.Runner):
  run(["xpk", "workload", "list", *_where(a)])


def logs(a, run: common.Runner):
  run(["kubectl", "logs", "-f", "--max-log-requests=64", "--prefix",
       f"--selector=jobset.sigs.k8s.io/jobset-name={a.workload}"])


ACTIONS = {"create": create, "delete": delete, "list": listing, "logs": logs}


def parse(argv):
  rest = []
  if "--" in argv:
    i = argv.index("--")
    argv, rest = argv[:i], argv[i + 1:]
  p = argparse.ArgumentParser(prog="python -m launch.cloud.xpk",
                              description=__doc__.split("\n")[0])
  p.add_argument("action", choices=sorted(ACTIONS))
  p.add_argument("--cluster", required=True)
  p.add_argument("--project", required=True)
  p.add_argument("--zone", required=True)
  p.add_argument("--workload", default="encoder-zoo")
  p.add_argument("--tpu_type", default="v5p-8")
  p.add_argument("--num_slices", type=int, default=1)
  p.add_argument("--docker_image", default="")
  p.add_argument("--max_restarts", type=int, default=10)
  p.add_argument("--spot", action="store_true", help="spot capacity")
  p.add_argument("--config", default="")
  p.add_argument("--workdir", default="")
  p.add_argument("--module", default="pretrain")
  p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  a = p.parse_args(argv)
  a.overrides = rest
  common.check_name(a.workload, "--workload")
  if a.num_slices < 1:
    raise ValueError(f"--num_slices={a.num_slices} must be at least 1")
  if a.action == "create":
    if not a.docker_image:
      raise ValueError("create needs --docker_image (an image with encoder-zoo installed)")
    common.train_command(a.config, a.workdir, rest)
  return a


def main(argv=None, out=None) -> common.Runner:
  a = parse(sys.argv[1:] if argv is None else argv)
  run = common.Runner(a.dry_run, out)
  ACTIONS[a.action](a, run)
  return run


if __name__ == "__main__":
  main()
