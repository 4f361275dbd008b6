"""A study's outputs from its arms' rows: results.csv (one row per arm: each metric's mean,
standard error and per-seed values), results.md (our numbers over the pretraining seeds,
the random-init baseline, the paired test of the paper's claim, the learning curves, the
paper's table beside them), results.png, and summary.json (the line of the summary table
in docs/ablations/README.md, written by `write_summary`)."""
from __future__ import annotations

import csv
import glob
import json
import os
import platform

import numpy as np

from launch import markdown
from launch.ablation import stats
from launch.ablation import study as study_lib
from launch.trainer import plotting

CSV_FIELDS = ("arm", "label", "objective", "steps", "params", "pretrain_flops", "seeds",
              "mlm_accuracy", "mlm_baseline", "rtd_accuracy", "rtd_never_flag", "rtd_recall",
              "rtd_precision", "pair_on_nsp", "pair_on_sop", "probe_accuracy", "probe_random",
              "probe_gain", "probe_majority", "finetune_accuracy", "downstream_mean",
              "downstream_std", "downstream_seeds", "pretrain_s", "probe_s", "finetune_s",
              "wall_s", "config", "overrides")
PER_SEED = ("mlm_accuracy", "rtd_accuracy", "pair_on_nsp", "pair_on_sop", "probe_accuracy",
            "probe_random", "probe_gain", "finetune_accuracy")
METRIC_NAMES = {"mlm_accuracy": "held-out MLM accuracy", "rtd_accuracy":
                "held-out RTD accuracy", "rtd_recall": "RTD recall", "rtd_precision":
                "RTD precision", "pair_on_nsp": "pair head on NSP pairs",
                "pair_on_sop": "pair head on SOP pairs", "probe_accuracy":
                "linear-probe accuracy", "probe_gain": "probe gain over random init",
                "finetune_accuracy": "fine-tuned accuracy"}
# what each probe pool (launch/ablation/probe.py) reads
POOL_TEXT = {"mean": "the last hidden state averaged over the real tokens",
             "cls": "the first token's last hidden state",
             "mlm": "the MLM head's predicted-token distribution averaged over the real "
                    "tokens (log)"}
SUMMARY_BEGIN = "<!-- summary table: python -m launch.ablate --summary docs/ablations -->"
SUMMARY_END = "<!-- end of summary table -->"


def _pct(v, digits=1):
  if v is None or (isinstance(v, float) and np.isnan(v)):
    return "—"
  return f"{100 * v:.{digits}f}"


def _flops(v):
  return f"{v:.2e}" if v else "—"


def cell(row, metric, digits=1):
  """"mean ± se" in percent of an arm's metric over seeds ("—" when absent)."""
  m = row.get("metrics", {}).get(metric)
  if m is None:
    return "—"
  se = m["se"]
  return _pct(m["mean"], digits) + ("" if se is None or np.isnan(se) else f" ± {_pct(se, digits)}")


def write_csv(study, rows, path):
  columns = (CSV_FIELDS + tuple(f"{m}_se" for m in PER_SEED)
             + tuple(f"{m}_seeds" for m in PER_SEED)
             + tuple(f"paper: {c}" for c in study.get("paper_columns", ())))
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(columns)
    for r in rows:
      arm = study.arms[r["arm"]]
      paper = tuple(arm.get("paper", ())) or ("",) * len(study.get("paper_columns", ()))
      t = r.get("timing", {})
      values = {**r, "seeds": " ".join(str(s) for s in r.get("seeds", [])),
                "downstream_seeds": " ".join(f"{x:.4f}" for x in r.get("downstream_seeds", [])),
                "pretrain_s": round(t.get("pretrain_s", 0.0), 1),
                "probe_s": round(t.get("probe_s", 0.0), 1),
                "finetune_s": round(t.get("finetune_s", 0.0), 1),
                "wall_s": round(r.get("wall_s", 0.0), 1),
                "overrides": " ".join(r.get("overrides", []))}
      for m in PER_SEED:
        got = r.get("metrics", {}).get(m)
        if got is not None:
          values[f"{m}_se"] = got["se"]
          values[f"{m}_seeds"] = " ".join(f"{x:.4f}" for x in got["values"])
      w.writerow([values.get(c, "") if values.get(c) is not None else ""
                  for c in columns[:len(columns) - len(paper)]] + list(paper))


