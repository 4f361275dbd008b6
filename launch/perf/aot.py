"""Ahead-of-time compile of the real sharded train step for a Cloud TPU topology, on any
machine (this CPU included): does it fit in HBM, and how fast does XLA expect it to be?

  python -m launch.aot --config configs/bert.py:base --topology v5p:2x2x1 --global_batch 32 \\
      [--seq 512] [--mesh=-1,1,1] [--breakdown 15] [--config.model.attention_impl=splash ...]

What it does: `jax.experimental.topologies.get_topology_desc` (libtpu) describes the TPU
slice without one; `launch.trainer.build(config, tokenizer, devices=topology.devices)`
builds the exact train step the trainer runs (mesh, logical-axis shardings, donated
state, objective, optimizer); it is lowered with the abstract sharded state and an
abstract batch from the objective's batch spec (launch/perf/synthetic.py), under the mesh
context, and compiled by the TPU compiler. From the compiled program:
- per-device HBM: XLA's buffer assignment (arguments + outputs - donated aliases +
  temporaries + program code), against the chip's capacity (launch/trainer/devices.py);
- the estimated step time, in two parts of different kinds: XLA's cost-model estimate
  (`cost_analysis()["optimal_seconds"]`) of everything XLA can price, plus a roofline
  time for the custom calls it cannot see into (the Pallas Splash kernels: FLOPs over
  peak or bytes over HBM bandwidth, whichever is larger, over a stated efficiency
  factor; launch/perf/kernel_cost.py says where each number comes from), and the MFU the sum
  implies: the objective's model FLOPs of the step per device / estimated time / the
  chip's published bf16 peak (per device);
- with `--breakdown N`, the N op groups (the JAX source op, layers folded) that take the
  largest shares of XLA's part, by the compiler's per-op cycle estimates (launch/perf/op_costs.py).
Exit status: 0 when the step fits, 1 when it does not (or the compiler runs out of
memory), 2 for a usage or setup problem (bad topology name, libtpu missing).

libtpu: taken from an installed `libtpu` package (`pip install 'encoder-zoo[tpu]'`),
else from $TPU_LIBRARY_PATH, else from `.cache/libtpu` in the repository (where
`pip install --target .cache/libtpu 'libtpu==<jax's pin>'` puts it without touching the
environment; `libtpu_requirement()` names the pin).
"""
import importlib.metadata
import importlib.util
import os
import re
import sys
import time
from typing import Any, Dict, Optional, Sequence

import jax
import ml_collections
from jax.experimental import topologies

import objectives
from encoders import base
from encoders.layers import kernels
from launch import trainer
from launch.perf import kernel_cost, op_costs, runinfo, synthetic
from launch.trainer import devices as devices_lib

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOCAL_LIBTPU = os.path.join(_REPO, ".cache", "libtpu", "libtpu", "libtpu.so")
hbm_per_chip = devices_lib.hbm_per_chip
cores_per_chip = devices_lib.cores_per_chip

EXIT_FITS, EXIT_DOES_NOT_FIT, EXIT_USAGE = 0, 1, 2


class AotError(Exception):
  """A problem with the request or the environment (exit status 2)."""


def find_libtpu() -> Optional[str]:
  """Path of libtpu.so, or None. Sets TPU_LIBRARY_PATH when it comes from the cache."""
  env = os.environ.get("TPU_LIBRARY_PATH")
  if env and os.path.isfile(env):
    return env
  spec = importlib.util.find_spec("libtpu")
  if spec is not None and spec.submodule_search_locations:
    for d in spec.submodule_search_locations:
      path = os.path.join(d, "libtpu.so")
      if os.path.isfile(path):
        return path
  if os.path.isfile(LOCAL_LIBTPU):
    os.environ["TPU_LIBRARY_PATH"] = LOCAL_LIBTPU
    return LOCAL_LIBTPU
  return None


