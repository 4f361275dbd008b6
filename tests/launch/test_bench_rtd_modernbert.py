"""launch.bench --compare-hf plumbing (not timings) for the two-network RTD step (ELECTRA
generator + discriminator, sampling included, against ElectraForMaskedLM +
ElectraForPreTraining doing the same work) and for ModernBERT's MLM step with
StableAdamW, on tiny configs."""
import pytest

from configs import electra as electra_configs
from configs import modernbert as modernbert_configs
from launch.perf import bench


def _small(c, **model):
  c = c.unlock()
  for k, v in dict(num_hidden_layers=1, vocab_size=512, dtype="float32", **model).items():
    c.model[k] = v
  return c


@pytest.mark.slow  # two networks on each side; the torch reference itself is checked fast
def test_rtd_train_step_against_transformers():  # in tests/objectives/test_rtd.py
  c = _small(electra_configs.get_config("tiny"), hidden_size=64, embedding_size=64,
             num_attention_heads=2, intermediate_size=128)
  r = bench.bench_step(c, "train", batch=8, seq=32, iters=1, warmup=1, compare_hf=True)
  assert r["theirs"]["architecture"] == "ElectraForPreTraining"
  assert r["ours"]["step_time_s"] > 0 and r["theirs"]["step_time_s"] > 0
  obj = r["config"]["objective"]
  assert obj["name"] == "rtd" and obj["generator"]["hidden_size"] == 16
  # transformers' generator decodes every position; ours its gathered masked ones.
  assert r["ours"]["flops_per_step"] <= r["theirs"]["flops_per_step"]
  text = bench.format_report(r)
  assert "ratio ours/theirs" in text and r["ratio_tokens_per_s"] > 0


def test_modernbert_train_step_with_stable_adamw_against_transformers():
  c = _small(modernbert_configs.get_config("base"), hidden_size=64, num_attention_heads=2,
             intermediate_size=96, global_attn_every_n_layers=1, pad_token_id=0)
  assert c.optimizer.name == "stable_adamw"
  r = bench.bench_step(c, "train", batch=8, seq=32, iters=1, warmup=1, compare_hf=True)
  assert r["theirs"]["architecture"] == "ModernBertForMaskedLM"
  assert r["ratio_tokens_per_s"] > 0 and "ratio ours/theirs" in bench.format_report(r)
