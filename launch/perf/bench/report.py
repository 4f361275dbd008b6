"""The benchmark report: the numbers of a run as a table."""
from typing import Any, Dict

from launch.perf import runinfo
from launch.perf.bench import loop
from launch.perf.bench.runs import PEAK_DRIFT as DRIFT_WARNING


def _fmt_bytes(n):
  return "-" if n is None else f"{n / 2**30:.2f} GiB"


def _fmt_rate(x):
  return "-" if x is None else f"{x / 1e9:,.1f} GFLOP/s" if x < 1e12 else f"{x / 1e12:,.1f} TFLOP/s"


def _fmt_mfu(x):
  return "-" if x is None else f"{100 * x:.1f}%"


def _peak_lines(r: Dict[str, Any]):
  """The peak MFU is taken against; on the CPU, the rates measured at each end of the
  timed iterations, and the reference's share of that peak (launch/perf/bench/runs.py)."""
  out = [f"peak per device: {_fmt_rate(r['peak_flops_per_device'])} "
         f"({r.get('peak_source', 'published')})"]
  pm = r.get("peak_measured")
  if not pm:
    return out
  for lib in pm["before"]:
    out.append(f"  {lib} dense matmul: {_fmt_rate(pm['before'][lib])} before the timed "
               f"iterations, {_fmt_rate(pm['after'][lib])} after")
  if r["peak_drift"] > DRIFT_WARNING:
    out.append(f"  WARNING: the machine's matmul rate moved {100 * r['peak_drift']:.0f}% "
               "during the run; its speed was not steady, so this run's ratio is not a "
               "result")
  t = r.get("theirs")
  if t and t.get("mfu"):
    out.append(f"  transformers ran at {100 * t['mfu']:.1f}% of this peak (median step)")
  return out


def format_report(r: Dict[str, Any]) -> str:
  c, m = r["config"], r.get("machine", {})
  lines = [f"encoder-zoo bench: {c['family']} {c['variant']} (L{c['layers']} H{c['hidden']} "
           f"A{c['heads']}), mode={r['mode']}, batch {r['batch']} x seq {r['seq']}, "
           f"{c['dtype']}, attention={c['attention_impl']}, remat={c['remat_policy']}, "
           f"scan_layers={c['scan_layers']}, objective={runinfo.objective_text(c)}, "
           f"vocab_pad_multiple={c['vocab_pad_multiple']}"]
  if m:
    lines.append(f"machine: {m.get('cpu')} ({m.get('cpu_cores')} cores), jax "
                 f"{m.get('platform')} x{m.get('devices')} {m.get('device_kind')}, "
                 f"{m.get('date')}")
  if r["mode"] == "loop":
    return "\n".join(lines + loop.format_loop(r))
  lines += _peak_lines(r)
  if "ours" in r:
    o, t = r["ours"], r.get("theirs")
    lines.append(f"compile: {r['compile_s']:.1f} s")
    rows = [("step time (median)", lambda s: f"{s['step_time_s'] * 1e3:,.1f} ms"),
            ("step time (best)", lambda s: f"{s['best_step_time_s'] * 1e3:,.1f} ms"),
            ("tokens/s (median)", lambda s: f"{s['tokens_per_s']:,.0f}"),
            ("tokens/s (best)", lambda s: f"{s['best_tokens_per_s']:,.0f}"),
            ("FLOPs/step", lambda s: f"{s['flops_per_step'] / 1e9:,.1f} G"),
            ("achieved FLOP/s", lambda s: _fmt_rate(s["flops_per_s"])),
            ("MFU (median)", lambda s: _fmt_mfu(s["mfu"])),
            ("MFU (best)", lambda s: _fmt_mfu(s["best_mfu"]))]
    head = f"{'':22}{'ours (jax)':>22}"
    if t:
      head += f"{'transformers (torch)':>24}"
    lines.append(head)
    for name, f in rows:
      line = f"{name:22}{f(o):>22}"
      if t:
        line += f"{f(t):>24}"
      lines.append(line)
    mem = o["memory"]
    lines.append(f"{'peak memory':22}{_fmt_bytes(mem.get('xla_buffers_bytes')):>22}"
                 "  (XLA buffers per device)")
    if "device_peak_bytes" in mem:
      lines.append(f"{'':22}{_fmt_bytes(mem['device_peak_bytes']):>22}  (device peak)")
    else:
      lines.append(f"{'':22}{_fmt_bytes(mem.get('process_max_rss_bytes')):>22}"
                   "  (process max RSS after warmup)")
    if t:
      lines.append(f"transformers: {t['architecture']}, attn_implementation="
                   f"{t['attn_implementation']}")
      if "max_abs_diff_last_hidden" in r:
        lines.append(f"check: max |ours - theirs| of the last hidden state "
                     f"{r['max_abs_diff_last_hidden']:.2e}")
      lines.append(f"ratio ours/theirs (tokens/s): {r['ratio_tokens_per_s']:.2f}x (median of "
                   f"paired iterations), {r['ratio_best_tokens_per_s']:.2f}x (best vs best)")
  if "packed" in r:
    lines.append(f"{r['docs']} documents ({r['doc_lengths']}, mean {r['mean_doc_len']:.1f} "
                 f"tokens, {r['real_tokens']} real tokens); padded to the batch max rounded "
                 f"up to {r['pad_multiple']}")
    lines.append(f"{'':10}{'batches':>9}{'fill':>8}{'time':>11}{'real tok/s':>13}"
                 f"{'slot tok/s':>13}{'MFU':>8}")
    for name in ("padded", "packed"):
      v = r[name]
      lines.append(f"{name:10}{v['batches']:>9}{100 * v['fill']:>7.1f}%{v['time_s']:>10.2f}s"
                   f"{v['real_tokens_per_s']:>13,.0f}{v['slot_tokens_per_s']:>13,.0f}"
                   f"{_fmt_mfu(v['mfu']):>8}")
    paired = ""
    if "ratio_paired_median" in r:
      paired = (f"; {r['ratio_paired_median']:.2f}x the median of the {len(r['pass_ratios'])} "
                f"back-to-back pass pairs ({', '.join(f'{x:.2f}' for x in r['pass_ratios'])})")
    lines.append(f"ratio packed/padded (real tokens/s): {r['ratio_real_tokens_per_s']:.2f}x "
                 f"best vs best{paired}")
  return "\n".join(lines)
