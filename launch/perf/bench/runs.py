"""The benchmark runs: one step shape timed (ours, optionally next to transformers'), and
the same documents packed vs padded."""
import statistics
from typing import Any, Dict

import jax
import ml_collections

from encoders import base
from launch.perf import runinfo, synthetic
from launch.perf.bench.models import Ours
from launch.trainer import devices as devices_lib


def _median(xs):
  return statistics.median(xs) if xs else float("nan")


def _stats(times, tokens, flops, peak, devices) -> Dict[str, Any]:
  t, best = _median(times), min(times)
  return {"step_time_s": t, "best_step_time_s": best,
          "step_times_s": [round(x, 6) for x in times],
          "tokens_per_s": tokens / t, "best_tokens_per_s": tokens / best,
          "flops_per_step": flops, "flops_per_s": flops / t,
          "mfu": flops / t / (peak * devices) if peak else None,
          "best_mfu": flops / best / (peak * devices) if peak else None}


def _config_copy(config, batch: int, seq: int):
  c = ml_collections.ConfigDict(config.to_dict())
  c.data.global_batch = batch
  c.data.seq_len = seq
  base.resolve_auto(c.model, jax.devices()[0].platform)  # explicit in the run and report
  return c


# On the CPU a run's peak is measured in the run itself, just before and just after the
# timed iterations, by a square matmul of this size in the compute dtype: JAX's, and with
# --compare-hf torch's too. The peak is the best rate either library reached. This VM's
# matmul rate moves from day to day (213 to 383 GFLOP/s in float32 over 2026-12-02..05),
# so a cached figure from another day makes both sides' MFU wrong, and only a peak taken
# in the same run shows whether the reference ran at its usual efficiency.
PEAK_MATMUL_N = 2048
PEAK_REPEATS = 5
PEAK_DRIFT = 0.10  # the rate moving more than this between the two ends is reported


def measure_peak(dtype: str, with_torch: bool) -> Dict[str, float]:
  """This moment's dense-matmul FLOP/s of the CPU: {"jax": ..., "torch": ...}."""
  rates = {"jax": devices_lib.measure_cpu_matmul_flops(PEAK_MATMUL_N, dtype, PEAK_REPEATS,
                                                        cached=False)}
  if with_torch:
    from launch.perf.bench import theirs  # torch: the hf extra, only for --compare-hf
    rates["torch"] = theirs.matmul_flops(PEAK_MATMUL_N, dtype, PEAK_REPEATS)
  return rates


def _on_cpu() -> bool:
  return jax.devices()[0].platform == "cpu"


def peak(config) -> float:
  """The published peak of a TPU/GPU chip; 0.0 on the CPU, whose peak a run measures."""
  return 0.0 if _on_cpu() else devices_lib.peak_flops(jax.devices()[0], config.model.dtype)


def run_peak(published: float, before, after) -> Dict[str, Any]:
  """The peak a run's MFU is taken against, and how it was obtained. `before`/`after`: the
  CPU's rates at each end of the timed iterations (None off the CPU)."""
  if before is None:
    return {"peak_flops_per_device": published, "peak_source": "published"}
  best_before, best_after = max(before.values()), max(after.values())
  drift = abs(best_after - best_before) / max(best_before, best_after)
  return {"peak_flops_per_device": max(best_before, best_after),
          "peak_source": f"measured in this run, {PEAK_MATMUL_N}^3 matmul",
          "peak_measured": {"before": before, "after": after}, "peak_drift": drift}


def _cpu_rates(config, with_torch: bool):
  return measure_peak(config.model.dtype, with_torch) if _on_cpu() else None


def _check_platform(config):
  if config.model.attention_impl == "splash" and jax.devices()[0].platform != "tpu":
    raise SystemExit("attention_impl=splash is a TPU kernel and cannot run on "
                     f"{jax.devices()[0].platform}; check it with `python -m launch.aot` "
                     "(compiles for a Cloud TPU topology) or pick xla/einsum here.")


