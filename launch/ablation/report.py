"""A study's outputs from its arms' result rows: results.csv (one row per arm),
results.md (our numbers, the paper's beside them, the mechanical reading of the
direction), and results.png (per-arm bars with the seeds' spread)."""
from __future__ import annotations

import csv
import os
import platform

import numpy as np

from launch.ablation import study as study_lib
from launch.trainer import plotting

CSV_FIELDS = ("arm", "label", "objective", "steps", "params", "pretrain_flops",
              "mlm_accuracy", "mlm_baseline", "pair_on_nsp", "pair_on_sop",
              "downstream_mean", "downstream_std", "downstream_seeds", "seeds",
              "pretrain_s", "finetune_s", "wall_s", "config", "overrides")


def _fmt(v, pct=False, digits=1):
  if v is None or (isinstance(v, float) and np.isnan(v)):
    return "—"
  if pct:
    return f"{100 * v:.{digits}f}"
  return str(v)


def _flops(v):
  return f"{v:.2e}" if v else "—"


def write_csv(study, rows, path):
  columns = CSV_FIELDS + tuple(f"paper: {c}" for c in study.get("paper_columns", ()))
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(columns)
    for r in rows:
      arm = study.arms[r["arm"]]
      paper = tuple(arm.get("paper", ())) or ("",) * len(study.get("paper_columns", ()))
      t = r.get("timing", {})
      values = {**r, "seeds": " ".join(str(s["seed"]) for s in r.get("finetune", [])),
                "downstream_seeds": " ".join(f"{x:.4f}" for x in r.get("downstream_seeds", [])),
                "pretrain_s": round(t.get("pretrain_s", 0.0), 1),
                "finetune_s": round(t.get("finetune_s", 0.0), 1),
                "wall_s": round(r.get("wall_s", 0.0), 1),
                "overrides": " ".join(r.get("overrides", []))}
      w.writerow([values.get(c, "") if values.get(c) is not None else ""
                  for c in CSV_FIELDS] + list(paper))


def direction(study, rows) -> list[str]:
  """Mechanical reading: the paper's order on `paper_compare` against ours on the
  downstream mean, and which of our differences exceed the seeds' spread."""
  col = study.get("paper_compare", "")
  columns = tuple(study.get("paper_columns", ()))
  lines = []
  ours = [(r["label"], r["downstream_mean"], r.get("downstream_std", 0.0),
           len(r.get("downstream_seeds", []))) for r in rows if "downstream_mean" in r]
  if len(ours) < 2:
    return lines
  if col in columns:
    i = columns.index(col)
    paper = []
    for r in rows:
      p = tuple(study.arms[r["arm"]].get("paper", ()))
      try:
        paper.append((r["label"], float(str(p[i]).split("/")[0])))
      except (IndexError, ValueError):
        pass
    if len(paper) >= 2:
      order = " > ".join(f"{n} ({v:g})" for n, v in sorted(paper, key=lambda x: -x[1]))
      lines.append(f"- Paper's order on {col}: {order}.")
  order = " > ".join(f"{n} ({100 * m:.1f})" for n, m, _, _ in sorted(ours, key=lambda x: -x[1]))
  lines.append(f"- Our order on the downstream task (mean accuracy over seeds): {order}.")
  best = max(ours, key=lambda x: x[1])
  for n, m, s, k in ours:
    if n == best[0]:
      continue
    # Standard error of the difference of two means over k seeds each.
    se = np.sqrt((s ** 2 + best[2] ** 2) / max(k, 1))
    gap = best[1] - m
    verdict = ("larger than 2 standard errors" if gap > 2 * se else
               "within 2 standard errors: not distinguishable at these seeds")
    lines.append(f"- {best[0]} − {n}: {100 * gap:+.1f} points, standard error "
                 f"{100 * se:.1f}: {verdict}.")
  return lines


