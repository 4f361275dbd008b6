"""What every family shares above the layers: the output pytree, the family registry,
input validation at the boundary, and position ids."""
from typing import Callable, Dict, Optional

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from encoders.layers import attention, kernels, relative, relative_kernel

Array = jax.Array


@flax.struct.dataclass
class EncoderOutput:
  """What `model.apply` returns. Heads a model lacks are None.

  last_hidden_state (B,T,D); pooler_output (B,D); mlm_logits (B,T,V), or (B,M,V) when
  called with masked_positions (B,M); nsp_logits / sop_logits (B,2); rtd_logits (B,T).
  """
  last_hidden_state: Array
  pooler_output: Optional[Array] = None
  mlm_logits: Optional[Array] = None
  nsp_logits: Optional[Array] = None
  sop_logits: Optional[Array] = None
  rtd_logits: Optional[Array] = None


_FAMILIES: Dict[str, Callable] = {}


def register_family(name: str):
  """Class decorator: `encoders.build(config)` dispatches on config.family. A family
  class gives `defaults()` (its model config section) and `forward_flops(cfg, seq_len,
  mlm_positions=None)` as static methods."""
  def wrap(cls):
    _FAMILIES[name] = cls
    return cls
  return wrap


def family(name: str):
  if name not in _FAMILIES:
    raise ValueError(f"unknown model family {name!r}; available: {sorted(_FAMILIES)}")
  return _FAMILIES[name]


def family_defaults(name: str):
  """The model config section of family `name`, with its defaults."""
  return family(name).defaults()


def _family_has(name: str, key: str) -> bool:
  """Whether family `name`'s defaults have `key` (True when that cannot be told: an
  unregistered family, or one without `defaults`)."""
  cls = _FAMILIES.get(name)
  defaults = getattr(cls, "defaults", None)
  return defaults is None or key in defaults()


def forward_flops(model_config, seq_len: int, mlm_positions=None) -> float:
  """Forward FLOPs of ONE sequence of `seq_len` tokens (2 per multiply-add), counted by the
  family: every matmul, full bidirectional attention (local windows and relative terms as
  the family computes them), the MLM head over `mlm_positions` positions (None: all)."""
  return family(model_config.get("family", "bert")).forward_flops(
      model_config, seq_len, mlm_positions)


def resolve_auto(cfg, platform=None, seq_len=None):
  """Fills in the model settings left to "auto" for `platform` (default: JAX's default
  backend), in place: `dtype` is bfloat16 on TPU/GPU and float32 on the CPU;
  `attention_impl` as `resolve_attention` picks it."""
  platform = platform or jax.default_backend()
  resolve_dtype(cfg, platform)
  resolve_attention(cfg, platform, seq_len)
  return cfg


def resolve_dtype(cfg, platform):
  """`dtype: auto` -> bfloat16 on TPU/GPU, float32 on the CPU, in place."""
  if cfg.get("dtype") == "auto":
    cfg.dtype = dtype_for("auto", platform)


