"""Issue 46, the trainer's side: nothing a user owns is written, one trainer per work
directory, a resume checks what it resumes, every setting is checked before data work,
and divergence is loud (launch/trainer/{lock,fingerprint,checks,guard,loop}.py)."""
import json
import os
import re
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from encoders import outdir
from launch import cli
from launch import trainer as train
from launch.trainer import fingerprint as fp_lib
from launch.trainer import guard
from launch.trainer import lock
from launch.trainer import loop
from launch.trainer import pretraining
from launch.trainer import metrics as metrics_lib
from tests.launch import fault_helpers
from tests.launch.train_helpers import copy_workdir, first_devices, small_config
from tests.launch.train_helpers import tokenizer_cache  # noqa: F401  (a fixture)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _snapshot(wd):
  """Every file under `wd`: its bytes' digest and mtime (a refusal changes none)."""
  out = {}
  for root, dirs, files in os.walk(wd):
    for name in files + dirs:
      p = os.path.join(root, name)
      if os.path.isfile(p):
        with open(p, "rb") as f:
          out[p] = (hash(f.read()), os.stat(p).st_mtime_ns)
      else:
        out[p] = "dir"
  return out


@pytest.fixture(scope="module")
def partial_run(tmp_path_factory, tokenizer_cache):  # noqa: F811
  """A run stopped at step 2 of 4 (a checkpoint, config.json, run_fingerprint.json)."""
  wd = copy_workdir(tmp_path_factory.mktemp("partial"), "wd", tokenizer_cache)
  c = small_config(train__steps=4, checkpoint__every=2, train__eval_every=4)
  out = train.train_and_evaluate(c, wd, first_devices(1), stop_after=2)
  assert out["step"] == 2
  return wd


def _partial_config(**overrides):
  base = dict(train__steps=4, checkpoint__every=2, train__eval_every=4)
  base.update(overrides)
  return small_config(**base)


# ---------------------------------------------------------------------- the lock

def test_lock_refuses_a_second_holder_naming_pid_and_host(tmp_path):
  wd = str(tmp_path)
  with lock.hold(wd) as h:
    assert h.held
    info = lock.holder(wd)
    assert info["pid"] == os.getpid() and info["host"]
    with pytest.raises(lock.WorkdirLocked) as e:
      lock.acquire(wd)
    msg = str(e.value)
    assert f"pid {os.getpid()} on host {info['host']}" in msg and "\n" not in msg
    assert isinstance(e.value, cli.ConfigError)
  h2 = lock.acquire(wd)  # released: free again
  lock.release(h2)
  lock.release(h2)  # twice: a no-op
  assert not lock.acquire(wd, enabled=False).held  # other processes of a run share it
  assert not lock.acquire("gs://bucket/run").held  # object stores: skipped