def comparison(study, rows):
  """The paper's claim (study.compare) tested on our seeds: stats.paired's dict plus
  the arms, metric and the paper's words; None without a claim or its two arms' rows."""
  cmp = study.get("compare", None)
  if cmp is None or not cmp.get("higher", ""):
    return None
  by = {r["arm"]: r for r in rows}
  hi, lo, metric = cmp.higher, cmp.lower, cmp.metric
  if hi not in by or lo not in by:
    return None
  vals = lambda r: {s["seed"]: s[metric] for s in r.get("per_seed", [])
                    if s.get(metric) is not None}
  a, b = vals(by[hi]), vals(by[lo])
  if not set(a) & set(b):
    return None
  out = stats.paired(a, b)
  out.update(higher=hi, lower=lo, metric=metric, paper=cmp.get("paper", ""),
             higher_label=by[hi]["label"], lower_label=by[lo]["label"])
  return out


def verdict(c) -> str:
  if c["reproduced"]:
    return "yes"
  if c["exceeds_2se"]:
    return "no (the opposite direction, beyond 2 standard errors)"
  return "no (not distinguishable at these seeds)"


def comparison_lines(c) -> list[str]:
  name = METRIC_NAMES.get(c["metric"], c["metric"])
  se = "—" if np.isnan(c["se"]) else f"{100 * c['se']:.1f}"
  return [f"- The paper: {c['paper']}" if c["paper"] else
          f"- The paper: {c['higher_label']} > {c['lower_label']}.",
          f"- Ours, {name}, paired by pretraining seed ({c['n']} seeds): "
          f"{c['higher_label']} − {c['lower_label']} = {100 * c['diff']:+.1f} points, "
          f"standard error {se}, t = {c['t']:.2f}.",
          f"- Reproduced (difference in the paper's direction > 2 standard errors): "
          f"**{verdict(c)}**."]


def learned_lines(rows) -> list[str]:
  """Per arm: pretraining vs its own random init on the probe (paired by seed), and the
  held-out MLM / RTD numbers against their trivial baselines."""
  out = []
  for r in rows:
    parts = []
    per = r.get("per_seed", [])
    if all(s.get("probe_accuracy") is not None for s in per) and per:
      p = stats.paired({s["seed"]: s["probe_accuracy"] for s in per},
                       {s["seed"]: s["probe_random"] for s in per})
      se = "—" if np.isnan(p["se"]) else f"{100 * p['se']:.1f}"
      parts.append(f"probe {100 * p['diff']:+.1f} ± {se} points over random init "
                   f"({'> 2 SE' if p['reproduced'] else 'not > 2 SE'})")
    if r.get("mlm_accuracy") is not None:
      parts.append(f"MLM {cell(r, 'mlm_accuracy')}% against {cell(r, 'mlm_baseline')}% "
                   "for the most frequent token")
    if r.get("rtd_accuracy") is not None:
      parts.append(f"RTD accuracy {cell(r, 'rtd_accuracy')}% against "
                   f"{cell(r, 'rtd_never_flag')}% for never flagging, recall "
                   f"{cell(r, 'rtd_recall')}%, precision {cell(r, 'rtd_precision')}%")
    if parts:
      out.append(f"- {r['label']}: " + "; ".join(parts) + ".")
  return out


def mean_curve(row, key) -> dict:
  """{step: `key`'s held-out value at that step, averaged over the arm's seeds}."""
  pts = {}
  for s in row.get("per_seed", []):
    for e in s.get("curve", []):
      if key in e:
        pts.setdefault(e["step"], []).append(e[key])
  return {st: float(np.mean(v)) for st, v in sorted(pts.items())}


def curve_table(rows) -> list[str]:
  """Held-out metrics over steps, mean over seeds, one column per arm and metric."""
  cols = []
  for r in rows:
    per = r.get("per_seed", [])
    keys = [k for k in ("mlm_accuracy", "rtd_accuracy", "nsp_accuracy", "sop_accuracy")
            if per and all(any(k in e for e in s.get("curve", [])) for s in per)]
    cols += [(r, k) for k in keys]
  if not cols:
    return []
  curves = [mean_curve(r, k) for r, k in cols]
  steps = sorted({st for c in curves for st in c})
  out = ["| step | " + " | ".join(f"{r['arm']}: {k.replace('_accuracy', '')} %"
                                   for r, k in cols) + " |", "|" + "---|" * (len(cols) + 1)]
  for st in steps:
    out.append(f"| {st} | " + " | ".join(_pct(c[st]) if st in c else "—" for c in curves)
               + " |")
  return out


