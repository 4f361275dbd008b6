"""Multi-head self-attention over the shared kernels, reading its per-layer inputs from an
`AttentionInputs` struct."""
import functools
import logging
from typing import Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoders.layers import kernels
from encoders.layers.core import Dense, Dtype, constrain
from encoders.layers.dropout import Dropout
from encoders.layers.masks import AttentionInputs, SegmentMask

Array = jax.Array
IMPLS = ("xla", "cudnn", "einsum", "cpu", "splash")

# Families whose attention a fast kernel cannot run, and why (`choose_impl`).
_DEBERTA_NOTE = ("DeBERTa's relative position terms are an additive score bias, which Splash "
                 "does not take")
SPLASH_UNSUPPORTED = {"deberta-v2": _DEBERTA_NOTE, "deberta": _DEBERTA_NOTE,
                      "mpnet": "MPNet's relative position bias is an additive score bias, "
                               "which Splash does not take"}
CUDNN_UNSUPPORTED = {"modernbert": "cuDNN has no bidirectional local window (ModernBERT's "
                                   "local layers)"}


def choose_impl(platform: str, seq_len: Optional[int] = None, dropout_rate: float = 0.0,
                dtype: str = "bfloat16", head_dim: Optional[int] = None,
                family: str = "bert", score_bias: bool = False) -> Tuple[str, str]:
  """What `attention_impl: auto` runs on `platform`, and why: (impl, reason).

  cpu: "cpu" (the reference's math laid out for XLA's CPU backend).
  tpu: "splash" (the Pallas kernel) when the sequence length is known and a multiple of
    its smallest block (128) and nothing asks for what it lacks (attention-probability
    dropout, a score bias); otherwise "xla" (jax.nn.dot_product_attention), the reason
    naming what stood in the way. Dropout > 0 is reported, never silently obeyed by
    leaving the kernel: the reason says that training then materialises the
    probabilities (the einsum path) and how to get Splash back.
  gpu/cuda/rocm: "cudnn" (jax.nn.dot_product_attention's cuDNN flash attention, the
    padding/segment mask passed as its mask) for bfloat16/float16 with head dim <= 128
    and a multiple of 8, else "xla".
  """
  platform = {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)
  if platform == "cpu":
    return "cpu", "CPU: the reference's math laid out for XLA's CPU backend"
  drop_note = (f"attention_probs_dropout_prob={dropout_rate:g} > 0 needs the attention "
               "probabilities, so training takes the einsum path (eval keeps the kernel); "
               "set attention_probs_dropout_prob=0 for the fast kernel")
  if platform == "tpu":
    block = min(kernels.SPLASH_BLOCKS)
    if family in SPLASH_UNSUPPORTED:
      return "xla", f"TPU: not Splash: {SPLASH_UNSUPPORTED[family]}"
    if score_bias:
      return "xla", "TPU: not Splash: it takes no additive score bias"
    if dropout_rate > 0:
      return "xla", f"TPU: not Splash: {drop_note}"
    if not seq_len:
      return "xla", "TPU: not Splash: the sequence length is not known when the model is built"
    if seq_len % block:
      return "xla", (f"TPU: not Splash: sequence length {seq_len} is not a multiple of its "
                     f"block size {block}")
    return "splash", (f"TPU: Splash (Pallas) kernel, sequence length {seq_len} a multiple "
                      f"of its block size {block}")
  if platform == "gpu":
    note = f" ({drop_note})" if dropout_rate > 0 else ""
    if family in CUDNN_UNSUPPORTED:
      return "xla", f"GPU: not cuDNN: {CUDNN_UNSUPPORTED[family]}{note}"
    if dtype not in ("bfloat16", "float16"):
      return "xla", f"GPU: not cuDNN: it needs bfloat16/float16, the model runs {dtype}{note}"
    if head_dim is not None and (head_dim > 128 or head_dim % 8):
      return "xla", f"GPU: not cuDNN: head dim {head_dim} (it takes <= 128, a multiple of 8)"
    return "cudnn", f"GPU: cuDNN flash attention (jax.nn.dot_product_attention){note}"
  return "xla", f"{platform}: jax.nn.dot_product_attention"


_LOGGED = set()


def concrete_length(seq_len) -> Optional[int]:
  """The traced length as an int; None for a symbolic one (jax.export's dynamic length),
  which no kernel choice can depend on."""
  try:
    return int(seq_len)
  except Exception:  # noqa: BLE001 - jax's symbolic dimensions raise their own error type
    return None


def log_call_choice(what: str, seq_len, choice: str, reason: str) -> None:
  """Logs a choice made while tracing (once per what, choice and length)."""
  if (what, choice, seq_len) not in _LOGGED:
    _LOGGED.add((what, choice, seq_len))
    logging.getLogger("encoder_zoo").info("%s: auto at sequence length %s -> %s: %s", what,
                                          seq_len, choice, reason)


def call_time_impl(impl: str, seq_len: int, dropout_rate: float, dtype, head_dim: int,
                   score_bias: bool = False) -> str:
  """`impl`; "auto" is still there when the model was built for TPU without knowing the
  sequence length (`encoders.base.resolve_attention`, e.g. `encoders.from_hf`): then it
  is `choose_impl`'s pick for this call's length on the backend that runs it, logged."""
  if impl != "auto":
    return impl
  seq_len = concrete_length(seq_len)
  choice, reason = choose_impl(jax.default_backend(), seq_len, dropout_rate,
                               jnp.dtype(dtype).name, head_dim, score_bias=score_bias)
  log_call_choice("attention", seq_len, choice, reason)
  return choice


