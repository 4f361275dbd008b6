"""`launch.bench --mode loop` plumbing (not timings): the real trainer's loop timed by
phase next to the same-work torch loop, the host masking of the torch side, the report."""
import numpy as np
import pytest

from configs import bert as bert_configs
from launch.perf.bench import loop as loop_bench
from launch.perf.bench import report


def _config():
  c = bert_configs.get_config("tiny").unlock()
  c.model.num_hidden_layers = 1
  c.model.hidden_size = 32
  c.model.num_attention_heads = 2
  c.model.intermediate_size = 64
  c.model.dtype = "float32"
  c.tokenizer.vocab_size = 600
  c.tokenizer.model_type = "unigram"
  c.tokenizer.train_sentences = 20_000
  c.data.max_documents = 80
  c.data.seq_len = 32
  c.data.global_batch = 8
  c.train.log_every = 2
  return c


@pytest.mark.slow  # ~1 min of CPU: tokenizer training, two compiles, torch
def test_loop_mode_times_ours_and_the_same_work_torch_loop(tmp_path):
  r = loop_bench.bench_loop(_config(), 4, compare_hf=True, workdir=str(tmp_path))
  assert (tmp_path / "tokenizer").is_dir()  # the caches stay in the workdir for reruns
  assert not [p for p in tmp_path.iterdir() if p.name.startswith("loop_run_")]
  tokens = 8 * 32
  for side in ("ours", "theirs"):
    s = r[side]
    assert s["steps"] == 3  # the first step (compile) is not timed
    assert s["tokens_per_s"] == pytest.approx(tokens * 3 / s["wall_s"])
    assert s["usage"]["user_s"] > 0 and s["usage"]["minflt"] >= 0
    # the phases split the host thread's wall time of the timed window
    assert sum(s["phases_s"].values()) == pytest.approx(s["wall_s"], rel=1e-6)
  ph = r["ours"]["phases_s"]
  for name in ("input", "host_to_device", "step", "device_wait", "metrics", "checkpoint"):
    assert ph[name] > 0, name
  assert "eval" not in ph  # held-out evaluation is off in the timed loop
  assert r["ratio_tokens_per_s"] == pytest.approx(
      r["ours"]["tokens_per_s"] / r["theirs"]["tokens_per_s"])
  assert r["theirs"]["architecture"] == "BertForPreTraining"
  text = report.format_report(r)
  assert "ratio ours/theirs" in text and "minor faults / step" in text


def test_torch_side_masks_like_ours_within_the_budget():
  import objectives
  from launch.perf import synthetic
  c = loop_bench.loop_config(_config(), 4)
  c.model.vocab_size = 600
  objective = objectives.get_objective(c, synthetic.SyntheticTokenizer.for_model(c.model))

  from launch.perf.bench import theirs

  class Fake(theirs.TorchLoop):
    def __init__(self):  # only what collate needs
      self.objective, self.budget = objective, objective.max_predictions
      self.pair = objective.pair
      self.rng = np.random.default_rng(0)

  t = Fake()
  picked = cand = 0
  for i in range(20):
    b = synthetic.full_batch(objective, 8, 32, seed=i)
    x = {k: v.numpy() for k, v in t.collate(b).items()}
    assert x["positions"].shape == (8, objective.max_predictions)
    w = x["weights"] > 0
    rows = np.arange(8)[:, None]
    special = np.asarray(b["special_tokens_mask"], bool)
    assert not special[rows, x["positions"]][w].any()  # never a special token
    np.testing.assert_array_equal(x["labels"], b["input_ids"][rows, x["positions"]])
    unpicked = np.ones_like(special)
    unpicked[rows, x["positions"]] = ~w
    np.testing.assert_array_equal(x["input_ids"][unpicked], b["input_ids"][unpicked])
    picked += w.sum()
    cand += (~special).sum()
  assert abs(picked / cand - c.objective.mask_rate) < 0.03


def test_loop_needs_two_steps():
  with pytest.raises(ValueError, match="at least 2 steps"):
    loop_bench.loop_config(_config(), 1)


def test_phases_split_the_timed_window():
  import time
  from launch.trainer import phases as phases_lib
  ph = phases_lib.Phases()
  with ph("input"):  # before the first dispatch: outside the window (compile)
    time.sleep(0.02)
  ph.step_dispatched(1)
  for step in (2, 3):
    with ph("input"):
      time.sleep(0.01)
    ph.step_dispatched(step)
  ph.start("metrics")
  ph.stop("metrics")
  ph.finish()
  r = ph.report()
  assert r["steps"] == 2
  assert 0.02 <= r["phases_s"]["input"] < r["wall_s"]
  assert sum(r["phases_s"].values()) == pytest.approx(r["wall_s"])
  assert set(r["usage"]) == {"user_s", "sys_s", "minflt", "majflt"}
