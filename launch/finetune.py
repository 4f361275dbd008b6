"""Fine-tuning entry point: a task head on a pretrained HF directory, with the one
trainer's setup (mesh, sharded init, exact-accumulation train step, optimizer, Orbax
checkpoints, metrics writer).

  python -m launch.finetune --config configs/finetune.py:sequence \
      --config.init_from=DIR --workdir /tmp/ft --config.finetune.train_file=train.csv

Per epoch: train on the shuffled rows (seed train.seed + epoch), evaluate on the held-out
rows (classification: accuracy, macro-F1; tagging: entity F1; QA: EM, F1; regression:
Pearson, Spearman), write the metrics (metrics.jsonl, the console), checkpoint the state
(resumable at epoch boundaries), and keep the best epoch's weights as an HF directory
(`best/`, by `selection_metric`). At the end: `hf/` (the best weights, loadable by
transformers' task class, with id2label and the checkpoint's tokenizer),
`predictions.jsonl` (the best epoch's eval predictions), `results.json`, and for
classification `confusion_matrix.png`.
"""
import json
import logging
import math
import os
import shutil
import time

import flax.linen as nn
import jax
import ml_collections
import numpy as np

import objectives
from launch.data import finetune_data as fd
from objectives import finetune as ft_objective  # noqa: F401  (registers "finetune")
from objectives import losses
from objectives import task_metrics as tm

log = logging.getLogger("encoder_zoo")
SELECTION = {"sequence": "accuracy", "regression": "pearson", "token": "entity_f1",
             "qa": "f1"}
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "tokenizer_config.json",
                   "special_tokens_map.json", "merges.txt", "vocab.json", "spiece.model")


class _TokenizerInfo:
  """What trainer.build hands the objective: the vocabulary size and pad id."""

  def __init__(self, tok, pad_id):
    self.tok, self.pad_id, self.vocab_size = tok, pad_id, tok.get_vocab_size()


def load_data(config, tok):
  """-> (train arrays, eval arrays, eval info for scoring, labels)."""
  f, m = config.finetune, config.model
  seq_len, pad = int(config.data.seq_len), int(m.pad_token_id)
  if f.task == "sequence":
    if f.data_format == "tfds":
      read = lambda split: fd.read_tfds(f.tfds_name, split, f.tfds_data_dir, f.text_column,
                                        f.text_pair_column, f.label_column)
      train, evals = read(f.tfds_train_split), (read(f.tfds_eval_split)
                                                if f.tfds_eval_split else None)
    else:
      read = lambda p: fd.read_table(p, f.text_column, f.text_pair_column, f.label_column)
      train, evals = read(f.train_file), (read(f.eval_file) if f.eval_file else None)
    labels = ()
  elif f.task == "token":
    train = fd.read_conll(f.train_file)
    evals = fd.read_conll(f.eval_file) if f.eval_file else None
    labels = ()
  elif f.task == "qa":
    train = fd.read_squad(f.train_file)
    evals = fd.read_squad(f.eval_file) if f.eval_file else None
    labels = ()
  else:
    raise ValueError(f"unknown finetune.task {f.task!r}")
  if evals is None:
    tr, ev = fd.holdout(len(train), float(f.eval_fraction), int(f.split_seed))
    train, evals = [train[i] for i in tr], [train[i] for i in ev]
  if int(f.max_train_rows) > 0:
    train = train[:int(f.max_train_rows)]
  # The label vocabulary: given, else every label of the train and eval rows, sorted.
  if f.task == "sequence" and not f.regression:
    labels = fd.label_names([r["label"] for r in train + evals], f.labels)
  elif f.task == "token":
    labels = fd.label_names([t for _, tags in train + evals for t in tags], f.labels)
  if f.task == "sequence":
    enc = lambda rows: fd.encode_sequence(tok, rows, seq_len, pad, labels, f.regression)
    return enc(train), enc(evals), {"rows": evals}, labels
  if f.task == "token":
    tr_arr, _ = fd.encode_tokens(tok, train, seq_len, pad, labels)
    ev_arr, firsts = fd.encode_tokens(tok, evals, seq_len, pad, labels)
    return tr_arr, ev_arr, {"rows": evals, "firsts": firsts}, labels
  tr_arr, _ = fd.encode_qa(tok, train, seq_len, pad, int(f.stride))
  ev_arr, meta = fd.encode_qa(tok, evals, seq_len, pad, int(f.stride))
  return tr_arr, ev_arr, {"rows": evals, "meta": meta}, labels