class MultiHeadAttention(nn.Module):
  """x (B,T,D), inputs: AttentionInputs -> (B,T,D).

  Reads from `inputs`: the mask of kind `mask_kind` ("global" or "local"), `positions`
  (rotary q/k when `rope_theta` is set), `bias` (an additive score term), and `query` (a
  separate query stream; keys and values stay from x). `scale` overrides 1/sqrt(K).
  impl: "xla"/"cudnn" (jax.nn.dot_product_attention), "einsum" (the reference every path
  is tested against), "cpu" (`kernels.attention_head_major`, the reference's math laid
  out for XLA's CPU backend), "splash" (the Pallas TPU kernel; the mask must be a
  `SegmentMask`). Attention-probability dropout in training needs the probabilities:
  "cpu" applies it itself, "xla"/"cudnn" then take the einsum path, and splash refuses it
  (set attention_probs_dropout_prob=0). A `SegmentMask` with a `local_window` reaches
  splash as a banded mask and "xla"/"cudnn" as `local_window_size` (with the dense mask).
  `key_bias=False` drops the key projection's bias alone (DeBERTa v1 has query and value
  biases only). `num_kv_heads` G < H (grouped-query attention; None: H): the key and value
  projections have G heads, query head h reads K/V head h // (H / G) (transformers'
  repeat_kv order), and every kernel takes the G-head K/V as they are (no repeat).
  """
  num_heads: int
  head_dim: int
  hidden_size: int
  use_bias: bool = True
  dropout_rate: float = 0.0
  rope_theta: Optional[float] = None
  mask_kind: str = "global"
  scale: Optional[float] = None
  impl: str = "xla"
  init_std: float = 0.02
  dtype: Dtype = jnp.float32
  key_bias: bool = True
  num_kv_heads: Optional[int] = None

  def setup(self):
    kv_heads = self.num_kv_heads or self.num_heads
    if self.num_heads % kv_heads:
      raise ValueError(f"num_attention_heads={self.num_heads} is not a multiple of "
                       f"num_key_value_heads={kv_heads}")
    proj = functools.partial(Dense, kernel_axes=("embed", "heads", "kv"),
                             use_bias=self.use_bias, init_std=self.init_std, dtype=self.dtype)
    kv = (kv_heads, self.head_dim)
    self.query = proj((self.num_heads, self.head_dim), name="query")
    self.value = proj(kv, name="value")
    self.key = proj(kv, name="key", use_bias=self.use_bias and self.key_bias)
    self.out = Dense((self.hidden_size,), ("heads", "kv", "embed"), use_bias=self.use_bias,
                     init_std=self.init_std, dtype=self.dtype)
    self.attn_dropout = Dropout(self.dropout_rate)

  def project(self, x: Array, query: Optional[Array] = None):
    """(B,T,D) -> q (B,T,H,K), k, v (B,T,G,K); q from `query` when given."""
    axes = ("act_batch", "act_len", "act_heads", "act_kv")
    q_in = x if query is None else query
    return tuple(constrain(p(y), axes) for p, y in
                 ((self.query, q_in), (self.key, x), (self.value, x)))

  def __call__(self, x, inputs: AttentionInputs, deterministic: bool = True):
    q, k, v = self.project(x, inputs.query)
    if self.rope_theta is not None:
      q = kernels.rotary(q, inputs.positions, self.rope_theta)
      k = kernels.rotary(k, inputs.positions, self.rope_theta)
    ctx = self.attend(q, k, v, inputs.mask_of(self.mask_kind), inputs.bias, deterministic)
    return self.out(ctx)

  def attend(self, q, k, v, mask, bias=None, deterministic=True, scale=None):
    """q (B,T,H,K), k, v (B,T,G,K) -> context (B,T,H,K) on the configured kernel; `scale`
    overrides the module's."""
    scale = self.scale if scale is None else scale
    use_dropout = not deterministic and self.dropout_rate > 0.0
    impl = call_time_impl(self.impl, q.shape[1], self.dropout_rate if use_dropout else 0.0,
                          self.dtype, q.shape[-1], score_bias=bias is not None)
    if impl == "splash":
      if use_dropout:
        raise ValueError("attention_impl='splash' has no attention-probability dropout; set "
                         "attention_probs_dropout_prob=0 (or use attention_impl='xla')")
      if bias is not None:
        raise ValueError("attention_impl='splash' takes no additive score bias")
      if not isinstance(mask, SegmentMask):
        raise ValueError("attention_impl='splash' needs the mask as a layers.SegmentMask "
                         "(segment ids), not a dense (T,T) mask")
      ctx = kernels.splash_attention(q, k, v, mask.segment_ids, scale,
                                     local_window=mask.local_window)
    else:
      window = mask.local_window if isinstance(mask, SegmentMask) else None
      if isinstance(mask, SegmentMask):
        mask = mask.dense()
      dropout_fn = ((lambda p: self.attn_dropout(p, deterministic=False)) if use_dropout
                    else None)
      if impl == "cpu":
        ctx = kernels.attention_head_major(q, k, v, mask, bias, scale, dropout_fn)
      elif impl == "einsum" or use_dropout or (bias is not None and scale is not None):
        ctx = kernels.attention_scores_einsum(q, k, v, mask, bias, scale, dropout_fn)
      elif impl in ("xla", "cudnn"):
        ctx = jax.nn.dot_product_attention(
            q, k, v, bias=None if bias is None else bias.astype(q.dtype), mask=mask,
            scale=scale, implementation=impl,
            local_window_size=(window // 2, window // 2) if window else None)
      else:
        raise ValueError(f"unknown attention impl {impl!r}; use one of {IMPLS}")
    return constrain(ctx, ("act_batch", "act_len", "act_heads", "act_kv"))
