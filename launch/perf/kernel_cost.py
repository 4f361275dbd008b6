"""A roofline price for the custom calls XLA's TPU cost model cannot see into.

XLA prices a compiled program op by op; a Pallas kernel (Splash attention) reaches it as
an opaque `tpu_custom_call`, counted at zero FLOPs and zero time. `launch.aot` adds the
price computed here to XLA's estimate, and reports the two parts separately.

The price of one call: max(FLOPs / peak, bytes / HBM bandwidth) / efficiency.
- FLOPs: from the operand shapes and what the kernel is (by its name in the HLO): Splash
  forward = 2 matmuls (QK^T, P V); the dq kernel = 3 (QK^T recomputed, dO V^T, dS K); the
  dkv kernel = 4 (QK^T, dO V^T, dV = P^T dO, dK = dS^T Q), 5 when it also produces dq
  (the fused backward). Each matmul is 2 * (query rows) * Tk * K. The whole T x T square
  is counted: for a banded (local) mask Splash skips blocks, so this is an upper bound.
- bytes: every operand read once and every result written once, the least traffic the
  kernel can have (Splash reads K/V once per query block: with T <= block_q that is once).
- peak and HBM bandwidth: the chip's published bf16 peak (launch/trainer/devices.py) and HBM
  bandwidth (Cloud TPU system architecture pages: v4 1200 GB/s, v5e 819 GB/s, v5p
  2765 GB/s, v6e 1640 GB/s per chip).
- efficiency: the fraction of that roofline a flash-attention kernel reaches. We found no
  published per-generation utilisation figure for Splash itself; the factor is the low
  end of FlashAttention-2's reported range (Dao 2023, "FlashAttention-2: Faster Attention
  with Better Parallelism and Work Partitioning", arXiv:2307.08691: 50-73% of the
  theoretical maximum FLOPs/s on A100, forward and backward), used for every TPU
  generation until a TPU measurement replaces it. It is a stated assumption, printed with
  every estimate and overridable (`--kernel_efficiency`).
DeBERTa's fused relative attention (encoders/layers/relative_kernel.py; names
`deberta_rel_{fwd,bwd}__<terms>`): C x C x K matmul units per tile from
`relative_kernel.matmul_units` (forward 2 + 2 per term; the one fused backward 5 + 6 per
term plus 128 / K per term for its column-reversal permutation), the terms read from the
name; each unit over the whole T x T square is 2 * (query rows) * Tk * K FLOPs as above.
The kernel skips tiles in which no query may see any key (packed documents, padding), so
its work depends on the data; the price is the dense case, an upper bound for packed rows.
Custom calls that are not known kernels are listed as unpriced (the estimate is then a
lower bound), never silently dropped.
"""
import math
import re
from typing import Any, Dict, List, Optional, Tuple

from encoders.layers import relative_kernel
from launch.trainer import devices as devices_lib

DEFAULT_EFFICIENCY = 0.5
EFFICIENCY_SOURCE = ("FlashAttention-2's low end, 50% of peak (Dao 2023, arXiv:2307.08691); "
                     "no published per-generation Splash figure")
HBM_BYTES_PER_S = {  # per chip
    "TPU v4": 1200e9, "TPU v5 lite": 819e9, "TPU v5e": 819e9, "TPU v5p": 2765e9,
    "TPU v5": 2765e9, "TPU v6 lite": 1640e9, "TPU v6e": 1640e9,
}
_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "s32": 4, "u32": 4, "s8": 1, "u8": 1,
          "pred": 1, "s16": 2, "u16": 2, "s64": 8, "u64": 8, "f8e4m3fn": 1, "f8e5m2": 1}