def write_md(study, rows, path, command="", load="", baseline=None):
  s = study
  ft = s.evaluate.get("finetune", None)
  out = [f"# {s.paper}, {s.table}: {s.get('question', '')}".rstrip(": "), ""]
  if command:
    out += ["Command:", "", "```bash", command, "```", ""]
  sc = s.get("scale", {})
  out.append("Scale: " + ", ".join(f"{k} {sc[k]}" for k in sc.keys() if sc[k]) + ".")
  if ft is not None:
    out.append(f"Downstream: {ft.dataset} ({int(ft.get('max_rows', -1))} rows max, "
               f"{float(ft.get('eval_fraction', 0.2)):.0%} held out with split seed "
               f"{int(ft.get('split_seed', 0))}), {int(ft.get('epochs', 2))} "
               f"epoch{'s' if int(ft.get('epochs', 2)) != 1 else ''}, seq "
               f"{int(ft.get('seq_len', 64))}, seeds {tuple(ft.seeds)}; accuracy of the "
               "last epoch"
               + (f"; always predicting the majority class {100 * baseline:.1f}%"
                  if baseline is not None else "")
               + ". Pretraining: one seed per arm.")
  out.append(f"Machine: {platform.node() or 'this host'}"
             + (f", load average at the end {load}" if load else "")
             + "; wall times are under that load and are not benchmarks.")
  out += ["", "## Ours", ""]
  head = ["arm", "paper's name", "steps", "pretrain FLOPs"]
  if s.evaluate.get("mlm", True):
    head += ["held-out MLM acc % (majority)"]
  pair_tasks = tuple(s.evaluate.get("pair_tasks", ()))
  head += [f"pair head on {t.upper()} pairs %" for t in pair_tasks]
  if ft is not None:
    head += ["downstream acc % mean ± std (seeds)"]
  head += ["wall s"]
  out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in rows:
    cells = [r["arm"], r["label"], str(r["steps"]), _flops(r.get("pretrain_flops"))]
    if s.evaluate.get("mlm", True):
      cells.append(f"{_fmt(r.get('mlm_accuracy'), True)} ({_fmt(r.get('mlm_baseline'), True)})")
    for t in pair_tasks:
      n = r.get(f"pair_on_{t}_count")
      cells.append(f"{_fmt(r.get(f'pair_on_{t}'), True)}" + (f" (n={int(n)})" if n else ""))
    if ft is not None and "downstream_mean" in r:
      seeds = ", ".join(f"{100 * x:.1f}" for x in r["downstream_seeds"])
      cells.append(f"{100 * r['downstream_mean']:.1f} ± {100 * r['downstream_std']:.1f} "
                   f"({seeds})")
    elif ft is not None:
      cells.append("—")
    cells.append(f"{r.get('wall_s', 0):.0f}")
    out.append("| " + " | ".join(cells) + " |")
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
  lines = direction(s, rows)
  if lines:
    out += ["", "## Direction (computed)", ""] + lines
  out += ["", "Plot: results.png. Per-arm rows: results.csv.", ""]
  with open(path, "w") as f:
    f.write("\n".join(out))


def plot(study, rows, path, baseline=None):
  plt = plotting.pyplot()
  panels = []
  if any("downstream_mean" in r for r in rows):
    panels.append(("downstream", "downstream accuracy % (seeds: dots)"))
  if any(r.get("mlm_accuracy") is not None for r in rows):
    panels.append(("mlm", "held-out MLM accuracy %"))
  pair_tasks = tuple(study.evaluate.get("pair_tasks", ()))
  if pair_tasks and any(r.get(f"pair_on_{t}") is not None for r in rows for t in pair_tasks):
    panels.append(("pair", "pair head accuracy %"))
  fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.2 * max(1, len(panels)), 3.8),
                           squeeze=False)
  labels = [r["label"] for r in rows]
  x = np.arange(len(rows))
  for ax, (kind, title) in zip(axes[0], panels):
    if kind == "downstream":
      means = [100 * r.get("downstream_mean", np.nan) for r in rows]
      stds = [100 * r.get("downstream_std", 0.0) for r in rows]
      ax.bar(x, means, yerr=stds, capsize=4, color="tab:blue", alpha=0.7)
      for i, r in enumerate(rows):
        seeds = [100 * v for v in r.get("downstream_seeds", [])]
        ax.plot([i] * len(seeds), seeds, "k.", ms=5)
      values = [v for r in rows for v in r.get("downstream_seeds", [])] or [0.5]
      if baseline is not None:
        ax.axhline(100 * baseline, color="red", ls="--", lw=1, label="majority class")
        ax.legend(fontsize=7)
        values.append(baseline)
      ax.set_ylim(max(0, 100 * min(values) - 5), None)
    elif kind == "mlm":
      ax.bar(x, [100 * (r.get("mlm_accuracy") or 0) for r in rows], color="tab:green",
             alpha=0.7)
      ax.plot(x, [100 * (r.get("mlm_baseline") or 0) for r in rows], "r_", ms=20,
              label="most frequent token")
      ax.legend(fontsize=7)
    else:
      w = 0.8 / len(pair_tasks)
      for j, t in enumerate(pair_tasks):
        ax.bar(x + (j - (len(pair_tasks) - 1) / 2) * w,
               [100 * (r.get(f"pair_on_{t}") or 0) for r in rows], w, label=f"on {t.upper()}")
      ax.axhline(50, color="gray", ls="--", lw=1)
      ax.legend(fontsize=7)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
  fig.suptitle(f"{study.paper}, {study.table}", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def write_all(study, rows, workdir, command="", load="", baseline=None):
  paths = {k: os.path.join(workdir, f"results.{k}") for k in ("csv", "md", "png")}
  write_csv(study, rows, paths["csv"])
  write_md(study, rows, paths["md"], command, load, baseline)
  plot(study, rows, paths["png"], baseline)
  return paths
