"""Cloud TPU VMs: create (on-demand, spot or queued), set up, run on every worker, follow
the logs, delete.

  python -m launch.cloud.tpu_vm up --name bert-base --zone us-east5-a --project P \
      --accelerator_type v5p-8 --capacity spot --config configs/bert.py:base \
      --workdir gs://BUCKET/runs/bert-base -- --config.data.source=arrayrecord \
      --config.data.path=/mnt/data/wiki   [--dry_run]

Subcommands: `create`, `setup` (copies this checkout, `git archive HEAD`, to every worker
and installs it with the `tpu` extra), `run` (the same `python3 -m launch.pretrain ...
--multihost` on all workers at once through `gcloud ... ssh --worker=all`, output streamed
here and kept in ~/encoder_zoo.log on each worker), `logs` (follows worker 0's log),
`delete`, and `up` (create, setup, run). Rerunning `run` after a preemption resumes from
the workdir's latest checkpoint. Arguments after `--` go to launch.pretrain.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time

from launch.cloud import common

CAPACITIES = ("on_demand", "spot", "queued", "queued_spot")
LOG = "~/encoder_zoo.log"
REMOTE_DIR = "~/encoder-zoo"
ARCHIVE = "/tmp/encoder-zoo.tar.gz"


def runtime_version(accelerator_type: str) -> str:
  """The TPU VM software version of a TPU generation (override with --runtime_version)."""
  gen = accelerator_type.split("-")[0]
  return {"v4": "tpu-ubuntu2204-base", "v5p": "v2-alpha-tpuv5",
          "v5litepod": "v2-alpha-tpuv5-lite", "v6e": "v2-alpha-tpuv6e"}.get(
              gen, "tpu-ubuntu2204-base")


def _where(a) -> list[str]:
  return [f"--zone={a.zone}", f"--project={a.project}"]


def create(a, run: common.Runner):
  version = a.runtime_version or runtime_version(a.accelerator_type)
  if a.capacity.startswith("queued"):
    cmd = ["gcloud", "compute", "tpus", "queued-resources", "create", f"{a.name}-qr",
           f"--node-id={a.name}", f"--accelerator-type={a.accelerator_type}",
           f"--runtime-version={version}", *_where(a)]
    if a.capacity == "queued_spot":
      cmd.append("--spot")
    run(cmd)
    # Waits until the queued resource is granted (ACTIVE) before anything else runs.
    describe = ["gcloud", "compute", "tpus", "queued-resources", "describe", f"{a.name}-qr",
                *_where(a), "--format=value(state.state)"]
    while (state := run.output(describe, "ACTIVE")) != "ACTIVE":
      if state in ("FAILED", "SUSPENDED"):
        raise RuntimeError(f"queued resource {a.name}-qr is {state}")
      time.sleep(60)
    return
  cmd = ["gcloud", "compute", "tpus", "tpu-vm", "create", a.name,
         f"--accelerator-type={a.accelerator_type}", f"--version={version}", *_where(a)]
  if a.capacity == "spot":
    cmd.append("--spot")
  run(cmd)


def ssh(a, command: str, worker: str = "all") -> list[str]:
  return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", a.name, *_where(a),
          f"--worker={worker}", f"--command={command}"]


def setup(a, run: common.Runner):
  run(["git", "archive", "--format=tar.gz", f"--output={ARCHIVE}", "HEAD"])
  run(["gcloud", "compute", "tpus", "tpu-vm", "scp", ARCHIVE, f"{a.name}:{ARCHIVE}",
       *_where(a), "--worker=all"])
  run(ssh(a, f"mkdir -p {REMOTE_DIR} && tar xzf {ARCHIVE} -C {REMOTE_DIR} && "
             f"pip install -q -e '{REMOTE_DIR}[tpu]'"))


def train(a, run: common.Runner):
  cmd = common.train_command(a.config, a.workdir, a.overrides, module=a.module)
  run(ssh(a, f"cd {REMOTE_DIR} && {shlex.join(cmd)} 2>&1 | tee -a {LOG}"))


def logs(a, run: common.Runner):
  run(ssh(a, f"tail -n 200 -F {LOG}", worker="0"))


def delete(a, run: common.Runner):
  if a.capacity.startswith("queued"):
    run(["gcloud", "compute", "tpus", "queued-resources", "delete", f"{a.name}-qr",
         *_where(a), "--force", "--quiet"])
  else:
    run(["gcloud", "compute", "tpus", "tpu-vm", "delete", a.name, *_where(a), "--quiet"])


def up(a, run):
  create(a, run)
  setup(a, run)
  train(a, run)


ACTIONS = {"create": create, "setup": setup, "run": train, "logs": logs, "delete": delete,
           "up": up}


def parse(argv: list[str]) -> argparse.Namespace:
  rest = []
  if "--" in argv:
    i = argv.index("--")
    argv, rest = argv[:i], argv[i + 1:]
  p = argparse.ArgumentParser(prog="python -m launch.cloud.tpu_vm",
                              description=__doc__.split("\n")[0])
  p.add_argument("action", choices=sorted(ACTIONS))
  p.add_argument("--name", required=True, help="TPU VM name")
  p.add_argument("--zone", required=True)
  p.add_argument("--project", required=True)
  p.add_argument("--accelerator_type", default="v5p-8")
  p.add_argument("--runtime_version", default="", help="default: by TPU generation")
  p.add_argument("--capacity", choices=CAPACITIES, default="on_demand")
  p.add_argument("--config", default="", help="run/up: the config, e.g. configs/bert.py:base")
  p.add_argument("--workdir", default="", help="run/up: gs://BUCKET/runs/NAME")
  p.add_argument("--module", default="pretrain", help="launch.<module> to run")
  p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  a = p.parse_args(argv)
  a.overrides = rest
  common.check_name(a.name, "--name")
  if a.action in ("run", "up"):
    common.train_command(a.config, a.workdir, rest)  # checks --config / --workdir
  return a


def main(argv=None, out=None) -> common.Runner:
  a = parse(sys.argv[1:] if argv is None else argv)
  run = common.Runner(a.dry_run, out)
  ACTIONS[a.action](a, run)
  return run


if __name__ == "__main__":
  main()
