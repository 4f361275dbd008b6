"""One fine-tuning train step, ours (launch.finetune's jitted step) against transformers
(forward, backward, clipping, AdamW) on the same batch, in one process: all-MiniLM-L6-v2
with a sequence-classification head, every row full width, dropout as the checkpoint
sets it. Run it alone on an idle machine; it prints each side's median step time and the
ratio (theirs / ours: above 1 means ours is faster).

  PYTHONPATH=. python docs/finetune_step.py [--batch 32] [--seq 64] [--iters 8]
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--seq", type=int, default=64)
  p.add_argument("--iters", type=int, default=8)
  p.add_argument("--model", default="", help="HF dir (default: all-MiniLM-L6-v2)")
  a = p.parse_args()
  from launch.trainer import hostmem
  hostmem.tune_malloc()  # as launch.finetune (before JAX starts)
  import numpy as np
  from tests.encoders.minilm_helpers import minilm_dir
  path = a.model or minilm_dir()
  rng = np.random.RandomState(0)
  ids = rng.randint(1000, 30000, (a.batch, a.seq)).astype(np.int32)
  ids[:, 0] = 101
  batch = {"input_ids": ids, "attention_mask": np.ones_like(ids),
           "token_type_ids": np.zeros_like(ids),
           "example_weight": np.ones(a.batch, np.float32),
           "labels": rng.randint(0, 2, a.batch).astype(np.int32)}

  import jax
  import objectives
  from configs import finetune as finetune_configs
  from launch import trainer
  from launch.trainer import finetuning
  from launch.data import finetune_data as fd
  from launch.trainer import sharding as shard_lib
  c = finetune_configs.get_config("sequence").unlock()
  c.init_from, c.finetune.labels = path, ("0", "1")
  c.data.seq_len, c.data.global_batch, c.train.steps = a.seq, a.batch, 1000
  c.optimizer.learning_rate, c.optimizer.clip_norm = 1e-4, 1.0
  objectives.prepare_config(c)
  setup = trainer.build(c, finetuning.TokenizerInfo(fd.load_tokenizer(path), 0))
  state = setup.init_state()
  device_batch = shard_lib.global_batch(batch, setup.batch_sharding)

  def ours():
    nonlocal state
    state, sums = setup.train_step(state, device_batch)
    jax.block_until_ready(sums)

  import torch
  import transformers as T
  torch.manual_seed(0)
  model = T.AutoModelForSequenceClassification.from_pretrained(path, num_labels=2).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-6)
  tb = {k: torch.tensor(batch[k]).long()
        for k in ("input_ids", "attention_mask", "token_type_ids", "labels")}

  def theirs():
    model(**tb).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()

  times = {"ours": [], "theirs": []}
  for _ in range(2):  # compile / warm up, in pairs (they share the process's heap)
    theirs()
    ours()
  for _ in range(a.iters):  # alternate, so both sides see the same background
    for name, fn in (("ours", ours), ("theirs", theirs)):
      t = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - t)
  tokens = a.batch * a.seq
  for name, ts in times.items():
    m = float(np.median(ts))
    print(f"{name:6s}: median {m * 1e3:7.1f} ms (min {min(ts) * 1e3:.1f}, max "
          f"{max(ts) * 1e3:.1f})  {tokens / m:,.0f} tokens/s")
  ratio = np.median([t / o for o, t in zip(times["ours"], times["theirs"])])
  print(f"ratio (theirs / ours, median of paired steps): {ratio:.2f}x   load average "
        f"{open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
  main()
