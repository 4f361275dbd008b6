"""launch.bench plumbing (not timings): synthetic batches shaped like the pipeline's, the
forward and train steps timed next to transformers', packed vs padded documents, the CLI."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from configs import bert as bert_configs
from configs import roberta as roberta_configs
from launch.perf import bench, synthetic

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = dict(num_hidden_layers=1, vocab_size=512)


@pytest.fixture(autouse=True)
def _small_peak_matmul(monkeypatch):
  """The in-run peak measurement at a test's size (its plumbing is what is tested)."""
  from launch.perf.bench import runs
  monkeypatch.setattr(runs, "PEAK_MATMUL_N", 256)
  monkeypatch.setattr(runs, "PEAK_REPEATS", 2)


def _config(module=bert_configs, arg="tiny", **model):
  c = module.get_config(arg).unlock()
  for k, v in {**SMALL, **model}.items():
    c.model[k] = v
  c.model.dtype = "float32"
  return c


def _objective(c):
  import objectives
  return objectives.get_objective(c, synthetic.SyntheticTokenizer.for_model(c.model))


def test_full_batch_follows_the_objectives_spec():
  c = _config()
  b = synthetic.full_batch(_objective(c), 4, 32)
  assert set(b) == {"input_ids", "segment_ids", "token_type_ids", "special_tokens_mask",
                    "next_sentence_label"}
  for k in ("input_ids", "segment_ids", "token_type_ids"):
    assert b[k].shape == (4, 32) and b[k].dtype == np.int32
  assert b["special_tokens_mask"].dtype == bool
  assert b["next_sentence_label"].shape == (4,)
  assert b["input_ids"].max() < c.model.vocab_size
  assert (b["token_type_ids"][:, -1] == 1).all()  # a sentence pair per row
  rb = synthetic.full_batch(_objective(_config(roberta_configs, "base")), 2, 16)
  assert "next_sentence_label" not in rb


def test_packing_and_padding_cover_the_same_documents():
  c = _config(roberta_configs, "base")
  lengths = synthetic.doc_lengths("lognormal:20:1.0", 24, 64, seed=3)
  assert lengths.min() >= synthetic.MIN_DOC_LEN and lengths.max() <= 64
  rows = synthetic.pack_first_fit(lengths, 64)
  assert sorted(i for r in rows for i in r) == list(range(24))
  assert all(sum(lengths[i] for i in r) <= 64 for r in rows)
  packed = synthetic.packed_layouts(lengths, 4, 64)
  padded = synthetic.padded_layouts(lengths, 4, 64, pad_multiple=16)
  total = int(lengths.sum())
  for layouts in (packed, padded):
    assert sum(sum(map(sum, layout)) for layout, _ in layouts) == total
    assert all(len(layout) == 4 for layout, _ in layouts)
  assert all(w % 16 == 0 for _, w in padded)
  batches = synthetic.batches(_objective(c), packed)
  real = sum(int((b["segment_ids"] > 0).sum()) for b in batches)
  assert real == total
  seg = batches[0]["segment_ids"][0]
  assert seg.max() >= 1 and (np.diff(seg[seg > 0]) >= 0).all()
  with pytest.raises(ValueError, match="uniform:LO:HI"):
    synthetic.doc_lengths("zipf:2", 4, 64)


def test_forward_against_transformers():
  r = bench.bench_step(_config(), "forward", batch=8, seq=32, iters=2, warmup=1,
                       compare_hf=True)
  assert r["ours"]["tokens_per_s"] > 0 and r["theirs"]["tokens_per_s"] > 0
  assert r["ratio_tokens_per_s"] > 0
  assert r["ratio_best_tokens_per_s"] == pytest.approx(
      r["ours"]["best_tokens_per_s"] / r["theirs"]["best_tokens_per_s"])
  assert r["max_abs_diff_last_hidden"] < 1e-4  # the same model, the same weights
  assert r["theirs"]["architecture"] == "BertForPreTraining"
  assert r["ours"]["flops_per_step"] == r["theirs"]["flops_per_step"]
  assert r["ours"]["memory"]["xla_buffers_bytes"] > 0
  assert 0 < r["ours"]["mfu"]
  # The peak is measured in this run, at both ends of the timed iterations, by both
  # libraries, and both sides' MFU is taken against the best of those rates.
  pm = r["peak_measured"]
  assert set(pm["before"]) == set(pm["after"]) == {"jax", "torch"}
  rates = list(pm["before"].values()) + list(pm["after"].values())
  assert min(rates) > 0 and r["peak_flops_per_device"] == max(rates)
  for side in ("ours", "theirs"):
    s = r[side]
    assert s["mfu"] == pytest.approx(s["flops_per_s"] / r["peak_flops_per_device"])
  text = bench.format_report(r)
  assert "ratio ours/theirs" in text and "MFU" in text
  assert "measured in this run" in text and "torch dense matmul" in text
  assert f"transformers ran at {100 * r['theirs']['mfu']:.1f}% of this peak" in text


def test_peak_of_a_run_and_its_drift():
  from launch.perf.bench import report, runs
  steady = runs.run_peak(0.0, {"jax": 100e9, "torch": 120e9}, {"jax": 104e9, "torch": 125e9})
  assert steady["peak_flops_per_device"] == 125e9
  assert steady["peak_drift"] == pytest.approx(5 / 125)
  moved = runs.run_peak(0.0, {"jax": 100e9, "torch": 200e9}, {"jax": 90e9, "torch": 150e9})
  assert moved["peak_flops_per_device"] == 200e9 and moved["peak_drift"] == 0.25
  r = {"theirs": {"mfu": 0.5}}
  assert not any("WARNING" in x for x in report._peak_lines({**r, **steady}))
  lines = report._peak_lines({**r, **moved})
  assert any("moved 25% during the run" in x for x in lines)
  assert "transformers ran at 50.0% of this peak (median step)" in lines[-1]
  tpu = runs.run_peak(459e12, None, None)
  assert tpu == {"peak_flops_per_device": 459e12, "peak_source": "published"}
  assert report._peak_lines(tpu) == ["peak per device: 459.0 TFLOP/s (published)"]


