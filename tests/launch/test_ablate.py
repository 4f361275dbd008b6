"""The ablation runner (launch/ablate.py, launch/ablation/): study validation and bad
input, device slices, the report's content; slow: a two-arm micro-study with two
pretraining seeds end to end with its resume (a finished arm is skipped, an interrupted
seed resumes from its checkpoint, a finished seed is kept) and the same study with
--parallel 2 subprocesses. The statistics and the probe: test_ablation_stats.py."""
import csv
import json
import os
import subprocess
import sys

import ml_collections
import pytest

from launch.ablation import report
from launch.ablation import runner
from launch.ablation import study as study_lib
from tests.launch import finetune_helpers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ("model.num_hidden_layers=1", "model.hidden_size=32", "model.num_attention_heads=2",
         "model.intermediate_size=64", "tokenizer.vocab_size=600",
         "tokenizer.train_sentences=20000", "data.max_documents=80",
         "data.eval_fraction=0.1", "train.eval_batches=2", "data.global_batch=8")


def micro_study(data_file="", seeds=(0, 1), pair_tasks=("nsp", "sop"), pretrain_seeds=(0,),
                probe_file=""):
  c = ml_collections.ConfigDict()
  c.name = "micro"
  c.paper = "BERT (Devlin et al. 2019)"
  c.table = "Table 5"
  c.question = "does NSP help?"
  c.scale = ml_collections.ConfigDict(dict(variant="tiny", steps=4, seq_len=32,
                                           global_batch=0, checkpoint_every=2,
                                           learning_rate=0.0, seeds=pretrain_seeds,
                                           evals=2))
  c.paper_columns = ("MNLI-m", "SST-2")
  c.paper_compare = "SST-2"
  c.order = ("nsp", "no_nsp")
  c.arms = ml_collections.ConfigDict()
  base = "configs/ablations/bert_pretraining.py:{variant},setting="
  c.arms.nsp = dict(config=base + "nsp", overrides=SMALL, label="BERT",
                    note="as the paper", paper=("84.4", "92.7"), match_flops_of="")
  c.arms.no_nsp = dict(config=base + "no_nsp", overrides=SMALL, label="No NSP",
                       note="as the paper", paper=("83.9", "92.6"), match_flops_of="")
  c.not_run = ("LTR & No NSP: no left-to-right model here",)
  ev = dict(mlm=True, pair_tasks=pair_tasks)
  if data_file:
    ev["finetune"] = dict(dataset=data_file, max_rows=-1, eval_fraction=0.25, split_seed=0,
                          epochs=1, seeds=seeds, seq_len=16, global_batch=8,
                          learning_rate=1e-3, text_column="text", label_column="label")
  if probe_file:
    ev["probe"] = dict(dataset=probe_file, max_rows=-1, eval_fraction=0.25, split_seed=0,
                       max_train=-1, seq_len=16, pool="mlm", text_column="text",
                       label_column="label")
  c.evaluate = ml_collections.ConfigDict(ev)
  return c


def write_study_file(path, study):
  """A study config file holding `study` (as JSON, rebuilt into a ConfigDict)."""
  payload = json.dumps(study.to_dict(), default=list)
  path.write_text(
      "import json\nimport ml_collections\n\n"
      f"PAYLOAD = {payload!r}\n\n"
      "def get_config():\n"
      "  return ml_collections.ConfigDict(json.loads(PAYLOAD))\n")
  return str(path)


def sentiment_csv(path, n=64):
  rows = finetune_helpers.sentiment_rows(n)
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=("text", "label"))
    w.writeheader()
    w.writerows(rows)
  return str(path)


# ---- validation and bad input (fast) -----------------------------------------------------

def test_a_valid_study_loads_every_arm_config():
  s = micro_study()
  study_lib.check_all(s)
  c = study_lib.arm_config(s, "no_nsp")
  assert c.train.steps == 4 and c.data.seq_len == 32 and c.model.hidden_size == 32
  assert c.objective.name == "mlm" and c.train.eval_every == 2 and c.checkpoint.every == 2
  assert study_lib.arm_names(s) == ["nsp", "no_nsp"]  # `order`, not ConfigDict's sorting
  seeded = study_lib.arm_config(s, "no_nsp", seed=3)  # a pretraining seed: init and data
  assert seeded.train.seed == 3 and seeded.data.shuffle_seed == 3
  assert study_lib.fingerprint(s, "no_nsp", c) == study_lib.fingerprint(
      s, "no_nsp", study_lib.arm_config(s, "no_nsp"))


