"""Where a compiled TPU step's time goes, op by op, by the TPU compiler's own estimates.

`compiled.cost_analysis()["optimal_seconds"]` (what `launch.aot` prices a step with) is one
number for the whole program. The TPU compiler also writes a per-instruction cycle
estimate into each top-level instruction's backend config (`"estimated_cycles"`), the one
its scheduler uses. This module reads those from a compiled module's HLO text (the entry
computation: fusions, copies, collectives; the ops fused inside an instruction are
counted in it) and groups them by the JAX source op that produced each instruction
(`metadata={op_name=...}`), with layer indices folded (`layer_3` -> `layer_*`) and the
autodiff wrappers named (`jvp(Bert)/...` -> `fwd Bert/...`, `transpose(jvp(Bert))/...` ->
`bwd Bert/...`), so that the twelve copies of one layer's op show as one line.

The two models differ: summed cycles over the clock are not `optimal_seconds` (on
BERT-base's v5p step the cycles come to ~1.3x more, and hidden dropout's Threefry mask is
~15% of the cycles but ~1% of `optimal_seconds`). So the breakdown gives each group's
share of the summed cycles, to say what dominates and what a change moved, and is not a
second step time. Ops inside a while loop's body (scan, accumulation) are not in the
entry computation and are not counted; `launch.aot` prices such steps on an unrolled
twin, so the program it breaks down has none.
"""
import collections
import re
from typing import Any, Dict, List

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*.*?\s([a-z][\w\-]*)\(")
_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def entry_computation(hlo: str) -> str:
  """The text of a module's ENTRY computation ('' if it has none)."""
  m = re.search(r"^ENTRY .*?$", hlo, re.M)
  if not m:
    return ""
  end = re.search(r"^\}", hlo[m.end():], re.M)
  return hlo[m.start(): m.end() + (end.start() if end else len(hlo))]


def _wrapped(s: str, prefix: str):
  """(inside, rest) when `s` is `prefix(inside)/rest` with balanced parentheses, else None."""
  if not s.startswith(prefix + "("):
    return None
  depth = 0
  for i in range(len(prefix), len(s)):
    depth += {"(": 1, ")": -1}.get(s[i], 0)
    if depth == 0:
      return (s[len(prefix) + 1:i], s[i + 2:]) if s[i + 1:i + 2] == "/" else None
  return None


def source_group(op_name: str) -> str:
  """A JAX op_name folded into its group: without the program's own jit wrapper, layer
  indices as `*`, the autodiff wrappers (nested parentheses allowed) as fwd/bwd."""
  s = re.sub(r"^jit\([^()]*\)/", "", op_name)
  s = re.sub(r"(layer|layers)_\d+", r"\1_*", s)
  for prefix, label in (("transpose", "bwd"), ("jvp", "fwd")):
    w = _wrapped(s, prefix)
    if w is not None:
      inside, rest = w
      if prefix == "transpose":
        inner = _wrapped(inside + "/", "jvp")
        inside = inner[0] if inner is not None else inside
      return f"{label} {inside + '/' if inside else ''}{rest}"
  return s


def breakdown(hlo: str) -> Dict[str, Any]:
  """{"total_cycles", "instructions" (with an estimate), "groups": [{"group", "opcode",
  "count", "cycles", "share"}] largest first} of a compiled TPU module's text. Empty
  groups (total 0) when the compiler wrote no per-op estimates."""
  groups: Dict[tuple, List[int]] = collections.defaultdict(lambda: [0, 0])
  n = 0
  for line in entry_computation(hlo).splitlines()[1:]:
    m, c = _INSTR.match(line), _CYCLES.search(line)
    if not m or not c:
      continue
    n += 1
    name = _OP_NAME.search(line)
    key = (source_group(name.group(1)) if name else "(no source op)", m.group(2))
    groups[key][0] += int(c.group(1))
    groups[key][1] += 1
  total = sum(g[0] for g in groups.values())
  rows = [{"group": k[0], "opcode": k[1], "count": cnt, "cycles": cyc,
           "share": cyc / total if total else 0.0}
          for k, (cyc, cnt) in groups.items()]
  rows.sort(key=lambda r: (-r["cycles"], r["group"]))
  return {"total_cycles": total, "instructions": n, "groups": rows}


def format_breakdown(b: Dict[str, Any], top: int) -> List[str]:
  if not b["total_cycles"]:
    return ["  (no per-op cycle estimates in the compiled program)"]
  lines = [f"where the time goes (XLA's per-op cycle estimates, {b['instructions']} "
           f"instructions; share of their sum, a different model from the step time "
           f"above):"]
  for r in b["groups"][:top]:
    lines.append(f"  {100 * r['share']:5.1f}%  x{r['count']:<4} {r['opcode']:<12} "
                 f"{r['group']}")
  rest = b["groups"][top:]
  if rest:
    lines.append(f"  {100 * sum(r['share'] for r in rest):5.1f}%  {len(rest)} more groups")
  return lines
