"""Pretraining entry point.

  python -m launch.pretrain --config configs/bert.py:tiny --workdir /tmp/bert_tiny \
      [--config.train.steps=2000 --config.optimizer.learning_rate=5e-4 ...]
  python -m launch.pretrain --config configs/bert.py:tiny --workdir /tmp/continued \
      --config.init_from=/path/to/hf_dir     # continued pretraining from an HF directory

The config is locked: an override of a key that does not exist is an error. A run in a
workdir that already holds checkpoints resumes from the latest one, if its settings are
the run's (launch/trainer/fingerprint.py; allow intended changes with
--config.train.allow_config_change='key1,key2'). A workdir is refused when it is a
non-empty directory this project did not write, or when another trainer holds it.

Exit status: 0 done (or stopped by SIGTERM with a checkpoint); 2 a bad setting or a
refused workdir, said in one line before anything is written; 1 a run that diverged
(NaN/inf under train.nonfinite_policy=stop, too many skipped updates under skip).
"""
import logging
import os

import jax
from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from launch import cli, trainer
from launch.data import badinput
from launch.trainer import hostmem

_CONFIG = config_flags.DEFINE_config_file("config", None, "config file[:arg]",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory (checkpoints, metrics, export)")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "multi-process: host:port of process 0")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "multi-process: process count")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "multi-process: this process's id")
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "call jax.distributed.initialize() with peers found from the "
    "environment (Cloud TPU slices, GKE, SLURM); set by the launch.cloud launchers")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  hostmem.tune_malloc()  # first: before JAX's CPU client starts (launch/trainer/hostmem.py)
  if _COORDINATOR.value:
    # CPU processes (tests, or a CPU cluster) need gloo for cross-process collectives;
    # the setting is ignored by TPU and GPU backends.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  elif (_MULTIHOST.value or os.environ.get("TPU_WORKER_HOSTNAMES")
        or os.environ.get("SLURM_JOB_ID")):
    jax.distributed.initialize()  # Cloud TPU pods / SLURM: discovered from the environment
  absl_logging.set_verbosity(absl_logging.INFO)
  absl_logging.get_absl_handler().setFormatter(
      logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
  for noisy in ("absl", "jax", "orbax", "grain", "etils"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  try:
    result = trainer.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except cli.ConfigError as e:  # a start-up check: one line, exit 2, nothing written
    cli.fail(str(e))
  except FloatingPointError as e:  # diverged (guard.py): one line, exit 1
    cli.fail(" ".join(str(e).split()), code=1)
  except badinput.InputDataError as e:  # the input data, named (badinput.py): one line, exit 1
    cli.fail(" ".join(str(e).split()), code=1)
  ev = result["eval"]
  if ev:
    print("final eval: " + "  ".join(f"{k} {v:.4f}" for k, v in sorted(ev.items())
                                     if isinstance(v, float)))


if __name__ == "__main__":
  app.run(main, flags_parser=cli.parse_flags)