def bench_step(config, mode: str = "train", batch: int = 8, seq: int = 0, iters: int = 10,
               warmup: int = 2, compare_hf: bool = False, seed: int = 0,
               log=print) -> Dict[str, Any]:
  """Times our step (and transformers' with `compare_hf`) on full-length rows."""
  seq = seq or config.data.seq_len
  config = _config_copy(config, batch, seq)
  _check_platform(config)
  result = {"mode": mode, "batch": batch, "seq": seq, "iters": iters, "warmup": warmup,
            "dtype": config.model.dtype}
  ours = Ours(config, mode)
  result["config"] = runinfo.config_summary(config, ours.objective)
  host = synthetic.full_batch(ours.objective, batch, seq, seed)
  b = ours.device_batch(host)
  ours.compile(b)
  key = ours.shape_key(b)
  result["compile_s"] = ours.compile_s[key]
  for _ in range(warmup):
    ours.step(b)
  memory = {"xla_buffers_bytes": ours.memory[key], **devices_lib.measured_peak_bytes()}
  theirs = x = None
  if compare_hf:
    from launch.perf.bench import theirs as theirs_lib  # torch: the hf extra, only for --compare-hf
    theirs = theirs_lib.Theirs(config, mode, ours.objective, ours.params_for_export())
    x = theirs.inputs(host, seed)
    if mode == "forward":
      result["max_abs_diff_last_hidden"] = ours.objective.reference_diff(
          ours.output(b), theirs.run(x), host)
    # Warm up in pairs: both sides share the process's heap (launch/trainer/hostmem.py keeps it
    # untrimmed), and until its layout settles each side's first steps after the other
    # has run fault in fresh pages (ModernBERT-base train: ~480k, 156k, 78k minor faults
    # in ours' steps 1-3 after transformers' first, 0 once settled).
    for _ in range(warmup):
      theirs.step(x)
      ours.step(b)
  before = _cpu_rates(config, theirs is not None)
  t_ours, t_theirs = [], []
  for _ in range(iters):
    t_ours.append(ours.step(b))
    if theirs is not None:
      t_theirs.append(theirs.step(x))
  result.update(run_peak(peak(config), before, _cpu_rates(config, theirs is not None)))
  pk = result["peak_flops_per_device"]
  n = devices_lib.peak_devices(jax.devices())
  result["ours"] = _stats(t_ours, batch * seq, ours.step_flops(batch, seq), pk, n)
  result["ours"]["memory"] = memory
  if theirs is not None:
    result["theirs"] = _stats(t_theirs, batch * seq, theirs.step_flops(batch, seq), pk, 1)
    result["theirs"].update(architecture=theirs.arch,
                            attn_implementation=theirs.attn_implementation)
    # Iterations alternate, so iteration i of each side saw the same background load:
    # the median of the paired ratios is the headline; best-vs-best is shown too.
    result["ratio_tokens_per_s"] = _median([b / a for a, b in zip(t_ours, t_theirs)])
    result["ratio_best_tokens_per_s"] = min(t_theirs) / min(t_ours)
  return result


def bench_packed(config, spec: str, mode: str = "train", batch: int = 8, seq: int = 0,
                 iters: int = 10, pad_multiple: int = 16, passes: int = 2, seed: int = 0,
                 log=print) -> Dict[str, Any]:
  """Real-token throughput of the same documents packed vs padded to the batch maximum."""
  seq = seq or config.data.seq_len
  config = _config_copy(config, batch, seq)
  _check_platform(config)
  lengths = synthetic.doc_lengths(spec, batch * iters, seq, seed)
  layouts = {"packed": synthetic.packed_layouts(lengths, batch, seq),
             "padded": synthetic.padded_layouts(lengths, batch, seq, pad_multiple)}
  result = {"mode": mode, "batch": batch, "seq": seq, "docs": int(len(lengths)),
            "doc_lengths": spec, "pad_multiple": pad_multiple, "passes": passes,
            "mean_doc_len": float(lengths.mean()), "real_tokens": int(lengths.sum()),
            "dtype": config.model.dtype}
  ours = Ours(config, mode)
  result["config"] = runinfo.config_summary(config, ours.objective)
  n = devices_lib.peak_devices(jax.devices())
  before = _cpu_rates(config, False)
  dev = {}
  for name, group in layouts.items():
    dev[name] = [ours.device_batch(h) for h in synthetic.batches(ours.objective, group, seed)]
    for b in dev[name]:  # compile every shape, and run it once
      ours.step(b)
  totals = {name: [] for name in layouts}
  for _ in range(passes):  # the layouts alternate pass by pass: both see the same machine
    for name in layouts:
      totals[name].append(sum(ours.step(b) for b in dev[name]))
  for name, group in layouts.items():
    best = min(totals[name])
    slots = sum(len(layout) * width for layout, width in group)
    real = sum(sum(sum(docs) for docs in layout) for layout, _ in group)
    assert real == result["real_tokens"]  # both variants hold exactly these documents
    flops = sum(ours.step_flops(len(layout), width) for layout, width in group)
    result[name] = {
        "batches": len(group), "shapes": sorted({(len(rows), w) for rows, w in group}),
        "token_slots": slots, "fill": real / slots,
        "time_s": best, "pass_times_s": [round(t, 4) for t in totals[name]],
        "real_tokens_per_s": real / best,
        "slot_tokens_per_s": slots / best, "flops_per_s": flops / best}
  # the same documents on both sides: real tokens/s packed / padded = padded / packed time,
  # pass by pass (each pair back to back), as well as best against best (the headline)
  pairs = [a / b for a, b in zip(totals["padded"], totals["packed"])]
  result["pass_ratios"] = [round(x, 4) for x in pairs]
  result["ratio_paired_median"] = _median(pairs)
  result.update(run_peak(peak(config), before, _cpu_rates(config, False)))
  pk = result["peak_flops_per_device"]
  for name in layouts:
    result[name]["mfu"] = result[name]["flops_per_s"] / (pk * n) if pk else None
  result["ratio_real_tokens_per_s"] = (result["packed"]["real_tokens_per_s"]
                                       / result["padded"]["real_tokens_per_s"])
  return result