@pytest.mark.parametrize("field", ["table", "paper", "arms", "evaluate"])
def test_a_missing_study_field_is_named(field):
  s = micro_study()
  del s[field]
  with pytest.raises(study_lib.StudyError, match=f"has no '{field}'"):
    study_lib.validate(s)


def test_an_unknown_arm_key_is_named():
  s = micro_study()
  s.arms.nsp.confg = "typo"
  with pytest.raises(study_lib.StudyError, match="arm 'nsp' has unknown key 'confg'"):
    study_lib.validate(s)


def test_an_unknown_override_key_names_the_arm_and_the_fix():
  s = micro_study()
  s.arms.no_nsp.overrides = SMALL + ("train.stepz=3",)
  with pytest.raises(study_lib.StudyError,
                     match=r"arm 'no_nsp'.*unknown config key train.stepz; did you mean "
                           r"train.steps"):
    study_lib.check_all(s)


def test_other_bad_studies():
  s = micro_study()
  s.arms.nsp.match_flops_of = "no_nsp"  # listed after it
  with pytest.raises(study_lib.StudyError, match="not an arm listed before it"):
    study_lib.validate(s)
  s = micro_study()
  s.arms.nsp.paper = ("84.4",)
  with pytest.raises(study_lib.StudyError, match="gives 1 paper numbers for 2"):
    study_lib.validate(s)
  s = micro_study()
  s.order = ("nsp",)
  with pytest.raises(study_lib.StudyError, match="must list each arm once"):
    study_lib.validate(s)
  s = micro_study()
  s.evaluate.pair_tasks = ("nsp", "xyz")
  with pytest.raises(study_lib.StudyError, match="pair_tasks has 'xyz'"):
    study_lib.validate(s)
  s = micro_study()
  s.scale.seeds = (0, 0)
  with pytest.raises(study_lib.StudyError, match="scale.seeds=.*distinct integers"):
    study_lib.validate(s)
  s = micro_study(probe_file="x.csv")
  s.evaluate.probe.pool = "max"
  with pytest.raises(study_lib.StudyError, match="evaluate.probe.pool='max'"):
    study_lib.validate(s)
  s = micro_study()
  s.evaluate.prob = 1
  with pytest.raises(study_lib.StudyError, match="unknown evaluate key 'prob'"):
    study_lib.validate(s)
  s = micro_study()
  s.compare = ml_collections.ConfigDict(dict(higher="nsp", lower="bert",
                                             metric="probe_accuracy", paper=""))
  with pytest.raises(study_lib.StudyError, match="compare.lower='bert' is not an arm"):
    study_lib.validate(s)
  s.compare.lower, s.compare.metric = "no_nsp", "glue"
  with pytest.raises(study_lib.StudyError, match="compare.metric='glue'"):
    study_lib.validate(s)


def test_the_command_line_says_a_bad_study_in_one_line(tmp_path):
  s = micro_study()
  del s["table"]
  path = write_study_file(tmp_path / "bad.py", s)
  r = subprocess.run([sys.executable, "-m", "launch.ablate", "--config", path, "--workdir",
                      str(tmp_path / "wd")], capture_output=True, text=True, cwd=ROOT,
                     env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)
  assert r.returncode == 2
  assert r.stderr.strip().splitlines() == [
      "error: study 'micro' has no 'table' (a study needs name, paper, table, arms, "
      "evaluate)"]
  assert not (tmp_path / "wd").exists()


def test_device_slices_are_disjoint():
  cpu = runner.slice_env("cpu", 1, 4, {"XLA_FLAGS": "--xla_foo=1"})
  assert cpu["XLA_FLAGS"] == "--xla_foo=1 --xla_force_host_platform_device_count=4"
  assert cpu["JAX_PLATFORMS"] == "cpu"
  gpus = [runner.slice_env("gpu", i, 2, {})["CUDA_VISIBLE_DEVICES"] for i in range(2)]
  assert gpus == ["0,1", "2,3"]
  tpu = [runner.slice_env("tpu", i, 2, {}) for i in range(2)]
  assert [t["TPU_VISIBLE_CHIPS"] for t in tpu] == ["0,1", "2,3"]
  assert {t["TPU_CHIPS_PER_PROCESS_BOUNDS"] for t in tpu} == {"1,2,1"}
  assert tpu[0]["TPU_PROCESS_PORT"] != tpu[1]["TPU_PROCESS_PORT"]
  with pytest.raises(study_lib.StudyError, match="devices_per_arm=3 on TPU"):
    runner.slice_env("tpu", 0, 3, {})


