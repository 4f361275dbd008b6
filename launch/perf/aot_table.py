"""The AOT table: every family's train step priced by `launch.aot` on each topology, one
compile after another, rendered as one markdown table (`python -m launch.aot_table`).

Each (row, topology) is a `python -m launch.aot ... --json` run in its own process (a
compile's memory is given back before the next) whose report is kept as
`<out>/<row>__<topology>.json`; a report already there is reused unless `force`, so an
interrupted campaign continues where it stopped. A run that fails or does not fit is a
row that says so, never a missing row.
"""
import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from launch import markdown

TOPOLOGIES = ("v5p:2x2x1", "v6e:2x2")
START, END = "<!-- aot-table -->", "<!-- /aot-table -->"


@dataclasses.dataclass(frozen=True)
class Row:
  name: str
  what: str
  args: Tuple[str, ...]  # launch.aot's arguments (no --topology / --json)
  # topology -> arguments that replace the default ones there (a smaller batch where
  # the recipe's does not fit the chip)
  per_topology: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()

  def argv(self, topology: str) -> List[str]:
    args = dict(self.per_topology).get(topology, self.args)
    return ["--topology", topology, *args]


def _step(config, batch=128, seq=512, *extra):
  return ("--config", config, "--global_batch", str(batch), "--seq", str(seq), *extra)


MODERNBERT_LONG = "configs/modernbert.py:base,phase=2,remat=dots_with_no_batch_dims_saveable"

# The recipes at seq 512, global batch 128, no attention flags (what a user gets).
ROWS = (
    Row("bert-base", "BERT-base MLM + NSP", _step("configs/bert.py:base")),
    Row("bert-large", "BERT-large MLM + NSP (scanned layers)", _step("configs/bert.py:large")),
    Row("roberta-base", "RoBERTa-base MLM", _step("configs/roberta.py:base")),
    Row("albert-base", "ALBERT-base MLM + SOP", _step("configs/albert.py:base")),
    Row("electra-base", "ELECTRA-base RTD, generator + discriminator",
        _step("configs/electra.py:base")),
    Row("deberta-v3-base-mlm", "DeBERTa-v3-base MLM", _step("configs/deberta.py:base")),
    Row("deberta-v3-base-rtd", "DeBERTaV3-base RTD + GDES", _step("configs/deberta.py:v3-base")),
    Row("modernbert-base-1024", "ModernBERT-base MLM, seq 1,024",
        _step("configs/modernbert.py:base", 128, 1024)),
    Row("modernbert-base-8192", "ModernBERT-base phase 2, 64 x 8,192",
        _step(MODERNBERT_LONG, 64, 8192),
        per_topology=(("v6e:2x2", _step(MODERNBERT_LONG, 16, 8192)),)),
    Row("distilbert", "DistilBERT distillation step, 12-layer teacher",
        _step("configs/distilbert.py:paper")),
    Row("eurobert-210m", "EuroBERT-210m MLM", _step("configs/eurobert.py:210m")),
    Row("xlm-roberta-base", "XLM-RoBERTa-base MLM", _step("configs/xlm_roberta.py:base")),
    Row("nomicbert-base", "NomicBERT-base MLM", _step("configs/nomicbert.py:base")),
    Row("gte-base", "GTE-base MLM", _step("configs/gte.py:base")),
    Row("mpnet-base", "MPNet-base MLM", _step("configs/mpnet.py:base")),
)


def select(only: Sequence[str] = ()) -> List[Row]:
  names = [r.name for r in ROWS]
  unknown = [n for n in only if n not in names]
  if unknown:
    raise ValueError(f"unknown rows {unknown}; the table has {names}")
  return [r for r in ROWS if not only or r.name in only]


def report_path(out: str, row: Row, topology: str) -> str:
  return os.path.join(out, f"{row.name}__{topology.replace(':', '_')}.json")