def score(config, outputs, info, labels):
  """(metrics, prediction records) from the eval rows' model outputs (numpy)."""
  f = config.finetune
  rows = info["rows"]
  if f.task == "sequence" and f.regression:
    pred = outputs["logits"][:, 0]
    gold = np.asarray([float(r["label"]) for r in rows])
    return tm.regression(gold, pred), [{"label": float(g), "prediction": float(p)}
                                       for g, p in zip(gold, pred)]
  if f.task == "sequence":
    index = {n: i for i, n in enumerate(labels)}
    gold = np.asarray([index[str(r["label"])] for r in rows])
    pred = outputs["logits"].argmax(-1)
    metrics = tm.classification(gold, pred, len(labels))
    metrics["confusion"] = tm.confusion_matrix(gold, pred, len(labels)).tolist()
    return metrics, [{"text": r["text"][:200], "label": str(r["label"]),
                      "prediction": labels[p]} for r, p in zip(rows, pred)]
  if f.task == "token":
    pred_ids = outputs["logits"].argmax(-1)
    golds, preds = [], []
    for i, ((words, tags), first) in enumerate(zip(rows, info["firsts"])):
      golds.append(list(tags))
      preds.append([labels[pred_ids[i, p]] if p >= 0 else "O" for p in first])
    return tm.entity_f1(golds, preds), [{"words": w, "tags": g, "prediction": p}
                                        for (w, _), g, p in zip(rows, golds, preds)]
  best = {}
  for w, meta in enumerate(info["meta"]):
    ex = rows[meta["example"]]
    spans, null = fd.best_spans(outputs["start_logits"][w], outputs["end_logits"][w], meta,
                                ex["context"], int(f.n_best), int(f.max_answer_length))
    cur = best.setdefault(meta["example"], {"span": None, "null": math.inf})
    cur["null"] = min(cur["null"], null)
    if spans and (cur["span"] is None or spans[0]["score"] > cur["span"]["score"]):
      cur["span"] = spans[0]
  preds = []
  for i, ex in enumerate(rows):
    b = best.get(i, {"span": None, "null": math.inf})
    text = b["span"]["text"] if b["span"] else ""
    if f.version_2 and (b["span"] is None or b["null"] - b["span"]["score"] > f.null_threshold):
      text = ""
    preds.append(text)
  metrics = tm.squad([[a["text"] for a in ex["answers"]] for ex in rows], preds)
  return metrics, [{"id": ex["id"], "prediction": p, "answers": [a["text"] for a in
                                                                 ex["answers"]]}
                   for ex, p in zip(rows, preds)]


def predict(setup, params, arrays, batch_size, buckets=None):
  """Model outputs on every row of `arrays` (numpy, padding rows dropped). Batches cut
  to a length bucket have their per-token outputs padded back to the arrays' width:
  token logits with 0, QA start/end logits with -1e9 (no span starts or ends there)."""
  from launch.trainer import sharding as shard_lib
  objective = setup.objective
  rules = shard_lib.rules_tuple(setup.config.mesh.rules)
  fields = ("logits",) if objective.task != "qa" else ("start_logits", "end_logits")

  @jax.jit
  def fwd(p, b):
    with nn.logical_axis_rules(rules):
      out = objective.forward(p, b)
    return {k: getattr(out, k) for k in fields}

  got = {k: [] for k in fields}
  keys = ("input_ids", "attention_mask", "token_type_ids")
  width = arrays["input_ids"].shape[1]
  for b in fd.batches({k: arrays[k] for k in keys + ("example_weight",)}, batch_size,
                      buckets=buckets):
    n = int(b["example_weight"].sum())
    with jax.set_mesh(setup.mesh):
      out = fwd(params, shard_lib.global_batch({k: b[k] for k in keys}, setup.batch_sharding))
    for k in fields:
      v = np.asarray(jax.device_get(out[k]))[:n]
      cut = b["input_ids"].shape[1]
      if cut < width and objective.task in ("token", "qa"):  # per-token: back to width
        pad = [(0, 0), (0, width - cut)] + [(0, 0)] * (v.ndim - 2)
        v = np.pad(v, pad, constant_values=-1e9 if k != "logits" else 0.0)
      got[k].append(v)
  return {k: np.concatenate(v) for k, v in got.items()}


