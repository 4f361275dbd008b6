"""The start and end of a run as a user sees them: a rerun of a finished run changes
nothing; the end names the artifacts; the export is written with the user's umask; the
plot's panels; the CPU peak is cached; the ETA uses a moving window."""
import os

import jax
import numpy as np
import pytest

from launch.trainer import devices as devices_lib
from launch import trainer as train
from launch.trainer import metrics as metrics_lib
from launch.trainer import plotting, report
from tests.launch.train_helpers import small_config


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  """A small finished run (3 steps), written under umask 022."""
  wd = str(tmp_path_factory.mktemp("run") / "wd")
  old = os.umask(0o022)
  try:
    c = small_config(train__steps=3, logging__plot=True)
    out = train.train_and_evaluate(c, wd, jax.devices()[:1])
  finally:
    os.umask(old)
  return wd, out


def _snapshot(wd):
  out = {}
  for root, _, files in os.walk(wd):
    for name in files:
      p = os.path.join(root, name)
      out[p] = (os.path.getsize(p), os.stat(p).st_mtime_ns)
  return out


def test_rerun_of_a_finished_run_says_so_and_changes_nothing(finished_run, capsys):
  wd, first = finished_run
  capsys.readouterr()
  before = _snapshot(wd)
  again = train.train_and_evaluate(small_config(train__steps=3, logging__plot=True), wd,
                                   jax.devices()[:1])
  printed = capsys.readouterr().out
  assert "run complete at step 3; raise --config.train.steps to continue" in printed
  assert again["step"] == 3 and again["state"] is None
  assert again["eval"]["mlm_accuracy"] == pytest.approx(first["eval"]["mlm_accuracy"])
  assert _snapshot(wd) == before  # no new event file, no rewritten hf/ or plot


def test_end_of_run_names_the_artifacts():
  lines = report.artifact_lines("/runs/x", plot=True, tensorboard=True)
  text = "\n".join(lines)
  for path in ("/runs/x/hf", "/runs/x/loss.png", "/runs/x/metrics.jsonl",
               "tensorboard --logdir /runs/x/tensorboard"):
    assert path in text
  cmd = lines[-1].split(":", 1)[1].strip()
  assert cmd.startswith("python -c ") and "pipeline('fill-mask', model='/runs/x/hf')" in cmd
  assert "[MASK]" in cmd and "\n" not in cmd


def test_export_is_readable_like_the_rest(finished_run):
  wd, _ = finished_run
  hf = os.path.join(wd, "hf")
  assert os.stat(hf).st_mode & 0o777 == 0o755
  for name in os.listdir(hf):
    assert os.stat(os.path.join(hf, name)).st_mode & 0o777 == 0o644, name
  assert os.stat(os.path.join(wd, "metrics.jsonl")).st_mode & 0o777 == 0o644


def test_export_follows_a_stricter_umask(tmp_path):
  """mkdtemp's 0700 and safetensors' 0600 become what the umask (here 027) gives."""
  import tempfile

  from safetensors.numpy import save_file

  from encoders import hf as hf_io
  d = tempfile.mkdtemp(dir=tmp_path)
  save_file({"x": np.zeros((2,), np.float32)}, os.path.join(d, "model.safetensors"))
  os.makedirs(os.path.join(d, "sub"))
  old = os.umask(0o027)
  try:
    hf_io._modes_from_umask(d)
  finally:
    os.umask(old)
  assert os.stat(d).st_mode & 0o777 == 0o750
  assert os.stat(os.path.join(d, "model.safetensors")).st_mode & 0o777 == 0o640
  assert os.stat(os.path.join(d, "sub")).st_mode & 0o777 == 0o750


def test_plot_has_labeled_separate_panels(finished_run):
  wd, _ = finished_run
  fig = plotting.figure(metrics_lib.read(wd))
  axes = fig.axes
  assert len(axes) == 4  # MLM and NSP columns, loss above accuracy
  titles = [a.get_title() for a in axes]
  assert titles == ["MLM loss", "NSP loss", "MLM accuracy", "NSP accuracy"]
  for a in axes:
    assert a.get_xlabel() == "training step" and a.get_ylabel()
  legends = {a.get_title(): [t.get_text() for t in a.get_legend().get_texts()] for a in axes}
  assert any(t.startswith("MLM baseline (always ") for t in legends["MLM accuracy"])
  assert any(t.startswith("NSP baseline (always the majority label)")
             for t in legends["NSP accuracy"])
  assert not any("baseline" in t for t in legends["MLM loss"] + legends["NSP loss"])
  assert os.path.getsize(os.path.join(wd, "loss.png")) > 1000