def run_one(row: Row, topology: str, out: str, extra: Sequence[str] = (),
            timeout: Optional[float] = None) -> Dict:
  """launch.aot for one (row, topology) in a child process; its report (or what went
  wrong: `error`, with the output's last lines) is written to `report_path` and
  returned."""
  path = report_path(out, row, topology)
  argv = [sys.executable, "-m", "launch.aot", *row.argv(topology), *extra, "--json", path]
  t0 = time.perf_counter()
  try:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    rc, tail = p.returncode, (p.stdout + p.stderr)[-1500:]
  except subprocess.TimeoutExpired:
    rc, tail = None, f"stopped after {timeout:.0f} s"
  wall = time.perf_counter() - t0
  if rc in (0, 1) and os.path.isfile(path):  # 0 fits, 1 does not fit (launch/perf/aot.py)
    with open(path) as f:
      r = json.load(f)
  else:
    r = {"error": f"exit {rc}" if rc is not None else "timeout", "output_tail": tail}
  r.update(row=row.name, topology_asked=topology, wall_s=wall,
           command="python -m launch.aot " + " ".join(row.argv(topology) + list(extra)))
  markdown.write_whole(path, json.dumps(r, indent=1, default=str))
  return r


def campaign(rows: Sequence[Row], topologies: Sequence[str], out: str,
             extra: Sequence[str] = (), force: bool = False,
             timeout: Optional[float] = None, log=print) -> Dict[Tuple[str, str], Dict]:
  """Every (row, topology) report, compiling those not in `out` yet (or all: `force`)."""
  os.makedirs(out, exist_ok=True)
  reports = {}
  for row in rows:
    for topo in topologies:
      path = report_path(out, row, topo)
      if os.path.isfile(path) and not force:
        with open(path) as f:
          reports[row.name, topo] = json.load(f)
        log(f"{row.name} on {topo}: kept {path}")
        continue
      log(f"{row.name} on {topo}: compiling ...")
      r = reports[row.name, topo] = run_one(row, topo, out, extra, timeout)
      log(f"{row.name} on {topo}: {cell(r)} ({r['wall_s']:.0f} s)")
  return reports


def cell(r: Dict) -> str:
  """One report as the table's cells: HBM, step, MFU, compile (or what went wrong)."""
  if "error" in r:
    return f"failed ({r['error']}) | | |"
  gib = r["memory"]["total"] / 2**30 if "memory" in r else None
  if not r.get("fits", False):
    need = f": needs {gib:.1f} GiB" if gib is not None else ""
    return f"does not fit{need} | | |"
  compile_s = sum(s for _, s in r.get("compile_programs", [])) or r.get("compile_s", 0)
  mfu = r.get("estimated_mfu")
  step = r.get("estimated_step_s")
  return (f"{gib:.2f} GiB | {'-' if step is None else f'{step * 1e3:.1f} ms'} | "
          f"{'-' if mfu is None else f'**{100 * mfu:.1f}%**'} | {compile_s:.0f} s")


def render(rows: Sequence[Row], topologies: Sequence[str],
           reports: Dict[Tuple[str, str], Dict], command: str) -> str:
  # the dates the reports were compiled (a kept report keeps its own), not today's
  dates = sorted({str(r["date"])[:10] for r in reports.values() if r.get("date")})
  when = (dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}") if dates else "-"
  lines = [f"Regenerate: `{command}` (compiled {when}; compile = every program "
           "`launch.aot` compiled for the row, on this 2-core machine).", "",
           "| step | topology | HBM per device | estimated step | MFU | compile |",
           "|---|---|---|---|---|---|"]
  missing = []
  for row in rows:
    for topo in topologies:
      r = reports.get((row.name, topo))
      if r is None:
        missing.append(f"{row.name} on {topo}")
        continue
      lines.append(f"| {row.what} | {topo} | {cell(r)} |")
  if missing:
    lines += ["", "Not run yet: " + ", ".join(missing) + "."]
  return "\n".join(lines)


def update(path: str, table: str):
  """Replaces what lies between the START and END markers of `path` with `table`; a file
  without both markers is an error naming them (nothing is written)."""
  markdown.replace_block(path, START, END, table)
