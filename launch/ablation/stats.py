"""The statistics of a study: a metric's mean and standard error over pretraining seeds,
and the paired test of two arms (paired by seed: the same seed gives both arms the same
data order and the same initialisation key)."""
from __future__ import annotations

import math

import numpy as np


def mean_se(values) -> tuple[float, float]:
  """(mean, standard error of the mean); the standard error is nan for one value."""
  x = np.asarray(values, np.float64)
  if x.size == 0:
    raise ValueError("mean_se of no values")
  se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan")
  return float(x.mean()), se


def paired(higher: dict, lower: dict) -> dict:
  """The paired difference higher - lower over the seeds both have ({seed: value} each):
  {"seeds", "n", "diff" (mean), "se" (of the mean difference), "t", "exceeds_2se"
  (|diff| > 2 se), "reproduced" (diff > 2 se: the claimed direction, beyond noise)}."""
  seeds = sorted(set(higher) & set(lower))
  if not seeds:
    raise ValueError("paired: the two arms share no seed")
  d = np.asarray([float(higher[k]) - float(lower[k]) for k in seeds])
  diff, se = mean_se(d)
  if se > 0:
    t = diff / se
  elif np.isnan(se):
    t = float("nan")
  else:  # identical differences on every seed: no spread at all
    t = float("inf") * np.sign(diff) if diff else 0.0
  ok = bool(not np.isnan(se) and abs(diff) > 2 * se)
  return {"seeds": seeds, "n": len(seeds), "diff": diff, "se": se, "t": float(t),
          "exceeds_2se": ok, "reproduced": bool(ok and diff > 0)}
