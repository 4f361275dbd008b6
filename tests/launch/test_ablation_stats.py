"""The ablation studies' statistics (launch/ablation/stats.py), the linear probe
(launch/ablation/probe.py), the seed-level resume of an arm and the summary table
(launch/ablation/report.py)."""
import json
import math
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

from launch.ablation import arm as arm_lib
from launch.ablation import probe
from launch.ablation import report
from launch.ablation import runner
from launch.ablation import stats
from launch.ablation import study as study_lib
from tests.launch import test_ablate

ROOT = test_ablate.ROOT


# ---- statistics ---------------------------------------------------------------------------

def test_mean_and_standard_error_on_known_numbers():
  mean, se = stats.mean_se([1.0, 2.0, 3.0, 6.0])
  assert mean == 3.0
  assert math.isclose(se, math.sqrt(14 / 3) / 2)  # sample sd sqrt(14/3), over sqrt(4)
  assert math.isnan(stats.mean_se([0.7])[1])  # one seed: no spread to estimate


def test_the_paired_test_pairs_by_seed():
  # diffs 0.10, 0.20, 0.20 on seeds 0-2: mean 1/6, sd 0.0577, se 1/30, t = 5
  got = stats.paired({0: 0.6, 1: 0.7, 2: 0.8, 7: 0.9}, {2: 0.6, 1: 0.5, 0: 0.5})
  assert got["seeds"] == [0, 1, 2] and got["n"] == 3  # seed 7 has no partner
  assert math.isclose(got["diff"], 1 / 6) and math.isclose(got["se"], 1 / 30)
  assert math.isclose(got["t"], 5.0) and got["exceeds_2se"] and got["reproduced"]
  # Pairing removes the seed effect both arms share: half the unpaired standard error.
  a, b = [0.6, 0.7, 0.8], [0.5, 0.5, 0.6]
  unpaired_se = math.sqrt(np.var(a, ddof=1) / 3 + np.var(b, ddof=1) / 3)
  assert math.isclose(got["se"], unpaired_se / 2)
  back = stats.paired({0: 0.5, 1: 0.5, 2: 0.6}, {0: 0.6, 1: 0.7, 2: 0.8})
  assert back["exceeds_2se"] and not back["reproduced"]  # beyond noise, the other way
  noisy = stats.paired({0: 0.6, 1: 0.4, 2: 0.55}, {0: 0.5, 1: 0.5, 2: 0.5})
  assert not noisy["exceeds_2se"] and not noisy["reproduced"]
  one = stats.paired({0: 0.9}, {0: 0.1})
  assert math.isnan(one["se"]) and not one["reproduced"]  # one seed proves nothing
  with pytest.raises(ValueError, match="share no seed"):
    stats.paired({0: 1.0}, {1: 1.0})


# ---- the probe ----------------------------------------------------------------------------

def _blobs(n, d=16, seed=0, shift=1.5):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 3, n)
  centres = rng.normal(size=(3, d)) * shift
  return centres[y] + rng.normal(size=(n, d)), y


def test_the_probe_separates_separable_features_and_not_shuffled_labels():
  x, y = _blobs(600)
  got = probe.probe(x[:400], y[:400], x[400:], y[400:])
  assert got["accuracy"] > 0.97 and got["n_eval"] == 200 and got["l2"] in probe.L2_GRID
  again = probe.probe(x[:400], y[:400], x[400:], y[400:])
  assert again == got  # deterministic: two encoders differ only by their features
  shuffled = np.random.default_rng(1).permutation(y)
  chance = probe.probe(x[:400], shuffled[:400], x[400:], shuffled[400:])["accuracy"]
  assert abs(chance - 1 / 3) < 0.1
  assert probe.majority([0, 0, 1], [0, 1, 1, 1]) == 0.25


def test_more_features_than_rows_fit_in_the_rows_span():
  x, y = _blobs(300, d=40)
  wide = np.concatenate([x, np.random.default_rng(2).normal(size=(300, 160))], 1)
  w, b = probe.fit_logistic(wide[:60], y[:60], 3, 1e-2)  # d 200 > n 60: the span
  assert w.shape == (200, 3)
  # The same minimiser as the full-dimensional fit: compare objectives at both solutions.
  loss = lambda w, b: (-np.log(np.exp((z := wide[:60] @ w + b) - z.max(1, keepdims=True))[
      np.arange(60), y[:60]] / np.exp(z - z.max(1, keepdims=True)).sum(1)).mean()
                       + 5e-3 * (w * w).sum())
  from scipy import optimize
  full = optimize.minimize(lambda t: loss(t[:600].reshape(200, 3), t[600:]),
                           np.zeros(603), method="L-BFGS-B", options={"maxiter": 2000})
  assert loss(w, b) <= full.fun + 1e-4


