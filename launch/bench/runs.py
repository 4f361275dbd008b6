"""The benchmark runs: one step shape timed (ours, optionally next to transformers'), and
the same documents packed vs padded."""
import statistics
from typing import Any, Dict

from launch import devices as devices_lib
from launch import runinfo, synthetic
from launch.bench.models import Ours, Theirs


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
  import jax
  import ml_collections
  from encoders import base
  c = ml_collections.ConfigDict(config.to_dict())
  c.data.global_batch = batch
  c.data.seq_len = seq
  base.resolve_auto(c.model, jax.devices()[0].platform)  # explicit in the run and report
  return c


def peak(config) -> float:
  import jax
  return devices_lib.peak_flops(jax.devices()[0], config.model.dtype)


def _check_platform(config):
  import jax
  if config.model.attention_impl == "splash" and jax.devices()[0].platform != "tpu":
    raise SystemExit("attention_impl=splash is a TPU kernel and cannot run on "
                     f"{jax.devices()[0].platform}; check it with `python -m launch.aot` "
                     "(compiles for a Cloud TPU topology) or pick xla/einsum here.")


def bench_step(config, mode: str = "train", batch: int = 8, seq: int = 0, iters: int = 10,
               warmup: int = 2, compare_hf: bool = False, seed: int = 0,
               log=print) -> Dict[str, Any]:
  """Times our step (and transformers' with `compare_hf`) on full-length rows."""
  import jax
  seq = seq or config.data.seq_len
  config = _config_copy(config, batch, seq)
  _check_platform(config)
  result = {"mode": mode, "batch": batch, "seq": seq, "iters": iters, "warmup": warmup,
            "dtype": config.model.dtype}
  pk = peak(config)
  result["peak_flops_per_device"] = pk
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
    theirs = Theirs(config, mode, ours.objective, ours.params_for_export())
    x = theirs.inputs(host, seed)
    if mode == "forward":
      result["max_abs_diff_last_hidden"] = ours.objective.reference_diff(
          ours.output(b), theirs.run(x), host)
    # Warm up in pairs: both sides share the process's heap (launch/hostmem.py keeps it
    # untrimmed), and until its layout settles each side's first steps after the other
    # has run fault in fresh pages (ModernBERT-base train: ~480k, 156k, 78k minor faults
    # in ours' steps 1-3 after transformers' first, 0 once settled).
    for _ in range(warmup):
      theirs.step(x)
      ours.step(b)
  t_ours, t_theirs = [], []
  for _ in range(iters):
    t_ours.append(ours.step(b))
    if theirs is not None:
      t_theirs.append(theirs.step(x))
  n = jax.device_count()
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
  import jax
  seq = seq or config.data.seq_len
  config = _config_copy(config, batch, seq)
  _check_platform(config)
  lengths = synthetic.doc_lengths(spec, batch * iters, seq, seed)
  layouts = {"packed": synthetic.packed_layouts(lengths, batch, seq),
             "padded": synthetic.padded_layouts(lengths, batch, seq, pad_multiple)}
  pk = peak(config)
  result = {"mode": mode, "batch": batch, "seq": seq, "docs": int(len(lengths)),
            "doc_lengths": spec, "pad_multiple": pad_multiple, "passes": passes,
            "mean_doc_len": float(lengths.mean()), "real_tokens": int(lengths.sum()),
            "dtype": config.model.dtype, "peak_flops_per_device": pk}
  ours = Ours(config, mode)
  result["config"] = runinfo.config_summary(config, ours.objective)
  n = jax.device_count()
  for name, group in layouts.items():
    host_batches = synthetic.batches(ours.objective, group, seed)
    dev = [ours.device_batch(h) for h in host_batches]
    for b in dev:  # compile every shape, and run it once
      ours.step(b)
    totals = []
    for _ in range(passes):
      totals.append(sum(ours.step(b) for b in dev))
    best = min(totals)
    slots = sum(len(layout) * width for layout, width in group)
    real = sum(sum(sum(docs) for docs in layout) for layout, _ in group)
    assert real == result["real_tokens"]  # both variants hold exactly these documents
    flops = sum(ours.step_flops(len(layout), width) for layout, width in group)
    result[name] = {
        "batches": len(group), "shapes": sorted({(len(l), w) for l, w in group}),
        "token_slots": slots, "fill": real / slots,
        "time_s": best, "pass_times_s": [round(t, 4) for t in totals],
        "real_tokens_per_s": real / best,
        "slot_tokens_per_s": slots / best, "flops_per_s": flops / best,
        "mfu": flops / best / (pk * n) if pk else None}
  result["ratio_real_tokens_per_s"] = (result["packed"]["real_tokens_per_s"]
                                       / result["padded"]["real_tokens_per_s"])
  return result