def libtpu_requirement() -> str:
  """The libtpu pin of the installed jax's `tpu` extra (e.g. libtpu==0.0.42.*): the TPU
  compiler built for this jax release. Plain "libtpu" if jax names none."""
  for req in importlib.metadata.requires("jax") or []:
    if req.startswith("libtpu") and "extra ==" in req and "tpu" in req:
      return re.sub(r"\s", "", req.split(";")[0])
  return "libtpu"


def quiet_libtpu_env():
  """Environment for a compile-only libtpu on a machine with no TPU: no metadata-server
  queries and no complaints about the (absent) TPU VM. Must run before jax starts."""
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-1")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  # Compile-only processes never claim a chip: let several (a test next to a user's run)
  # load libtpu at once instead of failing on its single-process lockfile.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def get_topology(name: str):
  try:
    return topologies.get_topology_desc(topology_name=name, platform="tpu")
  except Exception as e:  # the plugin's message names the problem
    raise AotError(f"cannot make TPU topology {name!r}: {e}") from e


def parse_mesh(text: str):
  try:
    shape = tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
  except ValueError:
    shape = ()
  if len(shape) != 3:
    raise AotError(f"--mesh={text!r}: give data,fsdp,tensor sizes, e.g. -1,1,1 or 2,1,2")
  return shape


def xla_cost(compiled) -> Dict[str, float]:
  """XLA's cost analysis of a compiled program as one dict (flops, optimal_seconds, ...)."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  return dict(cost or {})


# Custom calls that do no work of their own but that XLA's TPU cost model cannot price.
FREE_CUSTOM_CALLS = ("ConcatBitcast",)


def free_custom_calls(hlo: str) -> int:
  """How many `FREE_CUSTOM_CALLS` an HLO module's text holds."""
  return sum(c["target"] in FREE_CUSTOM_CALLS for c in kernel_cost.custom_calls(hlo))


def _optimal_seconds(cost: Dict[str, float], hlo: str) -> Optional[float]:
  """XLA's cost-model time of a program, with its known free custom calls at 0.

  The TPU cost model charges -1 s for each op it has no price for, so one such op makes a
  whole program's time negative (e.g. 1.606 ms - 1 s for a two-matmul forward + backward
  on v5e with one of them). On v5e and v6e the compiler prefetches weights into on-chip
  memory as asynchronous slices (priced) joined in place by a `ConcatBitcast` custom
  call, which moves no data: each of those gets its -1 s back here. Any other unpriced op
  leaves the time negative, and the callers treat it as no estimate."""
  est = cost.get("optimal_seconds")
  n = free_custom_calls(hlo) if est is not None and est < 0 else 0
  if n and est + n > 0:
    return est + n
  return est


def _is_oom(e: Exception) -> bool:
  text = str(e)
  return any(s in text for s in ("RESOURCE_EXHAUSTED", "Ran out of memory", "out of memory",
                                 "exceeds the memory"))


