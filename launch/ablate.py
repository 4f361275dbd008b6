"""Runs a paper's ablation study: every arm pretrained at the study's scale, then
evaluated the same way (held-out MLM, the pair heads on NSP and SOP pairs, fine-tuning on
the study's downstream task with several seeds), and reported beside the paper's numbers.

  python -m launch.ablate --config configs/ablations/study_roberta_table2.py --workdir DIR
  python -m launch.ablate --config configs/ablations/study_albert_sop.py --workdir DIR \
      --config.scale.variant=base --config.scale.steps=125000 --parallel 2 \
      --platform tpu --devices_per_arm 4

Outputs in DIR: results.md, results.csv, results.png, study.json (each arm's status) and
arms/<arm>/ (pretraining, evaluations, fine-tuning seeds). A rerun skips finished arms and
resumes an interrupted one from its checkpoints. `--arms a,b` runs a subset.
Each arm is pretrained once per seed of `scale.seeds` (arms/<arm>/seed<k>/).

  python -m launch.ablate --summary docs/ablations

rewrites the summary table of docs/ablations/README.md from each study's summary.json
(docs/ablations/<study>/summary.json, written by a run next to its results.md).
`--parallel N` runs N arms at once as subprocesses, worker i on device slice i of
`--devices_per_arm` devices (CPU: that many fake devices; GPU: CUDA_VISIBLE_DEVICES;
TPU: TPU_VISIBLE_CHIPS and the process bounds of one TPU VM host).
"""
import logging
import shlex
import sys

from absl import app, flags
from absl import logging as absl_logging
from ml_collections import config_flags

from launch import cli
from launch.ablation import arm as arm_lib
from launch.ablation import report
from launch.ablation import runner
from launch.ablation import study as study_lib
from launch.trainer import hostmem


RUNNER_FLAGS = ("parallel", "platform", "devices_per_arm", "arms")


def _worker_argv(args):
  """The command line minus the runner's own flags (`--flag=v` or `--flag v`)."""
  out, skip = [], False
  for a in args:
    if skip:
      skip = False
      continue
    name = a.lstrip("-").split("=", 1)[0]
    if a.startswith("--") and name in RUNNER_FLAGS:
      skip = "=" not in a
      continue
    out.append(a)
  return out


def main(argv):
  del argv
  hostmem.tune_malloc()
  absl_logging.set_verbosity(absl_logging.INFO)
  absl_logging.get_absl_handler().setFormatter(
      logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
  for noisy in ("absl", "jax", "orbax", "grain", "etils"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  f = flags.FLAGS
  if f.summary:
    try:
      print("wrote " + report.write_summary(f.summary))
    except study_lib.StudyError as e:
      cli.fail(str(e))
    return
  if f.config is None or not f.workdir:
    cli.fail("--config and --workdir are required (or --summary DIR)")
  study = f.config
  try:
    study_lib.validate(study)
    if f.worker_arm:
      runner.run_worker(study, f.workdir, f.worker_arm)
      return
    # Workers get the same config and overrides (everything but the runner's own flags).
    worker_argv = _worker_argv(sys.argv[1:])
    command = "python -m launch.ablate " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    arms = tuple(a for a in f.arms.split(",") if a)
    rows, paths = runner.run_study(study, f.workdir, arms, f.parallel, f.platform,
                                   f.devices_per_arm, worker_argv, command)
  except (study_lib.StudyError, cli.ConfigError) as e:
    cli.fail(str(e))
  except arm_lib.Interrupted as e:
    cli.fail(str(e), code=143)
  for r in rows:
    parts = [f"{name} {report.cell(r, key)}" for name, key in (
        ("mlm", "mlm_accuracy"), ("rtd", "rtd_accuracy"), ("pair on nsp", "pair_on_nsp"),
        ("pair on sop", "pair_on_sop"), ("probe", "probe_accuracy"),
        ("probe random init", "probe_random"), ("fine-tuned", "finetune_accuracy"))
        if key in r.get("metrics", {})]
    print(f"{r['arm']:>16}: {r['steps']} steps, {r['pretrain_flops']:.2e} FLOPs, seeds "
          f"{r.get('seeds')}  " + "  ".join(parts))
  c = report.comparison(study, rows)
  if c is not None:
    print("\n".join(report.comparison_lines(c)))
  print("wrote " + ", ".join(paths.values()))


if __name__ == "__main__":
  config_flags.DEFINE_config_file("config", None, "study config file[:arg]",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "study directory")
  flags.DEFINE_string("summary", "", "rewrite the summary table of DIR/README.md from "
                      "DIR/*/summary.json (instead of running a study)")
  flags.DEFINE_string("arms", "", "comma-separated arms to run (default: all)")
  flags.DEFINE_integer("parallel", 1, "arms at once (>1: subprocesses on device slices)")
  flags.DEFINE_enum("platform", "cpu", ["cpu", "gpu", "tpu"], "how slices are given out")
  flags.DEFINE_integer("devices_per_arm", 1, "devices in each worker's slice")
  flags.DEFINE_string("worker_arm", "", "internal: run this one arm (a --parallel worker)")
  app.run(main, flags_parser=cli.parse_flags)
