"""Fine-tuning entry point: a task head (encoders/tasks) on a pretrained HF directory,
trained by the one loop as a job (launch/trainer/finetuning.py).

  python -m launch.finetune --config configs/finetune.py:sequence \\
      --config.init_from=DIR --workdir /tmp/ft --config.finetune.train_file=train.csv

Exit status: 0 done (or stopped by SIGTERM with a checkpoint: the same command resumes);
2 a bad setting or a refused work directory, said in one line before anything is
written; 1 the data cannot train the run, or the run diverged.
"""
import logging

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from encoders import outdir
from launch import cli
from launch.data import badinput
from launch.trainer import hostmem
from launch.trainer.finetuning import run


def main(argv):
  del argv
  hostmem.tune_malloc()  # before JAX's CPU client starts (launch/trainer/hostmem.py)
  absl_logging.set_verbosity(absl_logging.INFO)
  for noisy in ("absl", "jax", "orbax", "grain", "etils"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  try:
    result = run(flags.FLAGS.config, flags.FLAGS.workdir)
  except (cli.ConfigError, outdir.OutputDirError) as e:  # settings / work directory: exit 2
    cli.fail(" ".join(str(e).split()))
  except (FloatingPointError, badinput.InputDataError) as e:  # diverged / the data: exit 1
    cli.fail(" ".join(str(e).split()), code=1)
  if result.get("stopped"):
    print(f"stopped at epoch {result['epoch'] + 1}, batch {result['batch']} (step "
          f"{result['step']}): checkpoint saved; run the same command to resume")
    return
  b = result["best"]
  print(f"best epoch {b['epoch']}: " + "  ".join(
      f"{k} {v:.4f}" for k, v in sorted(b["metrics"].items()) if isinstance(v, float)))


if __name__ == "__main__":
  config_flags.DEFINE_config_file("config", None, "config file[:arg]", lock_config=True)
  flags.DEFINE_string("workdir", None, "run directory")
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main, flags_parser=cli.parse_flags)