@pytest.mark.slow  # default-suite time; the feature keeps a faster test by default
def test_train_step_against_transformers_with_gathered_mlm_positions():
  c = _config(roberta_configs, "base", max_position_embeddings=66)
  c.objective.max_predictions = 6
  r = bench.bench_step(c, "train", batch=8, seq=32, iters=1, warmup=1, compare_hf=True)
  assert len(r["ours"]["step_times_s"]) == 1 and r["theirs"]["step_time_s"] > 0
  assert r["theirs"]["architecture"] == "RobertaForMaskedLM"
  # Ours decodes 6 positions per row, transformers every one of the 32.
  assert r["ours"]["flops_per_step"] < r["theirs"]["flops_per_step"]
  assert r["config"]["objective"]["max_predictions"] == 6


def test_packed_vs_padded(monkeypatch):
  from launch.perf.bench import runs
  calls, step = [], runs.Ours.step
  monkeypatch.setattr(runs.Ours, "step", lambda self, b: calls.append(id(b)) or step(self, b))
  r = bench.bench_packed(_config(), "lognormal:10:0.6", "forward", batch=8, seq=32, iters=8,
                         pad_multiple=16, passes=2)
  # every batch once to compile (packed, then padded); then the timed passes alternate
  # packed, padded, packed, padded, so that both layouts see the same machine
  n_packed, n_padded = r["packed"]["batches"], r["padded"]["batches"]
  warm, timed = calls[:n_packed + n_padded], calls[n_packed + n_padded:]
  assert timed == warm * 2
  assert len(r["pass_ratios"]) == 2 and r["ratio_paired_median"] > 0
  for ratio, a, b in zip(r["pass_ratios"], r["padded"]["pass_times_s"],
                         r["packed"]["pass_times_s"]):
    assert ratio == pytest.approx(a / b, rel=0.05)  # pass times are rounded to 0.1 ms
  assert r["packed"]["fill"] > r["padded"]["fill"]
  assert r["packed"]["batches"] <= r["padded"]["batches"]
  assert r["ratio_real_tokens_per_s"] > 0
  assert set(r["peak_measured"]["before"]) == {"jax"}  # no torch side here
  for name in ("packed", "padded"):
    assert r[name]["mfu"] == pytest.approx(r[name]["flops_per_s"]
                                           / r["peak_flops_per_device"])
  assert "packed/padded" in bench.format_report(r)
  assert "median of the 2 back-to-back pass pairs" in bench.format_report(r)


def test_cli(tmp_path):
  out = tmp_path / "r.json"
  cmd = [sys.executable, "-m", "launch.bench", "--config", "configs/bert.py:tiny",
         "--mode", "forward", "--batch", "2", "--seq", "16", "--iters", "1", "--warmup", "0",
         "--compare-hf", "--json", str(out), "--config.model.num_hidden_layers=1",
         "--config.model.vocab_size=512", "--config.model.dtype=float32"]
  env = dict(os.environ, XLA_FLAGS="")
  p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
  assert p.returncode == 0, p.stderr[-3000:]
  assert "tokens/s" in p.stdout and "ratio ours/theirs" in p.stdout
  r = json.loads(out.read_text())
  assert r["machine"]["cpu_cores"] and r["command"].startswith("python -m launch.bench")
  assert r["batch"] == 2 and r["seq"] == 16


def test_torch_lamb_matches_optax_lamb():
  """--compare-hf trains transformers with the config's optimizer; torch has no LAMB, so
  the bench's must make optax.lamb's updates (three steps, decayed and undecayed params)."""
  import jax.numpy as jnp
  import numpy as np
  import optax
  import torch
  from launch.perf.bench.theirs import torch_lamb
  rng = np.random.RandomState(0)
  w, b = rng.randn(4, 3).astype(np.float32), rng.randn(3).astype(np.float32)
  grads = [(rng.randn(4, 3).astype(np.float32), rng.randn(3).astype(np.float32))
           for _ in range(3)]
  tw, tb = torch.nn.Parameter(torch.tensor(w)), torch.nn.Parameter(torch.tensor(b))
  opt = torch_lamb([{"params": [tw], "weight_decay": 0.01},
                    {"params": [tb], "weight_decay": 0.0}], 1e-2, (0.9, 0.999), 1e-6)
  tx = optax.lamb(1e-2, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                  mask={"w": True, "b": False})
  params = {"w": jnp.asarray(w), "b": jnp.asarray(b)}
  state = tx.init(params)
  for gw, gb in grads:
    tw.grad, tb.grad = torch.tensor(gw), torch.tensor(gb)
    opt.step()
    updates, state = tx.update({"w": jnp.asarray(gw), "b": jnp.asarray(gb)}, state, params)
    params = optax.apply_updates(params, updates)
  np.testing.assert_allclose(tw.detach().numpy(), params["w"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(tb.detach().numpy(), params["b"], rtol=1e-5, atol=1e-6)
  assert np.abs(np.asarray(params["w"]) - w).max() > 1e-3  # it moved