def test_second_trainer_refused_while_another_process_holds_the_lock(partial_run):
  before = _snapshot(partial_run)
  holder = subprocess.Popen(
      [sys.executable, "-c", "import sys, time\nfrom launch.trainer import lock\n"
       f"lock.acquire({partial_run!r}); print('held', flush=True); time.sleep(60)"],
      cwd=REPO, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(lock.WorkdirLocked, match=re.escape(f"pid {holder.pid} on host ")):
      train.train_and_evaluate(_partial_config(), partial_run, first_devices(1))
  finally:
    holder.kill()
    holder.wait()
  lock_file = os.path.join(partial_run, lock.LOCK_FILE)  # the holder's own writes
  after = _snapshot(partial_run)
  after.pop(lock_file), before.pop(lock_file)
  assert after == before  # refused before anything was written


# ---------------------------------------------------------------------- ownership

def test_a_users_directory_is_refused_before_anything_is_written(tmp_path):
  wd = tmp_path / "mine"
  wd.mkdir()
  (wd / "notes.txt").write_text("my thesis")
  with pytest.raises(cli.ConfigError, match="non-empty directory this project did not "
                     "write") as e:
    train.train_and_evaluate(small_config(), str(wd), first_devices(1))
  assert "\n" not in str(e.value)
  assert sorted(os.listdir(wd)) == ["notes.txt"]


def test_ownership_of_new_empty_linked_and_file_paths(tmp_path):
  assert loop.ownership(str(tmp_path / "absent")) == "new"
  (tmp_path / "empty").mkdir()
  assert loop.ownership(str(tmp_path / "empty")) == "new"
  os.symlink(tmp_path / "empty", tmp_path / "link")  # e.g. a scratch volume's directory
  assert loop.ownership(str(tmp_path / "link")) == "new"
  (tmp_path / "file").write_text("x")
  with pytest.raises(cli.ConfigError, match="is not a directory"):
    loop.ownership(str(tmp_path / "file"))
  assert loop.ownership("gs://bucket/run") == "remote"


def test_an_earlier_versions_workdir_is_adopted(partial_run, tmp_path):
  wd = str(tmp_path / "old")
  shutil.copytree(partial_run, wd)
  os.remove(os.path.join(wd, outdir.MARKER))
  os.remove(os.path.join(wd, fp_lib.FILE))
  os.makedirs(os.path.join(wd, "hf"))  # an export written before markers existed
  for name in ("config.json", "model.safetensors"):
    with open(os.path.join(wd, "hf", name), "w") as f:
      f.write("{}")
  assert loop.ownership(wd) == "legacy"
  # its settings are read from its config.json: another activation is still refused
  with pytest.raises(cli.ConfigError, match=r'model.hidden_act: "gelu" -> "relu"'):
    loop.claim(_partial_config(model__hidden_act="relu"), wd,
               fp_lib.fingerprint(_partial_config(model__hidden_act="relu")))
  assert not outdir.is_ours(wd)
  config = _partial_config()
  handle, accepted = loop.claim(config, wd, fp_lib.fingerprint(config))
  lock.release(handle)
  assert accepted == {} and outdir.is_ours(wd) and loop.ownership(wd) == "ours"
  from encoders import hf as hf_lib
  hf_lib.check_export_target(os.path.join(wd, "hf"))  # the resumed run may export over it


# ---------------------------------------------------------------------- resume checks

def test_resume_with_another_architecture_is_refused_and_changes_nothing(partial_run):
  before = _snapshot(partial_run)
  with open(os.path.join(partial_run, "config.json"), "rb") as f:
    config_json = f.read()
  c = _partial_config(model__hidden_act="relu", model__position_init="normal",
                      objective__mask_rate=0.2)
  with pytest.raises(cli.ConfigError) as e:
    train.train_and_evaluate(c, partial_run, first_devices(1))
  msg = str(e.value)
  assert "\n" not in msg
  assert 'model.hidden_act: "gelu" -> "relu"' in msg
  assert "objective.mask_rate: 0.15 -> 0.2" in msg
  assert "model.position_init: " in msg
  assert ("--config.train.allow_config_change='model.hidden_act,model.position_init,"
          "objective.mask_rate'") in msg
  with open(os.path.join(partial_run, "config.json"), "rb") as f:
    assert f.read() == config_json  # byte for byte
  assert _snapshot(partial_run) == before


def test_refused_size_change_leaves_config_json_alone(partial_run):
  before = _snapshot(partial_run)
  c = _partial_config(model__hidden_size=32, model__intermediate_size=64)
  with pytest.raises(cli.ConfigError, match=r"model.hidden_size: 64 -> 32; "
                     r"model.intermediate_size: 128 -> 64\. Use a new --workdir"):
    train.train_and_evaluate(c, partial_run, first_devices(1))
  assert _snapshot(partial_run) == before  # config.json included


def test_longer_steps_and_allowed_changes_pass_the_resume_check(partial_run):
  assert loop.resume_check(_partial_config(train__steps=50), partial_run,
                           fp_lib.fingerprint(_partial_config(train__steps=50))) == {}
  c = _partial_config(model__hidden_act="relu", train__allow_config_change="model.hidden_act")
  assert loop.resume_check(c, partial_run, fp_lib.fingerprint(c)) == {
      "model.hidden_act": ("gelu", "relu")}
  c = _partial_config(objective__mask_rate=0.2, train__allow_config_change="objective")
  assert loop.resume_check(c, partial_run, fp_lib.fingerprint(c)) == {
      "objective.mask_rate": (0.15, 0.2)}
  # runtime settings are no difference at all
  c = _partial_config(train__log_every=2, checkpoint__every=1, logging__tensorboard=False,
                      optimizer__learning_rate=1e-4, train__compilation_cache_dir="")
  assert loop.resume_check(c, partial_run, fp_lib.fingerprint(c)) == {}


def test_allowed_change_resumes_and_is_recorded(partial_run, tmp_path):
  wd = str(tmp_path / "resumed")
  shutil.copytree(partial_run, wd)
  c = _partial_config(model__hidden_act="relu", train__allow_config_change="model.hidden_act",
                      train__steps=5)
  out = train.train_and_evaluate(c, wd, first_devices(1))
  assert out["step"] == 5
  record = fp_lib.read(wd)
  assert record["fingerprint"]["model.hidden_act"] == "relu"
  assert record["changes"][-1]["changed"] == {"model.hidden_act": ["gelu", "relu"]}
  with open(os.path.join(wd, "config.json")) as f:
    assert json.load(f)["model"]["hidden_act"] == "relu"
  summary = [r for r in metrics_lib.read(wd) if r.get("split") == "summary"][-1]
  assert summary["step"] == 5 and summary["skipped_steps"] == 0
  assert summary["bad_data_skipped"] == 0 and "data" in summary


def test_cli_refuses_a_users_directory_in_one_line_with_exit_2(tmp_path):
  wd = tmp_path / "mine"
  wd.mkdir()
  (wd / "results.csv").write_text("a,b")
  proc = subprocess.run(
      [sys.executable, "-m", "launch.pretrain", "--config", "configs/bert.py:tiny",
       "--workdir", str(wd), "--config.train.steps=2"],
      check=False, capture_output=True, text=True, cwd=REPO)
  assert proc.returncode == 2, proc.stderr[-2000:]
  err = proc.stderr.strip().splitlines()[-1]
  assert err.startswith(f"error: work directory {wd} is a non-empty directory this project "
                        "did not write"), proc.stderr[-2000:]
  assert sorted(os.listdir(wd)) == ["results.csv"]


def test_allow_config_change_with_an_unknown_key_is_refused(tmp_path):
  with pytest.raises(cli.ConfigError, match="train.allow_config_change names 'modle.x'"):
    train.train_and_evaluate(small_config(train__allow_config_change="modle.x"),
                             str(tmp_path / "wd"), first_devices(1))


# ---------------------------------------------------------------------- start-up checks

@pytest.mark.parametrize("overrides,expected", [
    ({"data__bad_data": "ignore"}, "data.bad_data='ignore'; expected one of ('skip', 'error')"),
    ({"data__max_document_bytes": 0}, "data.max_document_bytes=0"),
    ({"train__nonfinite_policy": "ignore"}, "train.nonfinite_policy='ignore'"),
    ({"train__grad_spike_factor": 0.5}, "train.grad_spike_factor=0.5"),
    ({"train__max_consecutive_skips": 0}, "train.max_consecutive_skips=0 must be an integer"),
    ({"train__max_skipped_fraction": 0.0}, "train.max_skipped_fraction=0.0 must be a number in "
     "(0, 1]"),
    ({"objective__mask_rate": 1.5}, "objective.mask_rate=1.5 must be in (0, 1]"),
    ({"objective__mask_rate": 0.0}, "objective.mask_rate=0.0 must be in (0, 1]"),
    ({"objective__eval_mask_rate": -0.1}, "objective.eval_mask_rate=-0.1 must be in [0, 1]"),
    ({"objective__random_token_prob": 1.2}, "objective.random_token_prob=1.2 must be in"),
    ({"objective__mask_token_prob": 0.95}, "mask_token_prob=0.95 + random_token_prob=0.1 "
     "must be <= 1"),
    ({"objective__max_predictions": 2}, "objective.max_predictions=2 is smaller than"),
    ({"objective__name": "mlmx"}, "unknown objective 'mlmx'"),
    ({"model__hidden_dropout_prob": 1.0}, "model.hidden_dropout_prob=1.0 must be a number in "
     "[0, 1)"),
    ({"model__attention_probs_dropout_prob": -0.1}, "model.attention_probs_dropout_prob=-0.1"),
    ({"model__hidden_act": "gelux"}, "model.hidden_act='gelux'; expected one of"),
    ({"model__layer_norm_eps": 0.0}, "model.layer_norm_eps=0.0 must be a number > 0"),
    ({"optimizer__name": "sgdx"}, "optimizer.name='sgdx'; expected one of"),
    ({"optimizer__schedule": "cosinus"}, "optimizer.schedule='cosinus'; expected one of"),
    ({"optimizer__weight_decay": -0.01}, "optimizer.weight_decay=-0.01 must be a number >= 0"),
    ({"optimizer__b1": 1.0}, "optimizer.b1=1.0 must be a number in [0, 1)"),
    ({"optimizer__b2": -0.5}, "optimizer.b2=-0.5 must be a number in [0, 1)"),
    ({"optimizer__eps": 0.0}, "optimizer.eps=0.0 must be a number > 0"),
    ({"optimizer__clip_norm": -1.0}, "optimizer.clip_norm=-1.0 must be a number >= 0"),
    ({"optimizer__decay_fraction": 1.5}, "optimizer.decay_fraction=1.5 must be a number in"),
    ({"optimizer__learning_rate": float("nan")}, "optimizer.learning_rate=nan"),
    ({"checkpoint__keep": 0}, "checkpoint.keep=0 must be an integer >= 1"),
    ({"data__eval_fraction": 1.0}, "data.eval_fraction=1.0 must be a number in [0, 1)"),
])
def test_every_enum_and_rate_is_checked_before_data_work(tmp_path, overrides, expected):
  wd = tmp_path / "wd"
  with pytest.raises(cli.ConfigError, match=re.escape(expected)) as e:
    train.train_and_evaluate(small_config(**overrides), str(wd), first_devices(1))
  assert "\n" not in str(e.value)
  assert not wd.exists()  # no tokenizer trained, no data cached, nothing written


def test_objective_specific_settings_are_checked_at_start_up():
  from configs import distilbert, electra
  from launch.trainer import checks
  for mod, variant, key, value, expected in [
      (electra, "small", "sharing", "shared", "objective.sharing='shared'"),
      (electra, "small", "rtd_positions", "some", "objective.rtd_positions='some'"),
      (electra, "small", "disc_weight", 0.0, "objective.disc_weight=0.0 must be > 0"),
      (electra, "small", "generator_width", 1.5, "objective.generator_width=1.5"),
      (distilbert, "tiny", "ce_positions", "most", "objective.ce_positions='most'"),
      (distilbert, "tiny", "temperature", 0.0, "objective.temperature=0.0 must be > 0"),
      (distilbert, "tiny", "student_init", "odd", "objective.student_init='odd'"),
  ]:
    c = mod.get_config(variant).unlock()
    c.mesh.shape = (1, 1, 1)
    c.objective[key] = value
    with pytest.raises(cli.ConfigError, match=re.escape(expected)):
      checks.check(c, first_devices(1))
  from configs.ablations import electra as electra_ablations
  for setting, key, value, expected in [
      ("replace_mlm", "mlm_targets", "some", "objective.mlm_targets='some'"),
      ("replace_mlm", "copy_gate", True, "objective.copy_gate needs"),
      ("all_tokens_mlm", "rtd_positions", "masked", "objective.rtd_positions is an rtd"),
  ]:
    c = electra_ablations.get_config(f"tiny,setting={setting}").unlock()
    c.mesh.shape = (1, 1, 1)
    checks.check(c, first_devices(1))  # the shipped setting passes
    c.objective[key] = value
    with pytest.raises(cli.ConfigError, match=re.escape(expected)):
      checks.check(c, first_devices(1))


# ---------------------------------------------------------------------- divergence

def _poison_from(monkeypatch, first_bad):
  """Train steps from the `first_bad`-th call on (1-based) get NaN gradients."""
  fault_helpers.poison_gradients(monkeypatch, lambda n: n >= first_bad)


def test_consecutive_skips_stop_the_run_and_are_shown(tmp_path, tokenizer_cache,  # noqa: F811
                                                      monkeypatch):
  _poison_from(monkeypatch, 3)
  wd = copy_workdir(tmp_path, "diverge", tokenizer_cache)
  c = small_config(train__nonfinite_policy="skip", train__max_consecutive_skips=3,
                   train__steps=8, train__eval_every=100, checkpoint__every=100)
  with pytest.raises(guard.Diverged, match=r"training stopped at step 5: 3 updates in a "
                     r"row were skipped \(steps 3\.\.5"):
    train.train_and_evaluate(c, wd, first_devices(1))
  assert not os.path.exists(os.path.join(wd, "hf"))
  rec = {r["step"]: r for r in metrics_lib.read(wd) if r.get("split") == "train"}
  assert rec[2]["skipped_steps"] == 0 and np.isfinite(rec[2]["mlm_loss"])
  assert rec[3]["skipped_steps"] == 1 and rec[3]["skipped_total"] == 1
  assert "mlm_loss" not in rec[3]  # never a 0.0 loss for a step that did not train
  assert "skipped 1 of 1 (run 1)" in metrics_lib.format_line(3, "train", rec[3])
  assert "0.0000" not in metrics_lib.format_line(3, "train", rec[3])
  assert "bad_data_skipped" in rec[2]


def test_loss_is_the_mean_over_applied_steps_only():
  line = metrics_lib.format_line(10, "train", {"mlm_loss": 5.25, "skipped_steps": 1,
                                               "applied_steps": 9, "skipped_total": 4,
                                               "bad_data_skipped": 2})
  assert "skipped 1 of 10 (run 4)" in line and "mlm_loss 5.2500" in line
  assert "bad data skipped 2" in line
  assert "skipped" not in metrics_lib.format_line(1, "train", {"mlm_loss": 1.0,
                                                               "skipped_total": 0})


def test_skip_tracker_counts_in_a_row_and_in_all():
  cfg = ml_cfg(max_consecutive_skips=3, max_skipped_fraction=0.5)
  t = guard.SkipTracker(cfg, prior=1)
  s = lambda bad: {"skipped_nonfinite": float(bad), "skipped_spike": 0.0}  # noqa: E731
  assert t.observe(1, [s(1), s(1), s(0), s(1)]) == 3 and t.total == 4 and t.in_a_row == 1
  t.check_fraction(10, 10)  # 4 of 10: fine
  with pytest.raises(guard.Diverged, match="steps 4..6"):
    t.observe(5, [s(1), s(1)])
  with pytest.raises(guard.Diverged, match="6 of its 10 updates skipped"):
    t.check_fraction(10, 10)
  # the probe: 9 of 10 skipped, never 3 in a row... still not exit 0
  t = guard.SkipTracker(ml_cfg(max_consecutive_skips=10, max_skipped_fraction=0.25))
  t.observe(1, [s(1)] * 9 + [s(0)])
  with pytest.raises(guard.Diverged, match="9 of its 10 updates skipped"):
    t.check_fraction(10, 10)
  # a log interval longer than the limit: the run of skips is named, the stop is at its end
  t = guard.SkipTracker(ml_cfg(max_consecutive_skips=2))
  with pytest.raises(guard.Diverged, match=r"stopped at step 7: 3 updates in a row were "
                     r"skipped \(steps 2\.\.4, the last with a NaN"):
    t.observe(1, [s(0), s(1), s(1), s(1), s(0), s(1), s(0)])
  stop = guard.SkipTracker(ml_cfg(nonfinite_policy="stop", max_consecutive_skips=1))
  stop.observe(1, [s(1)])  # policy stop: guard.check raises instead


def ml_cfg(**kw):
  import ml_collections
  return ml_collections.ConfigDict({"nonfinite_policy": "skip", "grad_spike_factor": 0.0,
                                    "grad_spike_warmup": 3, **kw})


def test_skipped_before_reads_earlier_processes_of_the_run(tmp_path):
  recs = [{"split": "run"}, {"split": "train", "step": 2, "skipped_nonfinite": 1.0},
          {"split": "train", "step": 4, "skipped_nonfinite": 2.0, "skipped_spike": 1.0},
          # restarted from the checkpoint of step 2: step 4's record is replaced
          {"split": "train", "step": 3, "skipped_nonfinite": 0.0},
          {"split": "train", "step": 4, "skipped_nonfinite": 1.0}]
  with open(tmp_path / metrics_lib.JSONL, "w") as f:
    f.write("\n".join(json.dumps(r) for r in recs) + "\n")
  assert metrics_lib.skipped_before(str(tmp_path), 4) == 2
  assert metrics_lib.skipped_before(str(tmp_path), 2) == 1
  assert metrics_lib.skipped_before(str(tmp_path / "none"), 4) == 0


def test_nonfinite_params_are_never_exported():
  guard.assert_finite_params({"w": jnp.ones(3)}, 7, "the export /x/hf")
  with pytest.raises(guard.Diverged, match="refusing to write the export /x/hf: the params "
                     "of step 7 hold NaN/inf"):
    guard.assert_finite_params({"w": jnp.array([1.0, np.inf])}, 7, "the export /x/hf")


def test_bad_data_count_reads_whatever_the_pipeline_reports():
  class P:
    stats = {}
  p = P()
  assert pretraining.bad_data_skipped(p) == 0
  p.stats = {"bad_data": {"undecodable": 2, "binary": 3}}
  assert pretraining.bad_data_skipped(p) == 5
  p.stats = {"bad_data": 4}
  assert pretraining.bad_data_skipped(p) == 4
  p.stats = None
  assert pretraining.bad_data_skipped(p) == 0


def test_diverged_run_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys):
  from launch import pretrain

  def boom(*a, **k):
    raise guard.Diverged("training stopped at step 5: 3 updates in a row\nwere skipped")
  monkeypatch.setattr(train, "train_and_evaluate", boom)
  from absl import flags
  flags.FLAGS(["pretrain", "--config", os.path.join(REPO, "configs/bert.py:tiny"),
               "--workdir", str(tmp_path)])
  try:
    with pytest.raises(SystemExit) as e:
      pretrain.main([])
  finally:
    flags.FLAGS.unparse_flags()
  assert e.value.code == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1] == "error: training stopped at step 5: 3 updates in a row were skipped"