def resolve_attention(cfg, platform, seq_len=None) -> str:
  """Sets `attention_impl: auto` to what `layers.choose_impl` picks for `platform` and
  `seq_len` (Splash on TPU when the length allows, cuDNN on GPU, "cpu" on the CPU), in
  place; returns the choice and its reason as one line for the run's log. A family with
  relative attention (DeBERTa) also resolves `relative_impl: auto` (relative.choose_impl:
  the fused Pallas kernel on TPU when the length allows). On TPU without a length (a
  model built before its inputs are known, e.g. by `encoders.from_hf`), an "auto" that
  only the length decides stays "auto": each call then picks for its own length."""
  line = ""
  # attention-probability dropout only where the family has it: a ModernBERT section made
  # from BERT's defaults (fine-tuning's init_from) keeps a 0.1 no layer reads
  dropout = float(cfg.get("attention_probs_dropout_prob", 0.0) or 0.0)
  if dropout and not _family_has(cfg.get("family", "bert"), "attention_probs_dropout_prob"):
    dropout = 0.0
  if cfg.get("relative_impl") == "auto":
    impl, reason = relative.choose_impl(platform, seq_len, dropout)
    if platform == "tpu" and not seq_len and relative.choose_impl(
        platform, relative_kernel.BLOCK, dropout)[0] == "fused":
      line = ("; relative attention: auto, chosen at each call from its sequence length "
              "(TPU, the length is not known when the model is built)")
    else:
      cfg.relative_impl = impl
      line = f"; relative attention: auto -> {impl}: {reason}"
  if cfg.get("attention_impl") != "auto":
    return f"attention: {cfg.get('attention_impl')} (set in the config){line}"
  heads = cfg.get("num_attention_heads")
  args = (dropout, dtype_for(cfg.get("dtype", "auto"), platform),
          cfg.hidden_size // heads if heads else None, cfg.get("family", "bert"),
          bool(cfg.get("relative_attention_num_buckets")))  # a shared score bias
  impl, reason = attention.choose_impl(platform, seq_len, *args)
  if platform == "tpu" and not seq_len and attention.choose_impl(
      platform, min(kernels.SPLASH_BLOCKS), *args)[0] == "splash":
    # only the length is missing (e.g. encoders.from_hf): each call picks for its own
    # length, Splash when it is a multiple of the block (encoders.layers.attention)
    return ("attention: auto, chosen at each call from its sequence length (TPU, the "
            f"length is not known when the model is built){line}")
  cfg.attention_impl = impl
  return f"attention: auto -> {impl}: {reason}{line}"


def dtype_for(dtype: str, platform: str) -> str:
  """The compute dtype a model's `dtype` setting means on `platform` ("auto": bfloat16 on
  TPU/GPU, float32 on the CPU)."""
  if dtype != "auto":
    return dtype
  return "float32" if platform == "cpu" else "bfloat16"


def build(model_config):
  """model_config (ConfigDict, the `model` section) -> an unbound Flax module."""
  cls = family(model_config.get("family", "bert"))
  cfg = ml_collections.ConfigDict(model_config.to_dict() if hasattr(model_config, "to_dict")
                                  else dict(model_config))
  resolve_auto(cfg)
  cfg = ml_collections.FrozenConfigDict(cfg)
  return cls(config=cfg)


