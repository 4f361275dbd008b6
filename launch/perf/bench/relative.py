"""DeBERTa's relative-attention formulations side by side, in one process and on the same
shapes: one DeBERTa layer (disentangled attention + MLP), forward and backward, in
training mode (dropout on, as the train step runs it).

  python -m launch.perf.bench.relative --where cpu  [--batch 2 --seq 512]
  python -m launch.perf.bench.relative --where tpu --topology v5p:2x2x1 [--batch 32 --seq 512]

cpu: XLA's temporaries of the compiled program (peak memory beyond inputs/outputs, load-
independent) and the CPU time (user + sys of this process, which is more robust to other
jobs than wall time) of `--repeats` calls. tpu: the layer compiled ahead of time for one
device of the topology (libtpu, no TPU needed): temporaries, XLA's FLOPs, its cost-model
time and the MFU it implies with the layer's model FLOPs (encoders.deberta: BERT's layer
plus the relative terms over the distinct rows a sequence uses, x3 for forward+backward).
Sizes: DeBERTa-v3-base's layer (H768, 12 heads, 3072 MLP, 256 log buckets), bfloat16 on
TPU, float32 on the CPU.
"""
import argparse
import json
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import SingleDeviceSharding

import encoders
from encoders import bert, deberta
from launch import cli
from launch.perf import aot
from launch.trainer import devices as devices_lib

FORMULATIONS = {  # name -> (relative_impl, relative_block)
    "gather": ("gather", 0),
    "shift": ("shift", 0),
    "shift-128": ("shift", 128),
    "shift-64": ("shift", 64),
    "shift-32": ("shift", 32),
    "shift-16": ("shift", 16),
    "headmajor": ("headmajor", 0),
    "headmajor-128": ("headmajor", 128),
    "content-only": ("none", 0),  # no relative terms: the layer's cost without them
}


def layer_config(impl, block, dtype):
  m = cli.load_config("deberta:base").model.unlock()
  m.num_hidden_layers = 1
  m.vocab_size = 1024  # the layer is measured, not the 128k embedding table
  m.heads = ()
  m.dtype = dtype
  m.attention_impl = "xla"
  if impl == "none":
    m.relative_attention, m.pos_att_type = False, ()
  else:
    m.relative_impl, m.relative_block = impl, block
  return m


def layer_step(cfg, batch, seq):
  """(jitted fwd+bwd of one layer, example args as ShapeDtypeStructs, model FLOPs)."""

  model = encoders.build(cfg)
  params = jax.eval_shape(lambda: encoders.init_params(model, jax.random.PRNGKey(0)))

  def loss(p, ids, key):
    out = model.apply({"params": p}, ids, deterministic=False, rngs={"dropout": key})
    return jnp.sum(out.last_hidden_state.astype(jnp.float32) ** 2)

  step = jax.jit(jax.grad(loss))
  ids = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
  key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
  flops = 3 * batch * (bert.layer_flops(seq, cfg.hidden_size, cfg.intermediate_size)
                       + deberta.relative_flops(cfg, seq))
  return step, (params, ids, key), float(flops), model


def measure_cpu(batch, seq, repeats, names):
  rows = []
  for name in names:
    impl, block = FORMULATIONS[name]
    cfg = layer_config(impl, block, "float32")
    step, args, flops, model = layer_step(cfg, batch, seq)
    compiled = step.lower(*args).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    params = encoders.init_params(model, jax.random.PRNGKey(0))
    ids = np.random.RandomState(0).randint(5, 1000, (batch, seq)).astype(np.int32)
    key = jax.random.PRNGKey(1)
    jax.block_until_ready(compiled(params, ids, key))
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(repeats):
      jax.block_until_ready(compiled(params, ids, key))
    r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    cpu = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / repeats
    rows.append({"formulation": name, "temp_bytes": int(temp), "cpu_s": cpu,
                 "wall_s": (w1 - w0) / repeats, "model_flops": flops})
    print(json.dumps(rows[-1]), flush=True)
  return rows


def measure_tpu(topology, batch, seq, names):

  aot.quiet_libtpu_env()
  if aot.find_libtpu() is None:
    raise SystemExit("libtpu not found (see launch/perf/aot.py)")
  dev = aot.get_topology(topology).devices[0]
  kind = getattr(dev, "device_kind", "")
  peak = devices_lib.chip_peak_flops(kind) / devices_lib.cores_per_chip([dev])
  rows = []
  for name in names:
    impl, block = FORMULATIONS[name]
    cfg = layer_config(impl, block, "bfloat16")
    step, args, flops, _ = layer_step(cfg, batch, seq)
    sh = SingleDeviceSharding(dev)
    args = jax.tree.map(lambda a, s=sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        args)
    t0 = time.perf_counter()
    compiled = step.lower(*args).compile()
    cost = aot.xla_cost(compiled)
    est = cost.get("optimal_seconds")
    rows.append({"formulation": name, "topology": topology, "device_kind": kind,
                 "temp_bytes": int(compiled.memory_analysis().temp_size_in_bytes),
                 "xla_flops": cost.get("flops"), "model_flops": flops,
                 "est_s": est, "mfu": flops / est / peak if est and est > 0 else None,
                 "compile_s": time.perf_counter() - t0})
    print(json.dumps(rows[-1]), flush=True)
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--where", choices=("cpu", "tpu"), default="cpu")
  p.add_argument("--topology", default="v5p:2x2x1")
  p.add_argument("--batch", type=int, default=0, help="0: 2 on cpu, 32 on tpu")
  p.add_argument("--seq", type=int, default=512)
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--only", default=",".join(FORMULATIONS))
  p.add_argument("--json", default="")
  a = p.parse_args()
  names = [n for n in a.only.split(",") if n]
  unknown = [n for n in names if n not in FORMULATIONS]
  if unknown:
    raise SystemExit(f"unknown formulations {unknown}; known: {list(FORMULATIONS)}")
  if a.where == "cpu":
    rows = measure_cpu(a.batch or 2, a.seq, a.repeats, names)
  else:
    rows = measure_tpu(a.topology, a.batch or 32, a.seq, names)
  if a.json:
    with open(a.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