def compile_train_step(config, topology: str, global_batch: int, seq: int = 0,
                       mesh_shape: Optional[Sequence[int]] = None,
                       hbm_gib: Optional[float] = None,
                       kernel_efficiency: float = kernel_cost.DEFAULT_EFFICIENCY,
                       breakdown: int = 0) -> Dict[str, Any]:
  """Builds, lowers and compiles the train step for `topology`; returns the report.
  `breakdown` N > 0: also report where XLA's part of the time goes, op by op
  (launch/perf/op_costs.py), from the program XLA priced (the twin, when there is one); the
  text report shows the N largest groups."""
  topo = get_topology(topology)
  devices = list(topo.devices)
  config = ml_collections.ConfigDict(config.to_dict())
  try:  # init_from / a teacher directory: the model the run trains (no weights are read)
    objectives.prepare_config(config)
  except ValueError as e:
    raise AotError(str(e)) from e
  seq = seq or config.data.seq_len
  config.data.global_batch = global_batch
  config.data.seq_len = seq
  if mesh_shape is not None:
    config.mesh.shape = tuple(mesh_shape)
  # "auto" means what the target picks, not what this host would: the dtype here; the
  # kernels by the trainer from the TPU mesh and the length (and logged there as "auto ->"),
  # the report's line from a copy
  attention_choice = base.resolve_attention(
      ml_collections.ConfigDict(config.model.to_dict()), "tpu", seq)
  base.resolve_dtype(config.model, "tpu")
  kind = getattr(devices[0], "device_kind", "")
  per_chip = cores_per_chip(devices)
  capacity = hbm_gib * 2**30 if hbm_gib else hbm_per_chip(kind)
  if capacity is None:
    raise AotError(f"HBM of {kind!r} is not in the table; pass --hbm_gib")
  capacity = capacity / (1 if hbm_gib else per_chip)
  peak = devices_lib.chip_peak_flops(kind) / per_chip
  tok = synthetic.SyntheticTokenizer.for_model(config.model)
  t0 = time.perf_counter()
  try:
    setup = trainer.build(config, tok, devices=devices)
  except ValueError as e:
    raise AotError(str(e)) from e
  batch = synthetic.abstract_batch(setup.objective, global_batch, seq, setup.batch_sharding)
  report: Dict[str, Any] = {
      "topology": topology, "device_kind": kind, "devices": len(devices),
      "devices_per_chip": per_chip, "mesh": dict(setup.mesh.shape),
      "global_batch": global_batch, "seq": seq, "attention_choice": attention_choice,
      "compiler_options": trainer.compiler_options(config, "tpu", kind) or {},
      "config": runinfo.config_summary(config, setup.objective),
      "hbm_capacity_bytes": capacity, "peak_flops_per_device": peak}
  programs = report["compile_programs"] = []  # (program, seconds): each compile apart
  try:
    compiled = _compile(setup, batch, "the train step", programs)
  except Exception as e:  # noqa: BLE001 - the compiler's OOM is a result, not a crash
    if _is_oom(e):
      report.update(fits=False, compile_error=str(e).strip().splitlines()[0][:500])
      return report
    raise
  report["compile_s"] = time.perf_counter() - t0
  m = compiled.memory_analysis()
  used = devices_lib.memory_bytes(compiled, code=True)
  report["memory"] = {
      "arguments": int(m.argument_size_in_bytes), "outputs": int(m.output_size_in_bytes),
      "aliased": int(m.alias_size_in_bytes), "temporaries": int(m.temp_size_in_bytes),
      "code": int(m.generated_code_size_in_bytes), "total": int(used)}
  report["fits"] = bool(used <= capacity)
  cost = xla_cost(compiled)
  model_flops = global_batch * setup.objective.flops_per_example(seq)
  report["model_flops_per_step"] = model_flops
  report["model_flops_per_device"] = model_flops / len(devices)
  report["xla_flops_per_device"] = cost.get("flops")
  report["xla_optimal_seconds"] = cost.get("optimal_seconds")
  hlo = compiled.as_text() or ""
  est = _optimal_seconds(cost, hlo)
  report["splash_kernel_in_hlo"] = any(  # a custom call, not just a name in metadata
      "splash" in c["name"].lower() for c in kernel_cost.custom_calls(hlo))
  if report["fits"]:
    est, notes, priced_hlo, counts = _step_time_estimate(
        config, tok, devices, setup, batch, est, hlo, _counts(cost), programs)
    bandwidth = kernel_cost.hbm_bandwidth(kind)
    if bandwidth is None:
      raise AotError(f"HBM bandwidth of {kind!r} is not in launch/perf/kernel_cost.py's table")
    kernels = kernel_cost.price(priced_hlo, peak, bandwidth / per_chip, kernel_efficiency)
    if kernels["calls"] and est is not None and est > 0:
      report["xla_with_opaque_kernels_s"] = est
      est, priced_hlo, counts = _xla_part_without_kernels(config, tok, devices, batch,
                                                          _has_loop(hlo), programs)
      notes.append("XLA's part priced on a twin with each Pallas kernel replaced by an "
                   "elementwise stand-in (same inputs and output); the kernels by roofline")
    if notes:
      report["estimate_notes"] = notes
    if breakdown > 0:
      report["breakdown"] = op_costs.breakdown(priced_hlo)
      report["breakdown_top"] = breakdown
    if est is not None and est > 0:
      report["xla_priced_s"] = est
      report["free_custom_calls"] = free_custom_calls(priced_hlo)
      report["xla_priced_counts"] = dict(counts, hbm_bandwidth=bandwidth / per_chip)
      report["kernel_roofline"] = kernels
      est = est + kernels["seconds"]
      report["estimated_step_s"] = est
      report["estimated_tokens_per_s"] = global_batch * seq / est
      report["estimated_mfu"] = (model_flops / len(devices)) / est / peak if peak else None
  return report


