"""Exact FLOP counts of the encoders (2 FLOPs per multiply-add), used for MFU.

Counted, per sequence of length T for a BERT-style model with hidden D, L layers, H heads,
MLP width F, vocabulary V:
  per layer: q,k,v,out projections 4 * 2*T*D*D; scores Q K^T 2*T*T*D and probs @ V
  2*T*T*D (full bidirectional T x T attention, no causal halving); MLP 2*T*D*F*(2, or 3
  when gated: two input maps plus the output map).
  embeddings' factorized projection (E != D) 2*T*E*D when present.
  pooler 2*D*D (+ NSP 2*D*2) once per sequence.
  MLM head over the P positions it is computed on: transform 2*P*D*D + decoder 2*P*D*V.
Backward = 2 x forward (grads w.r.t. activations and weights), so a train step is 3x.
Element-wise work (softmax, norms, GELU) is not counted, as usual for MFU.
"""


def encoder_forward_flops(cfg, seq_len: int, mlm_positions: float = None) -> float:
  """Forward FLOPs of one sequence. `mlm_positions`: positions the MLM head runs on
  (defaults to all seq_len when the model has an MLM head)."""
  t, d, l, f = seq_len, cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
  gated = cfg.get("mlp_gated", False)
  per_layer = 4 * 2 * t * d * d + 2 * 2 * t * t * d + 2 * t * d * f * (3 if gated else 2)
  total = l * per_layer
  e = cfg.get("embedding_size", 0) or d
  if e != d:
    total += 2 * t * e * d
  heads = set(cfg.heads)
  if heads & {"pooler", "nsp", "sop"}:
    total += 2 * d * d + (2 * d * 2 if heads & {"nsp", "sop"} else 0)
  if "mlm" in heads:
    p = t if mlm_positions is None else mlm_positions
    total += p * (2 * d * e + 2 * e * cfg.vocab_size)
  return float(total)


def train_step_flops(cfg, seq_len: int, batch: int, mlm_positions: float = None) -> float:
  return 3.0 * batch * encoder_forward_flops(cfg, seq_len, mlm_positions)


# Published dense bf16 peak FLOP/s per chip (TPU: per chip; GPU: dense, no sparsity).
PEAK_BF16 = {
    "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12,
    "TPU v5": 459e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12,
    "NVIDIA A100": 312e12, "NVIDIA H100": 989e12, "NVIDIA H200": 989e12,
    "NVIDIA B200": 2250e12,
}

_CPU_PEAK = {}


def measure_cpu_matmul_flops(n: int = 1024, dtype="float32", repeats: int = 5) -> float:
  """Measured dense-matmul FLOP/s of this CPU (best of `repeats`), the CPU's "peak"."""
  import time
  import jax
  import jax.numpy as jnp
  key = (n, dtype)
  if key not in _CPU_PEAK:
    a = jnp.ones((n, n), dtype)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
      t = time.perf_counter()
      f(a).block_until_ready()
      best = min(best, time.perf_counter() - t)
    _CPU_PEAK[key] = 2 * n ** 3 / best
  return _CPU_PEAK[key]


def peak_flops(device, dtype: str = "float32") -> float:
  """Peak FLOP/s of one device: the published bf16 peak for TPU/GPU, measured on CPU."""
  if device.platform == "cpu":
    return measure_cpu_matmul_flops(dtype="float32")
  kind = getattr(device, "device_kind", "")
  for name, value in sorted(PEAK_BF16.items(), key=lambda kv: -len(kv[0])):
    if kind.startswith(name) or name in kind:
      return value
  return 0.0