def padded_vocab_size(cfg) -> int:
  """Embedding rows: vocab_size rounded up to vocab_pad_multiple (padding never predicted)."""
  m = max(cfg.get("vocab_pad_multiple", 1), 1)
  return -(-cfg.vocab_size // m) * m


def is_concrete(x) -> bool:
  """True for a value (checkable on the host), False for a traced one."""
  return not isinstance(x, jax.core.Tracer)


def _check_range(name: str, x, low: int, high: int, what: str):
  if x is None or not is_concrete(x) or x.size == 0:
    return
  arr = np.asarray(x)
  lo, hi = int(arr.min()), int(arr.max())
  if lo < low or hi >= high:
    bad = lo if lo < low else hi
    raise ValueError(f"{name} contains {bad}, outside [{low}, {high}) ({what})")


def validate_inputs(cfg, input_ids, attention_mask=None, token_type_ids=None,
                    segment_ids=None, position_ids=None, max_length=None,
                    masked_positions=None):
  """Raises ValueError naming the problem; runs before any computation.

  Shapes and dtypes are always checked (also while tracing under jit); value ranges are
  checked whenever the arrays are concrete (eager `apply`, and the trainer checks host
  batches) — JAX would otherwise clamp an out-of-range gather silently. Under jit, where
  values cannot be checked, `bad_rows` flags the same cases and the encoder turns those
  rows' outputs into NaN (`poison`).
  """
  if not hasattr(input_ids, "shape") or not hasattr(input_ids, "dtype"):
    raise ValueError(f"input_ids must be an integer array, got {type(input_ids).__name__}")
  if not jnp.issubdtype(input_ids.dtype, jnp.integer):
    raise ValueError(f"input_ids must have an integer dtype, got {input_ids.dtype}")
  if input_ids.ndim != 2:
    raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
  others = dict(attention_mask=attention_mask, token_type_ids=token_type_ids,
                segment_ids=segment_ids, position_ids=position_ids)
  for name, x in others.items():
    if x is None:
      continue
    if tuple(x.shape) != tuple(input_ids.shape):
      raise ValueError(f"{name} has shape {tuple(x.shape)} but input_ids has "
                       f"{tuple(input_ids.shape)}")
    if not (jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_):
      raise ValueError(f"{name} must be integer or bool, got {x.dtype}")
  length = input_ids.shape[1]
  if max_length is not None and length > max_length:
    raise ValueError(f"sequence length {length} exceeds the model's maximum of {max_length} "
                     "positions")
  _check_range("input_ids", input_ids, 0, cfg.vocab_size, f"vocab_size={cfg.vocab_size}")
  _check_range("attention_mask", attention_mask, 0, 2, "must be 0 or 1")
  if token_type_ids is not None:
    n_types = max(cfg.get("type_vocab_size", 0), 1)
    _check_range("token_type_ids", token_type_ids, 0, n_types, f"type_vocab_size={n_types}")
  if position_ids is not None and max_length is not None:
    _check_range("position_ids", position_ids, 0, max_length, "position table size")
  if masked_positions is not None:
    if masked_positions.ndim != 2 or masked_positions.shape[0] != input_ids.shape[0]:
      raise ValueError(f"masked_positions must be (batch, M), got shape "
                       f"{tuple(masked_positions.shape)} for input_ids "
                       f"{tuple(input_ids.shape)}")
    if not jnp.issubdtype(masked_positions.dtype, jnp.integer):
      raise ValueError(f"masked_positions must be integer, got {masked_positions.dtype}")
    _check_range("masked_positions", masked_positions, 0, length, f"sequence length {length}")


def _all_concrete(*xs) -> bool:
  return all(x is None or is_concrete(x) for x in xs)


def _outside(x, low: int, high: int):
  """(B,) bool: rows of (B,...) integer `x` with a value outside [low, high)."""
  x = jnp.asarray(x)
  if x.dtype == jnp.bool_:  # only ever used as a 0/1 mask
    return jnp.zeros(x.shape[:1], bool)
  out = (x < low) | (x >= high)
  return jnp.any(out.reshape(out.shape[0], -1), axis=1)


def bad_rows(cfg, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
             max_length=None):
  """(B,) bool: the rows holding a value `validate_inputs` refuses (an id outside
  [0, vocab_size), a token type outside the type table, a position outside the position
  table, a mask value other than 0/1); None when every array is concrete (then
  `validate_inputs` has already raised for any of them). Under jit these rows cannot be
  refused, and the gathers would clamp or wrap them into finite numbers: the encoder
  poisons them with NaN instead (`poison`)."""
  if _all_concrete(input_ids, attention_mask, token_type_ids, position_ids):
    return None
  bad = _outside(input_ids, 0, cfg.vocab_size)
  if attention_mask is not None:
    bad = bad | _outside(attention_mask, 0, 2)
  if token_type_ids is not None:
    bad = bad | _outside(token_type_ids, 0, max(cfg.get("type_vocab_size", 0), 1))
  if position_ids is not None and max_length is not None:
    bad = bad | _outside(position_ids, 0, max_length)
  return bad


def poison(x, bad):
  """`x` (B,...) with the rows where `bad` (B,...) is True set to NaN; `x` itself
  (bitwise) where it is False or `bad` is None."""
  if bad is None:
    return x
  bad = bad.reshape(bad.shape + (1,) * (x.ndim - bad.ndim))
  return jnp.where(bad, jnp.asarray(jnp.nan, x.dtype), x)


def positions_in_segments(segment_ids: Array) -> Array:
  """(B,T) segment ids -> (B,T) positions restarting at 0 where the segment id changes."""
  t = segment_ids.shape[1]
  idx = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), segment_ids.shape)
  starts = jnp.concatenate(
      [jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], 1)
  return idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)