def _step_time_estimate(config, tok, devices, setup, batch, est, hlo, counts, programs):
  """XLA's cost-model time of the step, and notes on how it was obtained.

  The TPU cost model prices a while loop's body once, not per trip, so a step with
  scan_layers or in-step gradient accumulation would be underestimated by the trip count.
  Such a step is priced on a twin program with the same math: layers unrolled, no
  accumulation loop (memory and fit stay those of the real program). The model also
  prices a whole program or nothing (optimal_seconds < 0) when it meets an op it has no
  cost for; should that happen, the twin also does the objective's batch transform
  (masking: elementwise and sorts over (B, T), tiny next to the model) beforehand. The
  masking is written with gathers and scans only, so today's step is priced directly."""
  loops = _has_loop(hlo)
  if est is not None and est > 0 and not loops:
    return est, [], hlo, counts
  notes = []
  price_setup = setup
  if loops:
    twin = ml_collections.ConfigDict(config.to_dict())
    twin.model.scan_layers = False
    twin.optimizer.grad_accum_steps = 1
    price_setup = trainer.build(twin, tok, devices=devices)
    notes.append("layers unrolled and no accumulation loop (XLA prices a loop body once)")
    est, loops, hlo, counts = _price(price_setup, batch, "the unrolled twin", programs)
  if est is None or est <= 0:
    est, loops, hlo, counts = _estimate_without_transform(price_setup, batch, programs)
    notes.append("without the objective's batch transform, which XLA's TPU cost model "
                 "could not price")
  if loops:
    notes.append("the priced program still has a loop: the estimate is a lower bound")
  return est, notes, hlo, counts


def _xla_part_without_kernels(config, tok, devices, batch, unroll: bool, programs):
  """XLA's cost-model time of the step, and the twin's HLO text, with every Pallas kernel
  replaced by a cheap elementwise stand-in (`kernels.kernel_stand_ins`). XLA cannot see
  inside a kernel, and the price it gives an opaque custom call is not the kernel's: on
  v5p, a Splash forward + backward over (8, 8 heads, T, 64) priced 124 us (T=512) and
  330 us (T=2048) above the same program with the stand-in, against compute rooflines of
  33 us and 524 us. So the step is priced as this twin (the stand-in's own small cost
  included) plus the kernels' roofline (launch/perf/kernel_cost.py)."""
  twin = ml_collections.ConfigDict(config.to_dict())
  if unroll:
    twin.model.scan_layers = False
    twin.optimizer.grad_accum_steps = 1
  with kernels.kernel_stand_ins():
    stand_in = trainer.build(twin, tok, devices=devices)
    est, _, hlo, counts = _price(stand_in, batch, "the kernel stand-in twin", programs)
    if est is None or est <= 0:
      est, _, hlo, counts = _estimate_without_transform(stand_in, batch, programs)
  return est, hlo, counts


def _has_loop(hlo: str) -> bool:
  return bool(re.search(r"\bwhile\(", hlo or ""))


