"""The start and the end of a run, as the user sees them: a rerun of a finished work
directory says so and changes nothing; a finished run names what it wrote (export, plot,
metrics, TensorBoard) with a one-line command to load the export in transformers, and
shows a short fill-mask demo on held-out sentences."""
from __future__ import annotations

import logging
import os

from etils import epath

from launch.trainer import metrics

log = logging.getLogger("encoder_zoo")


def _exists(path: str) -> bool:
  if "://" in path:
    return epath.Path(path).exists()
  return os.path.exists(path)


def latest_checkpoint_step(workdir: str) -> int | None:
  """The newest finished checkpoint's step in `workdir/checkpoints`, read from the
  directory names (Orbax writes `<step>/`; unfinished saves carry a temporary suffix),
  without opening a checkpoint manager (which would write)."""
  d = os.path.join(workdir, "checkpoints")
  if "://" in workdir:
    p = epath.Path(d)
    names = [c.name for c in p.iterdir()] if p.exists() else []
  else:
    names = os.listdir(d) if os.path.isdir(d) else []
  steps = [int(n) for n in names if n.isdigit()]
  return max(steps) if steps else None


def final_eval(workdir: str) -> dict:
  """The last held-out evaluation in `workdir/metrics.jsonl` ({} when there is none)."""
  try:
    records = metrics.read(workdir)
  except OSError:
    return {}
  evals = [r for r in records if r.get("split") == "eval"]
  if not evals:
    return {}
  return {k: v for k, v in evals[-1].items() if k not in ("split", "time")}


def finished(workdir: str, total_steps: int) -> int | None:
  """The step a finished run in `workdir` ended at (a checkpoint at or past
  `total_steps`, and its export written), else None: a rerun has nothing left to do."""
  step = latest_checkpoint_step(workdir)
  if step is None or step < total_steps:
    return None
  if not _exists(os.path.join(workdir, "hf", "config.json")):
    return None  # ended before its export: the rerun resumes and writes it
  return step


def say_complete(workdir: str, step: int) -> dict:
  """Prints that the run is complete; -> its final eval from metrics.jsonl (numbers
  only, as train_and_evaluate returns it; launch.pretrain prints it)."""
  ev = final_eval(workdir)
  print(f"run complete at step {step}; raise --config.train.steps to continue", flush=True)
  return {k: float(v) for k, v in ev.items() if k != "step" and isinstance(v, (int, float))}


def load_command(hf_dir: str, mask_token: str = "[MASK]") -> str:
  """A one-line shell command that loads the export in transformers (fill-mask)."""
  return ("python -c \"from transformers import pipeline; "
          f"print(pipeline('fill-mask', model='{hf_dir}')('Paris is the {mask_token} of "
          "France.'))\"")


def artifact_lines(workdir: str, plot: bool, tensorboard: bool,
                   mask_token: str = "[MASK]") -> list[str]:
  """What the run wrote, one path a line, and the command that loads the export."""
  hf = os.path.join(workdir, "hf")
  lines = [f"export (transformers): {hf}"]
  if plot:
    lines.append(f"plot:                  {os.path.join(workdir, 'loss.png')}")
  lines.append(f"metrics:               {os.path.join(workdir, 'metrics.jsonl')}")
  if tensorboard:
    lines.append(f"TensorBoard:           tensorboard --logdir {os.path.join(workdir, 'tensorboard')}")
  lines.append(f"load it:               {load_command(hf, mask_token)}")
  return lines


def say_artifacts(workdir: str, config, mask_token: str = "[MASK]") -> None:
  print("\n".join(artifact_lines(workdir, bool(config.logging.plot),
                                 bool(config.logging.tensorboard), mask_token)), flush=True)