def write_md(study, rows, path, command="", load="", baseline=None, run_info=None):
  s = study
  info = dict(run_info or {})
  ft = s.evaluate.get("finetune", None)
  pcfg = s.evaluate.get("probe", None)
  seeds = study_lib.seeds_of(s)
  out = [f"# {s.paper}, {s.table}: {s.get('question', '')}".rstrip(": "), ""]
  if command:
    out += ["Command:", "", "```bash", command, "```", ""]
  sc = s.get("scale", {})
  out.append("Scale: " + ", ".join(f"{k} {sc[k]}" for k in sc.keys() if sc[k]) + ".")
  out.append(f"Pretraining seeds {tuple(seeds)}: each arm pretrained once per seed "
             "(train.seed and data.shuffle_seed = the seed, the same for every arm); "
             "numbers are mean ± standard error over the seeds.")
  if pcfg is not None:
    maj = next((r["metrics"]["probe_majority"]["mean"] for r in rows
                if "probe_majority" in r.get("metrics", {})), None)
    out.append(f"Probe: {pcfg.dataset} ({int(pcfg.get('max_rows', -1))} rows max, "
               f"{float(pcfg.get('eval_fraction', 0.2)):.0%} held out with split seed "
               f"{int(pcfg.get('split_seed', 0))}, at most {int(pcfg.get('max_train', -1))} "
               f"training rows), seq {int(pcfg.get('seq_len', 128))}, "
               f"features: {POOL_TEXT[pcfg.get('pool', 'mean')]}, L2 logistic "
               "regression (launch/ablation/probe.py)"
               + (f"; always predicting the majority class {_pct(maj)}%" if maj is not None
                  else "") + ".")
  if ft is not None:
    out.append(f"Fine-tuning: {ft.dataset} ({int(ft.get('max_rows', -1))} rows max, "
               f"{float(ft.get('eval_fraction', 0.2)):.0%} held out), "
               f"{int(ft.get('epochs', 2))} epoch(s), seeds {tuple(ft.seeds)} per "
               "pretraining seed; accuracy of the last epoch"
               + (f"; majority class {100 * baseline:.1f}%" if baseline is not None else "")
               + ".")
  machine = f"Machine: {platform.node() or 'this host'}, {os.cpu_count()} CPUs"
  if info.get("load_start"):
    machine += f"; load average at the start {info['load_start']}"
  if load:
    machine += f", at the end {load}"
  wall = sum(r.get("wall_s", 0.0) for r in rows)
  machine += (f". Wall time: {wall / 60:.1f} min summed over the arms' phases"
              + (f", {info['elapsed_s'] / 60:.1f} min for this invocation"
                 if info.get("elapsed_s") else "") + ".")
  out.append(machine)
  out += ["", "## Ours", ""]
  mlm = s.evaluate.get("mlm", True) and any(r.get("mlm_accuracy") is not None for r in rows)
  rtd = any(r.get("rtd_accuracy") is not None for r in rows)
  pair_tasks = tuple(s.evaluate.get("pair_tasks", ()))
  head = ["arm", "paper's name", "steps", "pretrain FLOPs"]
  head += ["held-out MLM acc % (majority)"] if mlm else []
  head += ["RTD acc % (never flag)"] if rtd else []
  head += [f"pair head on {t.upper()} pairs %" for t in pair_tasks]
  head += ["probe acc %"] if pcfg is not None else []
  head += ["fine-tuned acc %"] if ft is not None else []
  head += ["wall s"]
  out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    cells = [r["arm"], r["label"], str(r["steps"]), _flops(r.get("pretrain_flops"))]
    if mlm:
      cells.append(f"{cell(r, 'mlm_accuracy')} ({cell(r, 'mlm_baseline')})")
    if rtd:
      cells.append(f"{cell(r, 'rtd_accuracy')} ({cell(r, 'rtd_never_flag')})")
    cells += [cell(r, f"pair_on_{t}") for t in pair_tasks]
    if pcfg is not None:
      cells.append(cell(r, "probe_accuracy"))
    if ft is not None:
      cells.append(cell(r, "finetune_accuracy"))
    cells.append(f"{r.get('wall_s', 0):.0f}")
    out.append("| " + " | ".join(cells) + " |")
  if pcfg is not None:
    for r in rows:
      if "probe_random" not in r.get("metrics", {}):
        continue
      cells = [f"random init ({r['arm']})", "same encoder, no pretraining", "0", "0"]
      cells += ["—"] * (int(mlm) + int(rtd) + len(pair_tasks))
      cells.append(cell(r, "probe_random"))
      cells += ["—"] * (ft is not None) + ["—"]
      out.append("| " + " | ".join(cells) + " |")
  c = comparison(s, rows)
  if c is not None:
    out += ["", "## The paper's claim, tested", ""] + comparison_lines(c)
  lines = learned_lines(rows)
  if lines:
    out += ["", "## Did each arm learn?", ""] + lines
  curves = curve_table(rows)
  if curves:
    out += ["", "## Learning curves (held out, mean over seeds)", ""] + curves
  columns = tuple(s.get("paper_columns", ()))
  if columns:
    out += ["", f"## The paper ({s.paper}, {s.table})", "",
            "| arm | paper's name | " + " | ".join(columns) + " | how our arm maps |",
            "|" + "---|" * (len(columns) + 3)]
    for name in study_lib.arm_names(s):
      a = s.arms[name]
      paper = tuple(a.get("paper", ())) or ("not checked",) * len(columns)
      out.append(f"| {name} | {a.get('label', name)} | " + " | ".join(str(p) for p in paper)
                 + f" | {a.get('note', '')} |")
  done = {r["arm"] for r in rows}
  pending = [a for a in study_lib.arm_names(s) if a not in done]
  not_run = list(s.get("not_run", ())) + [
      f"{a} ({s.arms[a].get('label', a)}): configured, not run in this work directory "
      f"(`--arms {a}` adds it)" for a in pending]
  if not_run:
    out += ["", "Not run here:", ""] + [f"- {x}" for x in not_run]
  out += ["", "Plot: results.png. Per-arm rows with per-seed values: results.csv.", ""]
  with open(path, "w") as f:
    f.write("\n".join(out))