def _compile(setup, batch, name, programs):
  """`setup.train_step` compiled for `batch`; its seconds (lowering included) appended to
  `programs` as (name, seconds), and the start said on stderr (a long compile shows which
  program it is in)."""
  print(f"compiling {name} ...", file=sys.stderr, flush=True)
  t0 = time.perf_counter()
  compiled = setup.train_step.lower(setup.abstract_state, batch).compile()
  programs.append((name, time.perf_counter() - t0))
  return compiled


def _counts(cost: Dict[str, float]) -> Dict[str, float]:
  """The FLOPs and HBM bytes XLA's cost analysis counted for a program (per device)."""
  return {"flops": cost.get("flops"), "bytes": cost.get("bytes accessed")}


def _price(setup, batch, name, programs):
  """XLA's cost-model time of `setup.train_step` on `batch`, whether the compiled
  program has a while loop, its HLO text, and XLA's FLOP and byte counts (`_counts`)."""
  compiled = _compile(setup, batch, name, programs)
  hlo = compiled.as_text() or ""
  cost = xla_cost(compiled)
  return _optimal_seconds(cost, hlo), _has_loop(hlo), hlo, _counts(cost)


def _estimate_without_transform(setup, batch, programs):
  """`_price` of the train step with `objective.transform` done beforehand: the step is
  traced with an identity transform on a batch shaped like the transform's output."""
  objective = setup.objective
  # the key data of the default PRNG (threefry: 2 words; rbg / unsafe_rbg: 4)
  key = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
  shapes = jax.eval_shape(
      lambda b, k: objective.transform(b, jax.random.wrap_key_data(k)), batch, key)
  pre = synthetic.row_sharded(shapes, setup.batch_sharding)
  objective.transform = lambda b, rng: b
  try:
    return _price(setup, pre, "the twin without the batch transform", programs)
  finally:
    del objective.transform


