"""Attention masks, and `AttentionInputs`: everything a layer's attention needs besides
its input, carried through blocks, remat and scan as one struct."""
from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp

Array = jax.Array


def make_attention_mask(attention_mask: Array, segment_ids: Optional[Array] = None,
                        local_window: Optional[int] = None) -> Array:
  """(B,T) padding mask [+ (B,T) segment ids] -> (B,1,T,T) bool, True = may attend.

  Padding keys are never attended. With segment ids (packed rows), a real query attends
  only keys of its own segment. With a local window w, |i - j| <= w // 2. Padding queries
  attend every real key, as in transformers (so even logits at padding match it); a query
  left with no key at all attends itself, so no softmax row is empty.
  """
  valid = attention_mask.astype(bool)
  mask = jnp.broadcast_to(valid[:, None, None, :], valid.shape[:1] + (1,) + valid.shape[1:] * 2)
  if segment_ids is not None:
    same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    mask = mask & (same | ~valid[:, None, :, None])
  if local_window:
    t = attention_mask.shape[-1]
    idx = jnp.arange(t)
    mask &= (jnp.abs(idx[:, None] - idx[None, :]) <= local_window // 2)[None, None]
  empty = ~mask.any(-1, keepdims=True)
  return mask | (empty & jnp.eye(attention_mask.shape[-1], dtype=bool)[None, None])


@flax.struct.dataclass
class SegmentMask:
  """The attention mask as (B,T) int segment ids: a query attends the keys of its own
  segment; 0 marks padding. The splash path consumes this form directly (the kernel skips
  whole blocks across documents and never builds a (T,T) mask); the dense paths expand it
  with `dense()`. Passed wherever a (B,1,T,T) bool mask may be. `local_window` (static)
  further limits a query to keys with |i - j| <= local_window // 2 (ModernBERT's local
  layers; splash then skips the blocks outside the band)."""
  segment_ids: Array
  local_window: Optional[int] = flax.struct.field(pytree_node=False, default=None)

  def dense(self) -> Array:
    seg = self.segment_ids
    return make_attention_mask((seg > 0).astype(jnp.int32), seg, self.local_window)


def segment_mask(attention_mask: Array, segment_ids: Optional[Array] = None) -> SegmentMask:
  """(B,T) padding mask [+ (B,T) segment ids of packed rows] -> SegmentMask."""
  valid = attention_mask.astype(jnp.int32) > 0
  seg = valid.astype(jnp.int32) if segment_ids is None else jnp.where(valid, segment_ids, 0)
  return SegmentMask(seg.astype(jnp.int32))


@flax.struct.dataclass
class AttentionInputs:
  """What a layer's attention needs besides its input x (B,T,D), by name. One struct
  travels unchanged through the stack (remat, scan, shared layers); each attention module
  takes the fields it uses, and the families fill the fields they need:

  masks by kind — `mask`: the global mask, (B,1|H,T,T) bool or a `SegmentMask` (padding
    and packed-document segments); `local_mask`: the same with a sliding window
    (ModernBERT's local layers). An attention module picks one by its `mask_kind`.
  `positions` (B,T) int: position ids (rotary attention rotates q/k at these).
  `rotary`: per-kind rotary tables the family precomputes (e.g. {"global": (cos, sin)}).
  `rel_embeddings` (R,D) and `rel_positions` (T,T) or (B,T,T): relative-position terms
    (DeBERTa's disentangled attention).
  `query` (B,T,D): a query stream other than x, keys and values still from x (DeBERTa's
    enhanced mask decoder).
  `bias` (B|1,H|1,T,T): an additive score term.
  `extra`: a dict for anything else a family needs to carry.
  """
  mask: Any
  local_mask: Any = None
  positions: Optional[Array] = None
  rotary: Any = None
  rel_embeddings: Optional[Array] = None
  rel_positions: Optional[Array] = None
  query: Optional[Array] = None
  bias: Optional[Array] = None
  extra: Any = None

  def mask_of(self, kind: str):
    mask = {"global": self.mask, "local": self.local_mask}.get(kind, "?")
    if mask is None or (isinstance(mask, str)):
      raise ValueError(f"attention needs the {kind!r} mask, which these inputs lack")
    return mask