def test_cpu_peak_is_measured_once_and_cached(tmp_path, monkeypatch):
  path = str(tmp_path / "peak.json")
  calls = []

  def measure(rate):
    return lambda: calls.append(rate) or rate

  monkeypatch.delenv(devices_lib.CPU_PEAK_ENV, raising=False)
  monkeypatch.setattr(os, "getloadavg", lambda: (50.0, 50.0, 50.0))  # busy
  assert devices_lib.cpu_peak_flops(path=path, measure=measure(1e9)) == 1e9
  # Measured under load: measured again next time, the best kept.
  assert devices_lib.cpu_peak_flops(path=path, measure=measure(0.5e9)) == 1e9
  monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # idle
  assert devices_lib.cpu_peak_flops(path=path, measure=measure(4e9)) == 4e9
  assert calls == [1e9, 0.5e9, 4e9]
  # Measured on an idle machine: final, never measured again.
  assert devices_lib.cpu_peak_flops(path=path, measure=measure(9e9)) == 4e9
  assert calls == [1e9, 0.5e9, 4e9]
  monkeypatch.setenv(devices_lib.CPU_PEAK_ENV, "123e9")
  assert devices_lib.cpu_peak_flops(path=path, measure=measure(9e9)) == 123e9
  monkeypatch.delenv(devices_lib.CPU_PEAK_ENV)
  # A day later the idle entry is stale: measured again, and the new rate replaces it
  # even when it is lower (the machine is slower now; the best of days is no peak).
  import time
  later = time.time() + devices_lib.CPU_PEAK_MAX_AGE_S + 60
  monkeypatch.setattr(time, "time", lambda: later)
  assert devices_lib.cpu_peak_flops(path=path, measure=measure(2e9)) == 2e9
  assert devices_lib.cpu_peak_flops(path=path, measure=measure(9e9)) == 2e9  # final again
  assert calls == [1e9, 0.5e9, 4e9, 2e9]


def test_eta_uses_a_moving_window():
  p = metrics_lib.Progress(1000, 0, 4096, 1e9, 1e10, window=3)
  p.last_time = 0.0
  out = p.update(50, now=100.0)  # the first interval (compile): 2 s/step
  assert out["eta_s"] == pytest.approx(950 * 2.0)
  t = 100.0
  for step in range(100, 301, 50):  # then 0.5 s/step
    t += 25.0
    out = p.update(step, now=t)
  assert out["eta_s"] == pytest.approx(700 * 0.5)  # the compile interval is out
  t += 250.0  # one slow interval (another job): the ETA moves, but not to 5 s/step
  out = p.update(350, now=t)
  assert out["steps_per_s"] == pytest.approx(0.2)
  assert out["eta_s"] == pytest.approx(650 * (300.0 / 150))
  assert np.isfinite(out["mfu"])


def test_fill_mask_pipeline_matches_our_model(finished_run):
  """transformers' fill-mask pipeline on the export ranks the same top 5 as our model,
  and the exported tokenizer keeps the space around [MASK]."""
  import transformers as T

  import encoders
  from launch.data import tokenization
  wd, _ = finished_run
  hf_dir = os.path.join(wd, "hf")
  text = "The [MASK] statement of the package, then more."
  fill = T.pipeline("fill-mask", model=hf_dir, top_k=5)
  theirs = [r["token"] for r in fill(text)]
  hf_tok = fill.tokenizer
  ids = hf_tok(text)["input_ids"]
  assert hf_tok.decode(ids[1:-1], skip_special_tokens=False) == text
  ours_tok = tokenization.load_sentencepiece(os.path.join(wd, "tokenizer", "spm.model"))
  left, right = text.split(" [MASK]")
  assert ids == ([ours_tok.cls_id] + ours_tok.encode(left) + [ours_tok.mask_id]
                 + ours_tok.encode(right) + [ours_tok.sep_id])  # the word's space is in the mask
  model, params = encoders.from_hf(hf_dir)
  logits = np.asarray(model.apply({"params": params}, np.asarray([ids])).mlm_logits)
  pos = ids.index(ours_tok.mask_id)
  assert theirs == list(np.argsort(-logits[0, pos, :ours_tok.vocab_size])[:5])


def test_demo_shows_held_out_sentences(finished_run):
  from launch import data as data_lib
  from objectives import demo
  wd, out = finished_run
  c = small_config(train__steps=3)
  c.model.vocab_size = out["setup"].objective.vocab_size
  pipeline = data_lib.make_pipeline(c, wd)
  found = demo.examples(pipeline.tokenizer, pipeline.eval_batches(1), 3)
  assert found
  eval_tokens = np.asarray(pipeline._eval_rows.tokens)
  for tokens, pos in found:
    # Held-out text: a contiguous run of the eval split's tokens.
    window = np.lib.stride_tricks.sliding_window_view(eval_tokens, len(tokens))
    assert (window == np.asarray(tokens)).all(axis=1).any()
    assert 0 < pos < len(tokens)
  lines = demo.lines(out["setup"].objective, jax.device_get(out["state"].params),
                     pipeline.tokenizer, pipeline.eval_batches(1))
  assert lines[0].startswith(f"fill-mask on {len(found)} held-out sentences")
  assert len(lines) == 1 + 2 * len(found)
  for sentence, preds in zip(lines[1::2], lines[2::2]):
    assert sentence.count("[MASK]") == 1 and " [MASK]" in sentence
    shown = preds.split("(the held-out word:")[0].split("%")
    assert len([p for p in shown if p.strip()]) == 5
    assert all(p.strip().split(" ")[0] for p in shown if p.strip())  # no empty prediction