def format_report(r: Dict[str, Any]) -> str:
  c = r["config"]

  def gib(n):
    return f"{n / 2**30:.2f} GiB"

  lines = [f"AOT train step: {c['family']} {c['variant']} (L{c['layers']} H{c['hidden']}), "
           f"global batch {r['global_batch']} x seq {r['seq']}, {c['dtype']}, "
           f"attention={c['attention_impl']}, remat={c['remat_policy']}, "
           f"scan_layers={c['scan_layers']}, objective={runinfo.objective_text(c)}, "
           f"vocab_pad_multiple={c['vocab_pad_multiple']}",
           f"topology {r['topology']}: {r['devices']} x {r['device_kind']} "
           f"({r['devices_per_chip']} device(s) per chip), mesh {r['mesh']}"
           + (", params and optimizer state split over data (mesh.shard_state_over_data)"
              if c.get("state_over_data") and r["mesh"].get("data", 1) > 1 else "")]
  if r.get("attention_choice"):
    lines.append(r["attention_choice"])
  lines.append(trainer.compiler_options_line(r.get("compiler_options")))
  if "compile_error" in r:
    lines.append(f"DOES NOT FIT: the TPU compiler ran out of memory: {r['compile_error']}")
    return "\n".join(lines)
  m = r["memory"]
  programs = r.get("compile_programs") or []
  lines.append(f"compile: {r['compile_s']:.1f} s" + (
      f" (the step, set-up included); {len(programs)} programs compiled: " + ", ".join(
          f"{name} {s:.0f} s" for name, s in programs) if len(programs) > 1 else ""))
  lines.append(f"HBM per device: {gib(m['total'])} of {gib(r['hbm_capacity_bytes'])} "
               f"({100 * m['total'] / r['hbm_capacity_bytes']:.1f}%)  [arguments "
               f"{gib(m['arguments'])}, outputs {gib(m['outputs'])}, donated "
               f"-{gib(m['aliased'])}, temporaries {gib(m['temporaries'])}, code "
               f"{gib(m['code'])}]")
  kr = r.get("kernel_roofline") or {}
  if "estimated_step_s" in r:
    mfu = r.get("estimated_mfu")
    lines.append(f"estimated step time: {r['estimated_step_s'] * 1e3:.2f} ms  "
                 f"({r['estimated_tokens_per_s']:,.0f} tokens/s)  implied MFU "
                 f"{'-' if mfu is None else f'{100 * mfu:.1f}%'} of "
                 f"{r['peak_flops_per_device'] / 1e12:.0f} TFLOP/s per device")
    lines.append(f"  = {r['xla_priced_s'] * 1e3:.2f} ms XLA cost model (every op but the "
                 f"Pallas kernels) + {kr.get('seconds', 0.0) * 1e3:.2f} ms roofline estimate of "
                 f"{kr.get('calls', 0)} Pallas kernel call(s) XLA cannot see into")
    pc = r.get("xla_priced_counts") or {}
    if pc.get("flops") and pc.get("bytes") and pc.get("hbm_bandwidth"):
      compute, memory = pc["flops"] / r["peak_flops_per_device"], pc["bytes"] / pc["hbm_bandwidth"]
      lines.append(f"    (XLA's part against its own counts: {pc['flops'] / 1e12:.3f} TFLOP = "
                   f"{compute * 1e3:.2f} ms at peak, {pc['bytes'] / 1e9:.2f} GB of HBM traffic = "
                   f"{memory * 1e3:.2f} ms at {pc['hbm_bandwidth'] / 1e9:.0f} GB/s; priced "
                   f"{r['xla_priced_s'] / max(compute, memory):.2f}x the larger)")
    if "xla_with_opaque_kernels_s" in r:
      lines.append(f"    (XLA's own price of the program with the kernels as opaque calls, "
                   f"not used: {r['xla_with_opaque_kernels_s'] * 1e3:.2f} ms)")
    for name, k in sorted(kr.get("kernels", {}).items()):
      lines.append(f"    {name}: {k['calls']} calls, {k['flops'] / 1e12:.3f} TFLOP, "
                   f"{k['bytes'] / 2**20:.0f} MiB, {k['bound']}-bound, "
                   f"{k['seconds'] * 1e3:.2f} ms")
    if kr.get("calls"):
      lines.append(f"    (roofline: max(FLOPs / peak, bytes / HBM bandwidth) / efficiency "
                   f"{kr['efficiency']:g}: {kernel_cost.EFFICIENCY_SOURCE})")
    if kr.get("unpriced"):
      lines.append(f"  UNPRICED custom calls (the estimate is a lower bound): "
                   f"{sorted(set(kr['unpriced']))}")
    for note in r.get("estimate_notes", []):
      lines.append(f"  (estimated on a twin of the step: {note})")
    if r.get("free_custom_calls"):
      lines.append(f"  (XLA's price adjusted: {r['free_custom_calls']} ConcatBitcast custom "
                   "call(s) (weights prefetched into on-chip memory, joined in place) "
                   "counted at 0 s, where XLA's cost model charges -1 s for each)")
  else:
    lines.append("XLA reported no step-time estimate for this program")
  if r.get("breakdown") is not None:
    lines.extend(op_costs.format_breakdown(r["breakdown"], r.get("breakdown_top", 15)))
  xf = r.get("xla_flops_per_device")
  lines.append(f"FLOPs per device per step: model {r['model_flops_per_device'] / 1e12:.3f} T"
               + (f", XLA counted {xf / 1e12:.3f} T" if xf else "")
               + (f" + Pallas kernels {kr['flops'] / 1e12:.3f} T" if kr.get("calls") else ""))
  if c["attention_impl"] == "splash":
    lines.append(f"splash kernel in the compiled program: {r['splash_kernel_in_hlo']}")
  if not r["fits"]:
    lines.append(f"DOES NOT FIT: needs {gib(m['total'])} per device, the chip has "
                 f"{gib(r['hbm_capacity_bytes'])}. Try a smaller --global_batch, "
                 "--config.model.remat_policy=full, bfloat16, or more fsdp/tensor "
                 "sharding (--mesh).")
  return "\n".join(lines)