def _seed_row(seed, probe, random, mlm=0.1, ft=None):
  row = {"seed": seed, "steps": 4, "params": 10, "step_flops": 2.5e8, "pretrain_flops": 1e9,
         "mlm_accuracy": mlm, "mlm_baseline": 0.03, "pair_on_nsp": 0.6,
         "pair_on_nsp_count": 10.0, "pair_on_sop": 0.5, "pair_on_sop_count": 10.0,
         "probe_accuracy": probe, "probe_random": random, "probe_gain": probe - random,
         "probe_majority": 0.55, "curve": [{"step": 2, "mlm_accuracy": mlm / 2},
                                           {"step": 4, "mlm_accuracy": mlm}]}
  if ft is not None:
    row["finetune"] = [{"seed": 0, "accuracy": ft}]
    row["finetune_accuracy"] = ft
  return row


def _arm_row(study, arm, probes, randoms, ft=None):
  from launch.ablation import arm as arm_lib
  seeds = [_seed_row(k, p, r, ft=None if ft is None else ft[k])
           for k, (p, r) in enumerate(zip(probes, randoms))]
  return arm_lib.aggregate(study, arm, seeds, {"pretrain_s": 3.0, "probe_s": 4.0})


def test_the_report_has_one_row_per_arm_and_the_papers_numbers(tmp_path):
  s = micro_study(data_file="x.csv", probe_file="y.csv", pretrain_seeds=(0, 1, 2))
  s.compare = ml_collections.ConfigDict(dict(higher="nsp", lower="no_nsp",
                                             metric="probe_accuracy", paper="NSP helps"))
  rows = [_arm_row(s, "nsp", [0.70, 0.72, 0.74], [0.55, 0.56, 0.54], ft=[0.69, 0.71, 0.70]),
          _arm_row(s, "no_nsp", [0.60, 0.61, 0.65], [0.55, 0.55, 0.56], ft=[0.6, 0.6, 0.6])]
  paths = report.write_all(s, rows, str(tmp_path), command="python -m launch.ablate ...",
                           load="1.0 1.0 1.0", baseline=0.55,
                           run_info={"load_start": "0.5 0.5 0.5", "elapsed_s": 120.0})
  with open(paths["csv"]) as f:
    got = list(csv.DictReader(f))
  assert [r["arm"] for r in got] == ["nsp", "no_nsp"]
  assert got[0]["probe_accuracy_seeds"] == "0.7000 0.7200 0.7400" and got[0]["seeds"] == "0 1 2"
  assert abs(float(got[0]["probe_accuracy_se"]) - 0.02 / 3 ** 0.5) < 1e-9
  assert got[1]["paper: SST-2"] == "92.6" and float(got[0]["pretrain_flops"]) == 1e9
  md = open(paths["md"]).read()
  # mean ± standard error over the 3 pretraining seeds; the random-init row
  assert "| nsp | BERT | 4 | 1.00e+09 | 10.0 ± 0.0 (3.0 ± 0.0) | 60.0 ± 0.0 | 50.0 ± 0.0 | " \
         "72.0 ± 1.2 | 70.0 ± 0.6 | 7 |" in md
  assert "| random init (nsp) | same encoder, no pretraining | 0 | 0 | — | — | — | " \
         "55.0 ± 0.6 | — | — |" in md
  assert "| no_nsp | No NSP | 83.9 | 92.6 | as the paper |" in md
  # the claim, paired by seed: differences 10, 11, 9 points -> 10.0 ± 0.6, t = 17.32
  assert "- The paper: NSP helps" in md
  assert "BERT − No NSP = +10.0 points, standard error 0.6, t = 17.32" in md
  assert "**yes**" in md
  assert "BERT: probe +17.0 ± 1.5 points over random init (> 2 SE)" in md
  assert "load average at the start 0.5 0.5 0.5, at the end 1.0 1.0 1.0" in md
  assert "| step | nsp: mlm % | no_nsp: mlm % |" in md and "| 4 | 10.0 | 10.0 |" in md
  assert "LTR & No NSP: no left-to-right model here" in md
  assert os.path.getsize(paths["png"]) > 1000
  summary = json.load(open(paths["summary"]))
  assert summary["reproduced"] is True and summary["seeds"] == [0, 1, 2]
  assert summary["ours"].startswith("BERT − No NSP: +10.0 ± 0.6 points")


