"""Exact FLOP counts of the encoders (2 FLOPs per multiply-add), used for MFU.

Counted, per sequence of length T for a BERT-style model (BERT, RoBERTa) with hidden D,
L layers, H heads, MLP width F, vocabulary V:
  per layer: q,k,v,out projections 4 * 2*T*D*D; scores Q K^T 2*T*T*D and probs @ V
  2*T*T*D (full bidirectional T x T attention, no causal halving, and no discount for the
  blocks a packed row's segment mask lets a kernel skip); MLP 2*T*D*F*(2, or 3 when gated:
  two input maps plus the output map).
  embeddings' factorized projection (E != D) 2*T*E*D when present.
  pooler 2*D*D (+ NSP 2*D*2) once per sequence.
  MLM head over the P positions it is computed on: transform 2*P*D*E + decoder 2*P*E*V.
  P = T for a plain forward pass (and for transformers, which always decodes every
  position); P = objective.max_predictions when the head runs on gathered masked positions.
  V is the real vocabulary: rows added by vocab_pad_multiple are computed but not counted
  (they are not model work), so padding can only lower the reported MFU.
Backward = 2 x forward (grads w.r.t. activations and weights), so a train step is 3x.
Recomputation under remat is not counted (this is MFU, not hardware FLOP utilisation).
Element-wise work (softmax, norms, GELU, embedding gathers, the optimizer) is not
counted, as usual for MFU.

Peak: a TPU/GPU chip's published dense bf16 FLOP/s (table below); on the CPU the
measured FLOP/s of a large dense matmul in the compute dtype (`measure_cpu_matmul_flops`).
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


def measure_cpu_matmul_flops(sizes=(1024, 2048), dtype="float32", repeats: int = 5) -> float:
  """Measured dense-matmul FLOP/s of this CPU: the best over square matmuls of `sizes`
  (jitted, all cores, `repeats` timings each) — the CPU's "peak". Cached per process."""
  import time
  import jax
  import jax.numpy as jnp
  if isinstance(sizes, int):
    sizes = (sizes,)
  key = (tuple(sizes), str(dtype))
  if key not in _CPU_PEAK:
    best_rate = 0.0
    f = jax.jit(lambda x, y: x @ y)
    for n in sizes:
      a = jnp.ones((n, n), dtype)
      b = jnp.full((n, n), 0.5, dtype)
      f(a, b).block_until_ready()
      for _ in range(repeats):
        t = time.perf_counter()
        f(a, b).block_until_ready()
        best_rate = max(best_rate, 2 * n ** 3 / (time.perf_counter() - t))
    _CPU_PEAK[key] = best_rate
  return _CPU_PEAK[key]


def chip_peak_flops(device_kind: str) -> float:
  """Published dense bf16 peak of a TPU/GPU chip by `device_kind`; 0.0 when unknown."""
  for name, value in sorted(PEAK_BF16.items(), key=lambda kv: -len(kv[0])):
    if device_kind.startswith(name) or name in device_kind:
      return value
  return 0.0


def peak_flops(device, dtype: str = "float32") -> float:
  """Peak FLOP/s of one device: the published bf16 peak for TPU/GPU, measured on CPU (in
  the compute dtype)."""
  if device.platform == "cpu":
    return measure_cpu_matmul_flops(dtype=dtype)
  return chip_peak_flops(getattr(device, "device_kind", ""))