def summary_record(study, rows, load="", run_info=None) -> dict:
  """The study's line of the summary table (summary.json)."""
  c = comparison(study, rows)
  cmp = study.get("compare", None)
  rec = {"study": study.name, "paper": f"{study.paper}, {study.table}",
         "paper_direction": (cmp.get("paper", "") if cmp is not None else "")
         or (f"{cmp.higher} > {cmp.lower}" if cmp is not None and cmp.get("higher") else ""),
         "wall_s": float(sum(r.get("wall_s", 0.0) for r in rows)),
         "load_start": (run_info or {}).get("load_start", ""), "load_end": load,
         "seeds": list(study_lib.seeds_of(study)), "arms": [r["arm"] for r in rows]}
  if c is not None:
    se = "—" if np.isnan(c["se"]) else f"{100 * c['se']:.1f}"
    rec.update(metric=c["metric"], diff=c["diff"], se=c["se"], t=c["t"], n=c["n"],
               reproduced=c["reproduced"], verdict=verdict(c),
               ours=f"{c['higher_label']} − {c['lower_label']}: {100 * c['diff']:+.1f} ± "
                    f"{se} points ({METRIC_NAMES.get(c['metric'], c['metric'])}, "
                    f"{c['n']} seeds)")
  return rec


def summary_table(records, base="") -> list[str]:
  out = ["| study | paper | paper's direction | ours (mean ± SE, paired by seed) | "
         "reproduced (> 2 SE) | wall time |", "|---|---|---|---|---|---|"]
  for r in records:
    link = f"[{r['study']}]({base}{r['study']}/results.md)"
    wall = f"{r['wall_s'] / 60:.0f} min" if r.get("wall_s") else "—"
    out.append(f"| {link} | {r['paper']} | {r.get('paper_direction') or '—'} | "
               f"{r.get('ours', 'no comparison')} | {r.get('verdict', '—')} | {wall} |")
  return out


def write_summary(docs_dir) -> str:
  """Rewrites the summary table in <docs_dir>/README.md (between SUMMARY_BEGIN and
  SUMMARY_END) from every <docs_dir>/*/summary.json; returns the README's path."""
  readme = os.path.join(docs_dir, "README.md")
  if not os.path.isfile(readme):
    raise study_lib.StudyError(f"--summary {docs_dir}: no README.md there")
  records = []
  for path in sorted(glob.glob(os.path.join(docs_dir, "*", "summary.json"))):
    with open(path) as f:
      rec = json.load(f)
    rec["study"] = os.path.basename(os.path.dirname(path))  # the folder the link goes to
    records.append(rec)
  body = (summary_table(records) if records else
          ["No study has a summary.json here yet (a study's run writes one next to its "
           "results.md)."])
  try:
    markdown.replace_block(readme, SUMMARY_BEGIN, SUMMARY_END, "\n" + "\n".join(body) + "\n")
  except ValueError:
    raise study_lib.StudyError(f"{readme} has no summary table markers ({SUMMARY_BEGIN!r} "
                               f"... {SUMMARY_END!r})") from None
  return readme