# ---- end to end (slow) --------------------------------------------------------------------

def _records(path, split):
  with open(os.path.join(path, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f if f'"split": "{split}"' in line]


@pytest.mark.slow
def test_a_two_arm_study_runs_resumes_and_reports(tmp_path):
  data = sentiment_csv(tmp_path / "sentiment.csv")
  s = micro_study(data, seeds=(0, 1), pretrain_seeds=(0, 1), probe_file=data)
  s.compare = ml_collections.ConfigDict(dict(higher="nsp", lower="no_nsp",
                                             metric="probe_accuracy", paper=""))
  wd = str(tmp_path / "study")
  rows, paths = runner.run_study(s, wd, arms=("nsp",))  # one arm first
  assert [r["arm"] for r in rows] == ["nsp"]
  nsp = rows[0]
  assert nsp["seeds"] == [0, 1] and len(nsp["per_seed"]) == 2
  assert nsp["pair_on_nsp_count"] > 0 and 0 <= nsp["pair_on_sop"] <= 1
  assert len(nsp["downstream_seeds"]) == 4 and nsp["pretrain_flops"] > 0  # 2 x 2 seeds
  assert len(nsp["metrics"]["probe_accuracy"]["values"]) == 2
  assert len(nsp["metrics"]["probe_random"]["values"]) == 2  # the random-init baseline
  for k in (0, 1):
    seed = os.path.join(wd, "arms", "nsp", f"seed{k}")
    fp = json.load(open(os.path.join(seed, "pretrain", "run_fingerprint.json")))
    assert fp["fingerprint"]["data.shuffle_seed"] == k  # the seed's own data order
    assert os.path.isfile(os.path.join(seed, "random_init", "hf", "config.json"))
  done_at = os.path.getmtime(os.path.join(wd, "arms", "nsp", "result.json"))

  rows, paths = runner.run_study(s, wd)  # the finished arm is skipped, the other runs
  assert [r["arm"] for r in rows] == ["nsp", "no_nsp"]
  assert os.path.getmtime(os.path.join(wd, "arms", "nsp", "result.json")) == done_at
  assert "pair_on_nsp" not in rows[1]  # no pair head: nothing to score
  state = json.load(open(os.path.join(wd, "study.json")))
  assert {a: r["status"] for a, r in state["arms"].items()} == {"nsp": "done",
                                                                "no_nsp": "done"}

  # Interrupt no_nsp in its second seed: the last checkpoint, export, fine-tuning seed
  # and rows are gone; seed 0 is finished and kept.
  arm = os.path.join(wd, "arms", "no_nsp")
  seed1 = os.path.join(arm, "seed1")
  pre = os.path.join(seed1, "pretrain")
  import shutil
  shutil.rmtree(os.path.join(pre, "checkpoints", "4"))
  shutil.rmtree(os.path.join(pre, "hf"))
  shutil.rmtree(os.path.join(seed1, "finetune_s1"))
  for name in ("probe.json", "result.json"):
    os.remove(os.path.join(seed1, name))
  os.remove(os.path.join(arm, "result.json"))
  seed0 = os.path.getmtime(os.path.join(arm, "seed0", "result.json"))
  ft0 = os.path.getmtime(os.path.join(seed1, "finetune_s0", "results.json"))
  rows, _ = runner.run_study(s, wd)
  assert len(_records(pre, "run")) == 1  # resumed, not restarted
  assert [r["step"] for r in _records(pre, "train")].count(4) == 2  # steps 3-4 again
  assert os.path.getmtime(os.path.join(arm, "seed0", "result.json")) == seed0
  assert os.path.getmtime(os.path.join(seed1, "finetune_s0", "results.json")) == ft0
  assert len(rows[1]["downstream_seeds"]) == 4 and rows[1]["seeds"] == [0, 1]

  with open(paths["csv"]) as f:
    assert [r["arm"] for r in csv.DictReader(f)] == ["nsp", "no_nsp"]
  md = open(paths["md"]).read()
  assert "| nsp | BERT | 4 |" in md and "| no_nsp | No NSP | 4 |" in md
  assert "| random init (no_nsp) |" in md and "paired by pretraining seed (2 seeds)" in md
  assert os.path.getsize(paths["png"]) > 1000

  s.scale.seeds = (0, 1, 2)  # one more seed: the finished ones are kept
  assert not runner.claim(s, "nsp", wd, None)
  s.scale.seeds = (0, 1)
  s.arms.no_nsp.overrides = SMALL + ("objective.mask_rate=0.3",)  # changed under results
  with pytest.raises(study_lib.StudyError, match="arm 'no_nsp' .* another config"):
    runner.run_study(s, wd)


@pytest.mark.slow
def test_parallel_arms_run_as_subprocesses_on_their_own_devices(tmp_path):
  s = micro_study(pair_tasks=())
  path = write_study_file(tmp_path / "study.py", s)
  wd = tmp_path / "study"
  r = subprocess.run([sys.executable, "-m", "launch.ablate", "--config", path, "--workdir",
                      str(wd), "--parallel", "2", "--devices_per_arm", "2"],
                     capture_output=True, text=True, cwd=ROOT,
                     env=dict(os.environ, PYTHONPATH=ROOT), timeout=1800)
  assert r.returncode == 0, r.stderr[-3000:]
  for arm in ("nsp", "no_nsp"):
    run = _records(str(wd / "arms" / arm / "pretrain"), "run")[0]
    assert run["devices"] == 2  # its own slice of 2 (fake CPU) devices
  state = json.loads((wd / "study.json").read_text())
  assert sorted(r["slot"] for r in state["arms"].values()) == [0, 1]
  assert (wd / "results.md").exists() and (wd / "results.png").exists()


STUDIES = sorted(os.path.basename(p) for p in __import__("glob").glob(
    os.path.join(ROOT, "configs", "ablations", "study_*.py")))


@pytest.mark.parametrize("name", STUDIES)
def test_every_study_config_is_valid(name):
  s = study_lib.load(os.path.join(ROOT, "configs", "ablations", name))
  study_lib.check_all(s)  # every arm's pretraining config loads with its overrides
  assert s.paper and s.table and study_lib.arm_names(s)


def test_albert_nsp_arm_trains_the_one_pair_classifier():
  from configs.ablations import albert as albert_ablation
  c = albert_ablation.get_config("tiny,setting=nsp")
  assert c.objective.name == "mlm_nsp" and c.data.pair_task == "nsp"
  assert c.objective.pair_head == "sop" and tuple(c.model.heads) == ("mlm", "sop")
  import objectives
  tok = type("T", (), {"vocab_size": 8000, "pad_id": 0, "mask_id": 4})()
  c = ml_collections.ConfigDict(c.to_dict())
  c.model.vocab_size = 8000
  objectives.get_objective(c, tok)  # builds: the "sop" head is the one NSP trains
  c.objective.pair_head = "nsp"
  with pytest.raises(ValueError, match="lacks \\['nsp'\\]"):
    objectives.get_objective(c, tok)
  assert albert_ablation.get_config("tiny,setting=e32").model.embedding_size == 32
  c = albert_ablation.get_config("tiny,setting=not_shared")
  assert c.model.num_hidden_groups == c.model.num_hidden_layers


def test_workers_get_the_command_line_without_the_runners_flags():
  from launch import ablate
  got = ablate._worker_argv(["--config", "s.py", "--parallel", "2", "--workdir=w",
                             "--devices_per_arm=2", "--config.scale.steps=5", "--arms",
                             "a,b", "--platform", "cpu"])
  assert got == ["--config", "s.py", "--workdir=w", "--config.scale.steps=5"]


def test_majority_baseline_counts_one_class_per_value(tmp_path, monkeypatch):
  """1, "1" and 1.0 are one class for the baseline as for fine-tuning."""
  from launch.ablation import arm as arm_lib
  from launch.data import finetune_data as fd
  path = tmp_path / "d.csv"
  values = ["1", "1.0", "1", "2"] * 10
  path.write_text("\n".join(["text,label"] + [f"t{i},{v}" for i, v in enumerate(values)])
                  + "\n")
  monkeypatch.setattr(arm_lib, "downstream_file", lambda ft, wd: str(path))
  got = arm_lib.majority_baseline({"eval_fraction": 0.25, "split_seed": 0}, str(tmp_path))
  _, ev = fd.holdout(len(values), 0.25, 0)
  want = sum(values[i] in ("1", "1.0") for i in ev) / len(ev)  # "1.0" rows are class 1
  assert want != sum(values[i] == "1" for i in ev) / len(ev)  # the case tells them apart
  assert got == want