def test_the_probe_split_mixes_a_label_sorted_table(tmp_path):
  path = tmp_path / "sorted.csv"
  path.write_text("text,label\n" + "".join(f"a{i},0\n" for i in range(50))
                  + "".join(f"b{i},1\n" for i in range(50)) + "".join(
                      f"c{i},1.0\n" for i in range(20)))
  texts, y, classes = probe.read_labelled(str(path))
  assert classes == ["0", "1"] and len(texts) == 120  # 1 and 1.0: one class
  tr, ev = probe.split(len(y), 0.25, 0, max_train=40)
  assert len(tr) == 40 and len(ev) == 30 and not set(tr) & set(ev)
  tail = y[tr[-8:]]  # the probe's validation slice: both classes, not one
  assert 0 < tail.mean() < 1


# ---- seeds per arm and their resume (fast: the seeds' rows are given) -----------------------

def test_a_finished_seed_is_kept_and_more_seeds_rerun_the_arm(tmp_path, monkeypatch):
  s = test_ablate.micro_study(pair_tasks=(), pretrain_seeds=(0, 1))
  wd = str(tmp_path)
  for k in (0, 1):
    d = arm_lib.seed_dir(wd, "no_nsp", k)
    os.makedirs(d)
    arm_lib.write_json(os.path.join(d, "result.json"),
                       test_ablate._seed_row(k, 0.7 + k / 100, 0.5))

  def no_training(*a, **kw):
    raise AssertionError("a finished seed was trained again")
  monkeypatch.setattr(arm_lib.trainer, "train_and_evaluate", no_training)
  assert not runner.claim(s, "no_nsp", wd, None)
  row = arm_lib.run(s, "no_nsp", wd)
  assert row["seeds"] == [0, 1] and row["metrics"]["probe_accuracy"]["values"] == [0.7, 0.71]
  assert runner.claim(s, "no_nsp", wd, None)  # done: its row has the study's seeds
  assert [r["arm"] for r in runner.rows_of(s, wd)] == ["no_nsp"]
  s.scale.seeds = (0, 1, 2)  # a third seed: the arm is not done, its rows not reported
  assert not runner.claim(s, "no_nsp", wd, None) and runner.rows_of(s, wd) == []
  with pytest.raises(AssertionError, match="trained again"):  # only seed 2 trains
    arm_lib.run(s, "no_nsp", wd)


# ---- the summary table --------------------------------------------------------------------

def test_the_summary_table_is_written_between_its_markers(tmp_path):
  docs = tmp_path / "ablations"
  for name, diff, se in (("electra_vs_bert", 0.05, 0.01), ("masking", -0.01, 0.02)):
    (docs / name).mkdir(parents=True)
    rec = {"study": "x", "paper": "P, Table 1", "paper_direction": f"{name}: A > B",
           "ours": f"A − B: {100 * diff:+.1f} ± {100 * se:.1f} points", "wall_s": 1800.0,
           "reproduced": diff > 2 * se,
           "verdict": "yes" if diff > 2 * se else "no (not distinguishable at these seeds)"}
    (docs / name / "summary.json").write_text(json.dumps(rec))
  (docs / "old").mkdir()  # a study without summary.json is not listed
  readme = docs / "README.md"
  readme.write_text(f"# Ablations\n\nintro\n\n{report.SUMMARY_BEGIN}\nstale\n"
                    f"{report.SUMMARY_END}\n\n## After\n")
  r = subprocess.run([sys.executable, "-m", "launch.ablate", "--summary", str(docs)],
                     capture_output=True, text=True, cwd=ROOT,
                     env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  text = readme.read_text()
  assert "stale" not in text and text.startswith("# Ablations\n\nintro\n")
  assert text.endswith(f"{report.SUMMARY_END}\n\n## After\n")
  lines = [x for x in text.splitlines() if x.startswith("| [")]
  assert lines == [
      "| [electra_vs_bert](electra_vs_bert/results.md) | P, Table 1 | electra_vs_bert: "
      "A > B | A − B: +5.0 ± 1.0 points | yes | 30 min |",
      "| [masking](masking/results.md) | P, Table 1 | masking: A > B | A − B: -1.0 ± 2.0 "
      "points | no (not distinguishable at these seeds) | 30 min |"]
  readme.write_text("no markers\n")
  with pytest.raises(study_lib.StudyError, match="no summary table markers"):
    report.write_summary(str(docs))


def test_the_calibrated_studies_test_a_claim_over_three_seeds():
  for name in ("study_electra_vs_bert.py", "study_masking.py", "study_albert_sop.py"):
    s = study_lib.load(os.path.join(ROOT, "configs", "ablations", name))
    assert len(study_lib.seeds_of(s)) >= 3, name
    assert s.compare.metric in study_lib.METRICS and "probe" in s.evaluate, name