def test_config_json_written_only_once_accepted(tmp_path):
  """A refused start (here a user's directory) never writes config.json; it is written in
  _run after the state is restored (see the refusal tests above for resumes)."""
  wd = tmp_path / "mine"
  wd.mkdir()
  (wd / "checkpoints").mkdir()
  (wd / "data.csv").write_text("1,2")
  with pytest.raises(cli.ConfigError):
    train.train_and_evaluate(small_config(), str(wd), first_devices(1))
  assert not (wd / "config.json").exists() and not (wd / lock.LOCK_FILE).exists()


def test_cli_input_data_that_cannot_train_is_one_line_with_exit_1(tmp_path):
  """Data errors found after the start-up checks (here: every input file is binary) are
  one `error:` line naming the file, exit 1, not a traceback."""
  blob = tmp_path / "weights.bin"
  blob.write_bytes(bytes(range(256)) * 64)
  wd = tmp_path / "wd"
  proc = subprocess.run(
      [sys.executable, "-m", "launch.pretrain", "--config", "configs/bert.py:tiny-mlm",
       "--workdir", str(wd), "--config.train.steps=2", "--config.data.source=text",
       f"--config.data.files={blob}"],
      check=False, capture_output=True, text=True, cwd=REPO)
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  err = proc.stderr.strip().splitlines()[-1]
  assert err.startswith("error: ") and str(blob) in err, proc.stderr[-2000:]
  assert not (wd / "checkpoints").exists()