def plot(study, rows, path, baseline=None):
  plt = plotting.pyplot()
  panels = []
  if any("probe_accuracy" in r.get("metrics", {}) for r in rows):
    panels.append(("probe", "linear probe accuracy % (seeds: dots)"))
  if any("finetune_accuracy" in r.get("metrics", {}) for r in rows):
    panels.append(("finetune", "fine-tuned accuracy % (seeds: dots)"))
  if any(r.get("mlm_accuracy") is not None for r in rows):
    panels.append(("mlm", "held-out MLM accuracy %"))
  if any(r.get("rtd_accuracy") is not None for r in rows):
    panels.append(("rtd", "held-out RTD accuracy %"))
  pair_tasks = tuple(study.evaluate.get("pair_tasks", ()))
  if pair_tasks and any(r.get(f"pair_on_{t}") is not None for r in rows for t in pair_tasks):
    panels.append(("pair", "pair head accuracy %"))
  if any(s.get("curve") for r in rows for s in r.get("per_seed", [])):
    panels.append(("curve", "held-out accuracy % over steps"))
  fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.2 * max(1, len(panels)), 3.8),
                           squeeze=False)
  labels = [r["label"] for r in rows]
  x = np.arange(len(rows))

  def bars(ax, metric, offset=0.0, width=0.8, color="tab:blue", label=None):
    got = [r.get("metrics", {}).get(metric) for r in rows]
    means = [100 * g["mean"] if g else np.nan for g in got]
    ses = [100 * g["se"] if g and not np.isnan(g["se"]) else 0.0 for g in got]
    ax.bar(x + offset, means, width, yerr=ses, capsize=4, color=color, alpha=0.7,
           label=label)
    for i, g in enumerate(got):
      if g:
        ax.plot([i + offset] * len(g["values"]), [100 * v for v in g["values"]], "k.", ms=4)

  for ax, (kind, title) in zip(axes[0], panels):
    if kind == "probe":
      bars(ax, "probe_accuracy", -0.2, 0.4, "tab:blue", "pretrained")
      bars(ax, "probe_random", 0.2, 0.4, "tab:gray", "random init")
      ax.legend(fontsize=7)
    elif kind == "finetune":
      bars(ax, "finetune_accuracy")
      if baseline is not None:
        ax.axhline(100 * baseline, color="red", ls="--", lw=1, label="majority class")
        ax.legend(fontsize=7)
    elif kind == "mlm":
      bars(ax, "mlm_accuracy", color="tab:green")
      ax.plot(x, [100 * (r.get("mlm_baseline") or 0) for r in rows], "r_", ms=20,
              label="most frequent token")
      ax.legend(fontsize=7)
    elif kind == "rtd":
      bars(ax, "rtd_accuracy", color="tab:purple")
      ax.plot(x, [100 * (r.get("rtd_never_flag") or 0) for r in rows], "r_", ms=20,
              label="never flag")
      ax.legend(fontsize=7)
    elif kind == "pair":
      w = 0.8 / len(pair_tasks)
      for j, t in enumerate(pair_tasks):
        bars(ax, f"pair_on_{t}", (j - (len(pair_tasks) - 1) / 2) * w, w, f"C{j}",
             f"on {t.upper()}")
      ax.axhline(50, color="gray", ls="--", lw=1)
      ax.legend(fontsize=7)
    if kind == "curve":
      for i, r in enumerate(rows):
        for k, ls in (("mlm_accuracy", "-"), ("rtd_accuracy", "--")):
          c = mean_curve(r, k)
          if c:
            ax.plot(list(c), [100 * v for v in c.values()], ls, color=f"C{i}",
                    label=f"{r['label']} {k.split('_')[0]}")
      ax.set_xlabel("step", fontsize=8)
      ax.legend(fontsize=6)
    else:
      ax.set_xticks(x)
      ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
  fig.suptitle(f"{study.paper}, {study.table}", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def write_all(study, rows, workdir, command="", load="", baseline=None, run_info=None):
  paths = {k: os.path.join(workdir, f"results.{k}") for k in ("csv", "md", "png")}
  write_csv(study, rows, paths["csv"])
  write_md(study, rows, paths["md"], command, load, baseline, run_info)
  plot(study, rows, paths["png"], baseline)
  paths["summary"] = os.path.join(workdir, "summary.json")
  with open(paths["summary"], "w") as f:
    json.dump(summary_record(study, rows, load, run_info), f, indent=2, default=float)
  return paths
