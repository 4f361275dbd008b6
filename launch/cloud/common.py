"""What every launcher shares: running (or printing) commands, and the training command."""
from __future__ import annotations

import shlex
import subprocess
import sys


class Runner:
  """Runs commands, or with `dry_run` prints each one (shell-quoted) and runs nothing."""

  def __init__(self, dry_run: bool, out=None):
    self.dry_run = dry_run
    self.out = out or sys.stdout
    self.commands: list[list[str]] = []

  def __call__(self, cmd: list[str], check: bool = True) -> int:
    self.commands.append(cmd)
    print(("" if self.dry_run else "+ ") + shlex.join(cmd), file=self.out, flush=True)
    if self.dry_run:
      return 0
    return subprocess.run(cmd, check=check).returncode

  def output(self, cmd: list[str], dry_value: str = "") -> str:
    """The command's stdout (with `dry_run`: printed, and `dry_value` returned)."""
    self.commands.append(cmd)
    print(("" if self.dry_run else "+ ") + shlex.join(cmd), file=self.out, flush=True)
    if self.dry_run:
      return dry_value
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def train_command(config: str, workdir: str, overrides: list[str], module: str = "pretrain",
                  multihost: bool = True) -> list[str]:
  """`python -m launch.<module> --config ... --workdir ...` (+ `--multihost`: every host
  calls jax.distributed.initialize(), which finds its peers from the environment)."""
  if not config or not workdir:
    raise ValueError("--config and --workdir are required")
  cmd = ["python3", "-m", f"launch.{module}", "--config", config, "--workdir", workdir]
  if multihost:
    cmd.append("--multihost")
  return cmd + list(overrides)


def check_name(name: str, what: str) -> str:
  ok = name and name[0].isalpha() and all(c.isalnum() or c == "-" for c in name)
  if not ok or name != name.lower() or len(name) > 63:
    raise ValueError(f"{what}={name!r}: use lower-case letters, digits and '-', starting "
                     "with a letter (at most 63 characters)")
  return name
