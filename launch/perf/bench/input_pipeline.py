"""Input-pipeline measurements for data.source=arrayrecord: rows/s against the train step's
consumption, and start-up time against corpus size.

  python -m launch.perf.bench.input_pipeline throughput --data DIR --config configs/bert.py:base \
      [--seconds 60 --worker_count 2 --global_batch 32]
  python -m launch.perf.bench.input_pipeline startup --data DIR [--data DIR2 ...]
  python -m launch.perf.bench.input_pipeline concat --data DIR --out BIG --copies 8

`throughput`: (1) the pipeline alone, batches pulled as fast as possible; (2) the same
while the train step (the config's model, real sharded step on this machine's devices)
runs back to back in the main thread; (3) the step's own consumption (rows/s) during (2).
Rows/s and the process's CPU time (user+sys, worker processes included) for each.
`startup`: seconds from nothing to the first batch (make_pipeline, then train_iter and one
batch) for each directory, with its size on disk. `concat`: a multi-GB corpus made of
DIR's rows (`--repeat` times into one shard, that shard `--copies` times), for `startup`.
Numbers from a loaded shared machine are not benchmarks; report the conditions.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import threading
import time

import jax
from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

from launch import cli
from launch import data as data_lib
from launch.trainer import sharding as shard_lib
from launch.trainer.state import build


def _cpu() -> float:
  s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
  return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _config(a):
  c = cli.load_config(a.config).unlock()
  c.data.source, c.data.path = "arrayrecord", a.data[0]
  c.data.global_batch, c.data.worker_count = a.global_batch, a.worker_count
  with open(os.path.join(a.data[0], "manifest.json")) as f:
    c.data.seq_len = json.load(f)["seq_len"]
  c.mesh.shape = (-1, 1, 1)
  return c


def _pull(it, seconds, stop=None):
  n, t0, c0 = 0, time.perf_counter(), _cpu()
  while time.perf_counter() - t0 < seconds and not (stop and stop.is_set()):
    b = next(it)
    n += len(b["input_ids"])
  dt = time.perf_counter() - t0
  return {"rows": n, "seconds": round(dt, 2), "rows_per_s": round(n / dt, 1),
          "cpu_s": round(_cpu() - c0, 2)}


def throughput(a) -> dict:
  c = _config(a)
  p = data_lib.make_pipeline(c, None, process_index=0, process_count=1)
  if a.vocab_size:
    c.model.vocab_size = a.vocab_size
  else:
    c.model.vocab_size = p.tokenizer.vocab_size
  c.model.pad_token_id = p.tokenizer.pad_id
  out = {"config": a.config, "global_batch": a.global_batch, "seq_len": p.seq_len,
         "worker_count": a.worker_count, "vocab_size": c.model.vocab_size,
         "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}
  it = p.train_iter()
  next(it)  # workers started
  out["pipeline_alone"] = _pull(it, a.seconds)
  setup = build(c, p.tokenizer, jax.devices())
  spec = setup.objective.batch_spec()
  state = setup.init_state()
  batch = shard_lib.global_batch(spec.select(next(it)), setup.batch_sharding)
  state, sums = setup.train_step(state, batch)  # compile
  jax.block_until_ready(sums)
  result, stop = {}, threading.Event()
  reader = threading.Thread(target=lambda: result.update(_pull(it, a.seconds, stop)))
  steps, t0, c0 = 0, time.perf_counter(), _cpu()
  reader.start()
  while reader.is_alive():
    state, sums = setup.train_step(state, batch)
    jax.block_until_ready(sums)
    steps += 1
  dt = time.perf_counter() - t0
  out["pipeline_with_step"] = result
  out["step"] = {"steps": steps, "seconds": round(dt, 2),
                 "step_s": round(dt / max(steps, 1), 3),
                 "rows_per_s": round(steps * a.global_batch / dt, 2),
                 "cpu_s_both": round(_cpu() - c0, 2)}
  out["loadavg_end"] = os.getloadavg()
  return out


def _size(d) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)
             if f.endswith(".arrayrecord"))


def startup(a) -> list:
  rows = []
  for d in a.data:
    a2 = argparse.Namespace(**{**vars(a), "data": [d]})
    c = _config(a2)
    t0 = time.perf_counter()
    p = data_lib.make_pipeline(c, None, process_index=0, process_count=1)
    t1 = time.perf_counter()
    it = p.train_iter()
    next(it)
    t2 = time.perf_counter()
    rows.append({"data": d, "gbytes": round(_size(d) / 1e9, 3),
                 "train_rows": p.stats["train_rows"], "shards": p.stats["shards"],
                 "make_pipeline_s": round(t1 - t0, 3), "first_batch_s": round(t2 - t1, 3),
                 "total_s": round(t2 - t0, 3), "loadavg": os.getloadavg()})
  return rows


def concat(a) -> dict:
  """A bigger corpus from DIR: its train records written `--repeat` times into one shard,
  that shard copied `--copies` times (a concatenated corpus: same rows, many GB)."""
  src, out = a.data[0], a.out
  with open(os.path.join(src, "manifest.json")) as f:
    m = json.load(f)
  os.makedirs(out, exist_ok=True)
  if not os.path.exists(os.path.join(out, "tokenizer")):
    shutil.copytree(os.path.join(src, "tokenizer"), os.path.join(out, "tokenizer"))
  records = []
  for e in m["shards"]["train"]:
    r = ArrayRecordReader(os.path.join(src, e["file"]))
    records += r.read_all()
    r.close()
  big = os.path.join(out, "train-big-000.arrayrecord")
  w = ArrayRecordWriter(big, "group_size:64")
  for _ in range(a.repeat):
    for rec in records:
      w.write(rec)
  w.close()
  shards = [{"file": "train-big-000.arrayrecord", "rows": len(records) * a.repeat}]
  for k in range(1, a.copies):
    name = f"train-big-{k:03d}.arrayrecord"
    shutil.copyfile(big, os.path.join(out, name))
    shards.append({"file": name, "rows": len(records) * a.repeat})
  for e in m["shards"]["eval"]:
    shutil.copyfile(os.path.join(src, e["file"]), os.path.join(out, e["file"]))
  factor = a.repeat * a.copies
  m["shards"]["train"] = shards
  for k in ("documents", "tokens", "rows"):
    m["totals"]["train"][k] *= factor
  m["fingerprint"] = f"{m['fingerprint']}-x{factor}"
  with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(m, f)
  return {"out": out, "gbytes": round(_size(out) / 1e9, 3), "shards": len(shards),
          "train_rows": len(records) * factor}


def main(argv=None):
  p = argparse.ArgumentParser(prog="python -m launch.perf.bench.input_pipeline")
  p.add_argument("mode", choices=("throughput", "startup", "concat"))
  p.add_argument("--data", action="append", required=True)
  p.add_argument("--config", default="configs/bert.py:base")
  p.add_argument("--seconds", type=float, default=60)
  p.add_argument("--worker_count", type=int, default=2)
  p.add_argument("--global_batch", type=int, default=32)
  p.add_argument("--vocab_size", type=int, default=0, help="model vocab (default: tokenizer's)")
  p.add_argument("--out", default="")
  p.add_argument("--copies", type=int, default=4, help="concat: shards of the big corpus")
  p.add_argument("--repeat", type=int, default=100, help="concat: source rows per shard, x")
  a = p.parse_args(argv)
  result = {"throughput": throughput, "startup": startup, "concat": concat}[a.mode](a)
  print(json.dumps(result, indent=1))
  return result


if __name__ == "__main__":
  main()
