"""Metrics out of a run: a console progress line, a JSONL file a program can read,
TensorBoard event files, and a PNG plot of the loss curves at the end."""
import json
import logging
import os
import time

from launch.trainer import plotting

log = logging.getLogger("encoder_zoo")

JSONL = "metrics.jsonl"


class MetricWriter:

  def __init__(self, workdir: str, tensorboard: bool = True, is_main: bool = True):
    self.is_main = is_main
    self.path = os.path.join(workdir, JSONL)
    self.tb = None
    if is_main and tensorboard:
      from tensorboardX import SummaryWriter  # slow to import; only with logging.tensorboard
      self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, split: str, metrics: dict):
    if not self.is_main:
      return
    record = {"step": step, "split": split, "time": time.time(),
              **{k: v for k, v in metrics.items() if isinstance(v, (int, float))}}
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    if self.tb is not None:
      for k, v in metrics.items():
        if isinstance(v, (int, float)):
          self.tb.add_scalar(f"{split}/{k}", v, step)
      self.tb.flush()
    log.info("%s", format_line(step, split, metrics))

  def write_json(self, split: str, payload: dict):
    if not self.is_main:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps({"split": split, "time": time.time(), **payload}) + "\n")
    log.info("%s: %s", split, json.dumps(payload))

  def close(self):
    if self.tb is not None:
      self.tb.close()


_TAIL = ("learning_rate", "tokens_per_s", "mfu", "eta_s")


def _shown(m, split="train"):
  """Every `<prefix>_loss` and `<prefix>_accuracy` (by prefix, loss first), then the
  progress numbers; an evaluation also shows its other scores (F1, EM, correlations)."""
  terms = sorted((k for k in m if k.endswith("_loss") or k.endswith("_accuracy")),
                 key=lambda k: (k.rsplit("_", 1)[0], not k.endswith("_loss")))
  if split != "train":
    terms += sorted(k for k in m if k not in terms and k not in _TAIL and k != "epoch"
                    and not k.endswith("_count"))
  return terms + [k for k in _TAIL if k in m]


def format_line(step, split, m):
  parts = [f"[{split}] step {step}"]
  if "epoch" in m:
    parts.append(f"epoch {int(m['epoch'])}")
  if m.get("skipped_total"):  # nonfinite_policy=skip: never a silent 0.0000 loss
    n, applied = int(m.get("skipped_steps", 0)), m.get("applied_steps")
    note = f"skipped {n}" + (f" of {n + int(applied)}" if applied is not None else "")
    parts.append(f"{note} (run {int(m['skipped_total'])})")
  if m.get("bad_data_skipped"):
    parts.append(f"bad data skipped {int(m['bad_data_skipped'])}")
  for k in _shown(m, split):
    v = m[k]
    if not isinstance(v, (int, float)):
      continue
    if k == "eta_s":
      parts.append(f"eta {int(v) // 60}m{int(v) % 60:02d}s")
    elif k == "tokens_per_s":
      parts.append(f"tok/s {v:,.0f}")
    elif k == "mfu":
      parts.append(f"mfu {100 * v:.1f}%")
    elif k == "learning_rate":
      parts.append(f"lr {v:.2e}")
    else:
      parts.append(f"{k} {v:.4f}")
  return "  ".join(parts)


class Progress:
  """Throughput and MFU over the steps since the last report; the ETA from the rate over
  the last `window` reports (one slow or fast interval, e.g. the first one's compile or
  another job on the machine, does not swing it)."""

  def __init__(self, total_steps, first_step, tokens_per_step, step_flops, peak_flops,
               window=5):
    self.total, self.last_step = total_steps, first_step
    self.tokens_per_step, self.step_flops, self.peak = tokens_per_step, step_flops, peak_flops
    self.last_time = time.perf_counter()
    self.window = window
    self.intervals = []  # (steps, seconds) of the recent reports
    self.reports = 0

  def update(self, step, now=None):
    now = time.perf_counter() if now is None else now
    dt = max(now - self.last_time, 1e-9)
    steps = step - self.last_step
    self.last_time, self.last_step = now, step
    sps = steps / dt
    self.reports += 1
    if self.reports == 2 and self.intervals:
      self.intervals = []  # the first interval holds the compile: out once another exists
    self.intervals = (self.intervals + [(steps, dt)])[-self.window:]
    window_sps = (sum(s for s, _ in self.intervals)
                  / max(sum(t for _, t in self.intervals), 1e-9))
    return {"tokens_per_s": sps * self.tokens_per_step,
            "mfu": sps * self.step_flops / self.peak if self.peak else 0.0,
            "steps_per_s": sps, "eta_s": (self.total - step) / max(window_sps, 1e-9)}


def read(workdir):
  with open(os.path.join(workdir, JSONL)) as f:
    return [json.loads(line) for line in f if line.strip()]


def skipped_before(workdir, upto: int) -> int:
  """Updates skipped in steps 1..`upto` by earlier processes of the run in `workdir`, from
  the train records of its metrics.jsonl (their `skipped_nonfinite` / `skipped_spike`
  sums per log interval). A restart re-runs steps after its checkpoint: a record at or
  below an earlier record's step replaces those. 0 when there is no file."""
  try:
    records = read(workdir)
  except OSError:
    return 0
  kept = []  # (step, skipped)
  for r in records:
    if r.get("split") != "train" or "step" not in r:
      continue
    while kept and kept[-1][0] >= r["step"]:
      kept.pop()
    kept.append((r["step"], sum(float(r.get(k, 0)) for k in
                                ("skipped_nonfinite", "skipped_spike"))))
  return int(round(sum(n for step, n in kept if step <= upto)))


def plot(workdir, out_name="loss.png"):
  """The loss/accuracy plot of the run's metrics (launch/trainer/plotting.py)."""
  return plotting.plot(read(workdir), os.path.join(workdir, out_name))