_SHAPE = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_CALL = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+custom-call\((.*)$")


def hbm_bandwidth(device_kind: str) -> Optional[float]:
  return devices_lib.lookup(HBM_BYTES_PER_S, device_kind)


def _shapes(text: str) -> List[Tuple[str, Tuple[int, ...]]]:
  out = []
  for dtype, dims in _SHAPE.findall(text):
    if dtype in _BYTES:
      out.append((dtype, tuple(int(d) for d in dims.split(",") if d)))
  return out


def _nbytes(shapes) -> int:
  return sum(_BYTES[d] * math.prod(s) for d, s in shapes)


def custom_calls(hlo: str) -> List[Dict[str, Any]]:
  """The TPU custom calls of an HLO module's text: name, target, operand and result
  (dtype, shape) lists (operands from `operand_layout_constraints`)."""
  calls = []
  for line in hlo.splitlines():
    m = _CALL.match(line)
    if not m:
      continue
    name, result_text, rest = m.groups()
    target = re.search(r'custom_call_target="([^"]+)"', rest)
    ops = re.search(r"operand_layout_constraints=\{(.*?)\}(?:,\s*\w+=|$)", rest)
    calls.append({"name": name, "target": target.group(1) if target else "",
                  "results": _shapes(result_text),
                  "operands": _shapes(ops.group(1)) if ops else []})
  return calls


def _matmuls(name: str, q, results, has_dq_kernel: bool) -> Optional[float]:
  n = name.lower()
  if "deberta_rel_" in n:
    for kernel in relative_kernel.KERNEL_NAMES:
      if kernel in n:
        return relative_kernel.matmul_units(kernel, "c2p" in n, "p2c" in n, q[-1])
    return None
  if "splash" not in n and "flash" not in n:
    return None
  if "fwd" in n:
    return 2
  if "dkv" in n:
    fused = any(len(s) == len(q) + 1 for _, s in results) or not has_dq_kernel
    return 5 if fused else 4
  if "dq" in n:
    return 3
  return None


def kernel_flops(call: Dict[str, Any], has_dq_kernel: bool = False) -> Optional[float]:
  """FLOPs of one attention kernel call (None: not a kernel this module knows)."""
  floats = [s for d, s in call["operands"] if d in ("bf16", "f16", "f32") and len(s) >= 3]
  if len(floats) < 2:
    return None
  q, k = floats[0], floats[1]
  mm = _matmuls(call["name"], q, call["results"], has_dq_kernel)
  if mm is None:
    return None
  return float(mm * 2 * math.prod(q[:-1]) * k[-2] * q[-1])


def price(hlo: str, peak_flops: float, hbm_bytes_per_s: float,
          efficiency: float = DEFAULT_EFFICIENCY) -> Dict[str, Any]:
  """Roofline price of the custom calls in `hlo` (a per-device program) on a device with
  `peak_flops` and `hbm_bytes_per_s`: {"seconds", "flops", "bytes", "kernels": per-name
  totals, "unpriced": names of custom calls it cannot price, "efficiency"}."""
  if not 0 < efficiency <= 1:
    raise ValueError(f"kernel efficiency must be in (0, 1], got {efficiency}")
  calls = [c for c in custom_calls(hlo) if c["target"] == "tpu_custom_call"]
  has_dq = any("dq" in c["name"].lower() and "dkv" not in c["name"].lower()
               and "deberta_rel_" not in c["name"].lower() for c in calls)
  total = {"seconds": 0.0, "flops": 0.0, "bytes": 0, "kernels": {}, "unpriced": [],
           "efficiency": efficiency, "calls": 0}
  for c in calls:
    flops = kernel_flops(c, has_dq)
    if flops is None:
      total["unpriced"].append(c["name"])
      continue
    nbytes = _nbytes(c["operands"]) + _nbytes(c["results"])
    t_compute, t_memory = flops / peak_flops, nbytes / hbm_bytes_per_s
    seconds = max(t_compute, t_memory) / efficiency
    kind = re.sub(r"\.\d+$", "", c["name"])
    k = total["kernels"].setdefault(kind, {"calls": 0, "flops": 0.0, "bytes": 0,
                                           "seconds": 0.0, "bound": ""})
    k["calls"] += 1
    k["flops"] += flops
    k["bytes"] += nbytes
    k["seconds"] += seconds
    k["bound"] = "compute" if t_compute >= t_memory else "memory"
    total["seconds"] += seconds
    total["flops"] += flops
    total["bytes"] += nbytes
    total["calls"] += 1
  return total