def _copy_tokenizer(src_dir, dst_dir):
  for name in TOKENIZER_FILES:
    if src_dir and os.path.isfile(os.path.join(src_dir, name)):
      shutil.copy(os.path.join(src_dir, name), os.path.join(dst_dir, name))


def run(config, workdir: str, devices=None):
  """Fine-tunes as configured; returns {"best", "history", "workdir", ...}.

  Callers that are their own process should call launch.hostmem.tune_malloc() before
  JAX starts, as main() does: without it every step re-faults XLA's temporary buffer
  (measured in docs/finetune.md, "Fine-tuning")."""
  from launch import trainer
  from launch.trainer import checkpoint as ckpt_lib
  from launch.trainer import metrics as metrics_lib
  from launch.trainer import sharding as shard_lib
  from launch.trainer import compile_cache
  workdir = os.path.abspath(workdir)
  # Before anything is written: a bad value raises; the cache directory makes the workdir.
  compile_cache.enable(config.train.get("compilation_cache_dir", ""), workdir)
  os.makedirs(workdir, exist_ok=True)
  config = ml_collections.ConfigDict(config.to_dict())
  f = config.finetune
  if not config.get("init_from", ""):
    raise ValueError("fine-tuning needs --config.init_from=DIR (an HF directory)")
  if f.get("packing", False) and f.task not in ("sequence", "token"):
    raise ValueError(f"finetune.packing=True supports the sequence and token tasks, not "
                     f"{f.task!r}")
  objectives.prepare_config(config)  # model section + tokenizer path from init_from
  tok = fd.load_tokenizer(config.init_from, config.tokenizer.get("lowercase", False))
  t0 = time.perf_counter()
  train, evals, info, labels = load_data(config, tok)
  f.labels = tuple(labels)
  n_train = len(train["example_weight"])
  gb = int(config.data.global_batch)
  steps_per_epoch = -(-n_train // gb)
  config.train.steps = steps_per_epoch * int(f.epochs)
  setup = trainer.build(config, _TokenizerInfo(tok, int(config.model.pad_token_id)), devices)
  writer = metrics_lib.MetricWriter(workdir, config.logging.tensorboard,
                                    is_main=jax.process_index() == 0)
  writer.write_json("run", {"task": f.task, "labels": list(labels), "train_rows": n_train,
                            "eval_rows": len(evals["example_weight"]),
                            "steps": config.train.steps, "data_s": time.perf_counter() - t0})
  manager = ckpt_lib.Manager(os.path.join(workdir, "checkpoints"), config.checkpoint)
  restored = manager.restore_latest(setup.abstract_state)
  state = setup.init_state() if restored is None else restored[0]
  done = int(state.step) // steps_per_epoch
  kind = "regression" if f.regression else f.task
  select = SELECTION[kind]
  best_path = os.path.join(workdir, "best.json")
  best = json.load(open(best_path)) if os.path.isfile(best_path) else None
  history, train_time, train_tokens, epoch_times = [], 0.0, 0, []
  buckets = fd.length_buckets(f.get("length_buckets", "auto"), int(config.data.seq_len))
  pack = None
  if f.get("packing", False):
    unit = shard_lib.batch_unit(setup.mesh, config.mesh.rules,
                                int(config.optimizer.get("grad_accum_steps", 1)))
    pack = {"task": f.task, "rows": fd.row_buckets(gb, unit),
            "pad_id": int(config.model.pad_token_id), "seen": set()}
  for epoch in range(done, int(f.epochs)):
    t_epoch, pending = time.perf_counter(), []
    for i, b in enumerate(fd.batches(train, gb, seed=int(config.train.seed) * 1000 + epoch,
                                     buckets=buckets, pack=pack)):
      state, sums = setup.train_step(state, shard_lib.global_batch(b, setup.batch_sharding))
      pending.append(sums)
      train_tokens += int(b["attention_mask"].sum())
      if (i + 1) % int(config.train.log_every) == 0 or i + 1 == steps_per_epoch:
        host = {}
        for s in jax.device_get(pending):
          host = losses.add_metrics(host, s)
        n_steps = len(pending)
        lr, gnorm = host.pop("learning_rate") / n_steps, host.pop("grad_norm") / n_steps
        writer.write(int(state.step), "train", dict(losses.finalize_metrics(
            {k: float(v) for k, v in host.items()}), learning_rate=float(lr),
            grad_norm=float(gnorm)))
        pending = []
    jax.block_until_ready(state.params)
    epoch_times.append(time.perf_counter() - t_epoch)
    train_time += epoch_times[-1]
    outputs = predict(setup, state.params, evals, gb, buckets)
    metrics, records = score(config, outputs, info, labels)
    flat = {k: v for k, v in metrics.items() if isinstance(v, float)}
    writer.write(int(state.step), "eval", dict(flat, epoch=epoch + 1))
    history.append(dict(flat, epoch=epoch + 1))
    log.info("epoch %d/%d eval: %s", epoch + 1, int(f.epochs),
             "  ".join(f"{k} {v:.4f}" for k, v in sorted(flat.items())))
    manager.save(int(state.step), state, {"epoch": epoch + 1})
    if best is None or flat[select] > best["metrics"][select]:
      best = {"epoch": epoch + 1, "metrics": metrics, "selection_metric": select}
      setup.objective.export(jax.device_get(state.params), os.path.join(workdir, "best"))
      _copy_tokenizer(config.init_from, os.path.join(workdir, "best"))
      with open(os.path.join(workdir, "predictions.jsonl"), "w") as fp:
        for r in records:
          fp.write(json.dumps(r) + "\n")
      with open(best_path, "w") as fp:
        json.dump(best, fp)
  manager.close()
  out_dir = os.path.join(workdir, "hf")
  if os.path.exists(out_dir):
    shutil.rmtree(out_dir)
  shutil.copytree(os.path.join(workdir, "best"), out_dir)
  if f.task == "sequence" and not f.regression and "confusion" in best["metrics"]:
    tm.plot_confusion(np.asarray(best["metrics"]["confusion"]), labels,
                      os.path.join(workdir, "confusion_matrix.png"),
                      f"epoch {best['epoch']}: accuracy {best['metrics']['accuracy']:.3f}")
  result = {"best": best, "history": history, "workdir": workdir, "train_s": train_time,
            "train_tokens": train_tokens, "epoch_train_s": epoch_times,
            "train_tokens_per_s": train_tokens / train_time if train_time else 0.0}
  with open(os.path.join(workdir, "results.json"), "w") as fp:
    json.dump(result, fp, indent=2)
  writer.close()
  return result


def main(argv):
  del argv
  from launch import hostmem
  hostmem.tune_malloc()  # before JAX's CPU client starts (launch/hostmem.py)
  from absl import flags
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.INFO)
  for noisy in ("absl", "jax", "orbax", "grain", "etils"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  result = run(flags.FLAGS.config, flags.FLAGS.workdir)
  b = result["best"]
  print(f"best epoch {b['epoch']}: " + "  ".join(
      f"{k} {v:.4f}" for k, v in sorted(b["metrics"].items()) if isinstance(v, float)))


if __name__ == "__main__":
  from absl import app, flags
  from ml_collections import config_flags
  config_flags.DEFINE_config_file("config", None, "config file[:arg]", lock_config=True)
  flags.DEFINE_string("workdir", None, "run directory")
  flags.mark_flags_as_required(["config", "workdir"])
  from launch import cli
  app.run(main, flags_parser=cli.parse_flags)
