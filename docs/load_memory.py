"""Peak host memory of loading a BERT-large-sized checkpoint onto a fake 8-device mesh.

    python docs/load_memory.py [--dir /tmp/bert_large_random] [--mesh 1,4,2]

Writes a random BERT-large-sized HF directory (BertModel: 24 layers, hidden 1024, 16
heads, MLP 4096, vocabulary 30522; ~1.3 GB of float32) once, then measures three loads,
each in a fresh process with XLA_FLAGS=--xla_force_host_platform_device_count=8 (the 8
"devices" are host memory, so the placed params themselves count in the process's RSS):

  baseline  the same sharded params made by a jitted zeros init: no file is read. This
            is what any load must hold at the end.
  stream    encoders.from_hf(dir, mesh=mesh): streamed, per-shard reads.
  old       the pre-streaming path: every tensor read into host memory
            (read_safetensors), converted by the rules, then put onto the same shardings.

Peak RSS is the process's high-water mark (VmHWM); "over baseline" is a load's peak minus
the baseline's peak.
"""
import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LARGE = dict(vocab_size=30522, hidden_size=1024, num_hidden_layers=24,
             num_attention_heads=16, intermediate_size=4096, max_position_embeddings=512,
             type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12, pad_token_id=0)


def make_checkpoint(path, layers=24):
  """A random BertModel directory of BERT-large size (`layers` layers), written tensor
  table by table."""
  import numpy as np
  from safetensors.numpy import save_file
  import encoders
  from flax import traverse_util
  from encoders.hf import expand, export_rule, mapping_for
  if os.path.isfile(os.path.join(path, "model.safetensors")):
    return
  os.makedirs(path, exist_ok=True)
  hf = dict(LARGE, num_hidden_layers=layers, model_type="bert", architectures=["BertModel"])
  mapping = mapping_for("bert")
  cfg = mapping.config_from_hf(hf, ("pooler",))
  import jax
  shapes = {k: v.shape for k, v in traverse_util.flatten_dict(jax.eval_shape(
      lambda: encoders.init_params(encoders.build(cfg), jax.random.PRNGKey(0))),
      sep="/").items()}
  rng = np.random.default_rng(0)
  tensors = {}
  for rule in expand(mapping.rules(cfg), cfg):
    flat = {p: rng.standard_normal(shapes[p], np.float32) * 0.02 for p in rule.our_paths}
    tensors.update(export_rule(rule, flat, cfg))
  save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf, f)


def _peak_mb():
  """This process's peak resident memory (VmHWM). Not ru_maxrss: Linux carries that over
  from the parent across fork + exec, so a child would report the parent's peak."""
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) / 1024
  raise RuntimeError("no VmHWM in /proc/self/status")


def measure(mode, path, mesh_shape):
  """Runs inside the child process."""
  import jax
  import numpy as np
  from jax.sharding import Mesh
  import encoders
  from flax import traverse_util
  from encoders.hf import stream
  mesh = Mesh(np.asarray(jax.devices()).reshape(mesh_shape), ("data", "fsdp", "tensor"))
  cfg, mapping, _, hf, _ = stream.config(path)
  model = encoders.build(cfg)
  boxed = stream._boxed(model)
  import flax.linen as nn
  shardings = stream._rule_shardings(boxed, mesh, None)
  expected = traverse_util.flatten_dict(nn.unbox(boxed), sep="/")
  before = _peak_mb()
  t0 = time.perf_counter()
  if mode == "baseline":
    flat = jax.jit(lambda: {k: jax.numpy.zeros(v.shape, v.dtype) for k, v in
                            expected.items()}, out_shardings=shardings)()
  elif mode == "stream":
    _, params = encoders.from_hf(path, mesh=mesh)
    flat = traverse_util.flatten_dict(params, sep="/")
  elif mode == "old":
    from encoders.hf import expand, import_rule, read_safetensors
    prefix = mapping.base_prefix(hf) + "."
    tensors = {k.removeprefix(prefix): v for k, v in read_safetensors(path).items()}
    shapes = {k: tuple(v.shape) for k, v in expected.items()}
    host = {}
    for rule in expand(mapping.rules(cfg), cfg):
      host.update(import_rule(rule, tensors, shapes, cfg))
    flat = {k: jax.device_put(v, shardings[k]) for k, v in host.items()}
    del tensors, host
  else:
    raise ValueError(mode)
  jax.block_until_ready(flat)
  seconds = time.perf_counter() - t0
  placed = sum(s.data.nbytes for x in flat.values() for s in x.addressable_shards)
  return {"mode": mode, "peak_rss_mb": round(_peak_mb(), 1),
          "peak_before_load_mb": round(before, 1), "seconds": round(seconds, 2),
          "placed_mb": round(placed / 2**20, 1), "params": len(flat)}


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--dir", default="/tmp/bert_large_random")
  ap.add_argument("--mesh", default="1,4,2")
  ap.add_argument("--layers", type=int, default=24, help="fewer for a quick check")
  ap.add_argument("--json", default="", help="also write the rows to this file")
  ap.add_argument("--child", default="")
  a = ap.parse_args()
  mesh_shape = tuple(int(x) for x in a.mesh.split(","))
  if a.child:
    print(json.dumps(measure(a.child, a.dir, mesh_shape)))
    return
  make_checkpoint(a.dir, a.layers)
  size = os.path.getsize(os.path.join(a.dir, "model.safetensors")) / 2**20
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu", PYTHONPATH=REPO)
  rows = []
  for mode in ("baseline", "stream", "old"):
    out = subprocess.run([sys.executable, __file__, "--dir", a.dir, "--mesh", a.mesh,
                          "--child", mode], env=env, capture_output=True, text=True)
    if out.returncode:
      sys.exit(out.stderr[-3000:])
    rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
  base = rows[0]["peak_rss_mb"]
  print(f"checkpoint {size:.0f} MB, mesh {mesh_shape} of 8 fake CPU devices")
  for r in rows:
    r["over_baseline_mb"] = round(r["peak_rss_mb"] - base, 1)
    r["checkpoint_mb"] = round(size, 1)
    print(json.dumps(r))
  if a.json:
    with open(a.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
