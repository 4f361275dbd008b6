"""Relative-position attention terms (DeBERTa's disentangled attention, He et al. 2021).

For queries i and keys j the score adds, to the content term q_i . k_j, a content-to-
position term (c2p) q_i . Pk[r(i, j)] and a position-to-content term (p2c) k_j . Pq[r(i, j)],
where Pk, Pq are projections of a small table of relative embeddings (2S rows, S the
attention span: `position_buckets`, or `max_relative_positions` without buckets) and
r(i, j) = clip(bucket(i - j) + S, 0, 2S - 1) depends on i - j only.

Two formulations of the (B,H,T,T) term, tested against each other:
- "gather" (the reference, transformers' math): q . Pk over all 2S rows -> (B,H,T,2S),
  then a gather by r(i, j) -> (B,H,T,T). The gather of (B,H,T,T) elements out of a
  (B,H,T,2S) tensor is what makes DeBERTa slow on TPU.
- "shift" (the default): the table is first expanded to one row per distance
  d = i - j in [-(T-1), T-1] (a gather of 2T-1 rows from a (2S,H,K) table: tiny), then
  q . P[d] for every distance is one matmul -> (B,H,T,2T-1), and the "relative shift"
  (pad, reshape, slice; Transformer-XL's skew) turns row i's distances into its T keys.
  No large gather: the expensive work is a matmul the MXU runs, and the rest is a copy.
- "headmajor": the shift formulation inside an attention computed head-major
  end to end (`headmajor_attention`): q, k, v go to (H,B,T,K) once (small), and every
  (.., T, T)-sized tensor (content scores, the relative products and their shift, the
  probabilities) is produced in the order the batched matmuls emit it (batch dim H
  first), so no (B,H,T,T)-sized transpose is needed except p2c's [j, i] -> [i, j].
- "fused" (TPU): the whole attention in one Pallas kernel that computes the c2p/p2c tiles
  next to the content scores inside a flash-attention loop (`relative_kernel.py`), so no
  (B,H,T,T)-sized tensor reaches memory; sequence lengths that are multiples of 128, no
  attention-probability dropout. Elsewhere it runs in the Pallas interpreter (tests).
The bucketed semantics are the same: r(i, j) is computed by the same function in all.
"""
import functools
from typing import Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from encoders.layers import attention, relative_kernel
from encoders.layers.attention import MultiHeadAttention
from encoders.layers.core import Dense
from encoders.layers.dropout import Dropout
from encoders.layers.masks import AttentionInputs, SegmentMask

Array = jax.Array
REL_IMPLS = ("shift", "gather", "headmajor", "fused")
TERMS = ("c2p", "p2c")


def choose_impl(platform: str, seq_len=None, dropout_rate: float = 0.0):
  """What `relative_impl: auto` runs, and why: (impl, reason). On TPU the fused kernel
  when the length is a multiple of its block (128) and there is no attention-probability
  dropout (the kernel never forms the probabilities); otherwise, and on every other
  platform, the shift formulation."""
  block = relative_kernel.BLOCK
  if platform != "tpu":
    return "shift", f"{platform}: the shift formulation (the fused kernel is for TPU)"
  if dropout_rate > 0:
    return "shift", (f"TPU: not the fused kernel: attention_probs_dropout_prob="
                     f"{dropout_rate:g} > 0 needs the attention probabilities; set it to 0 "
                     "for the fused kernel")
  if not seq_len:
    return "shift", "TPU: not the fused kernel: the sequence length is not known"
  if seq_len % block:
    return "shift", (f"TPU: not the fused kernel: sequence length {seq_len} is not a "
                     f"multiple of {block}")
  return "fused", (f"TPU: the fused relative-attention Pallas kernel, sequence length "
                   f"{seq_len} a multiple of {block}")


def log_bucket_position(rel: np.ndarray, bucket_size: int, max_position: int) -> np.ndarray:
  """DeBERTa's log buckets of relative distances (int array -> int array): distances with
  |d| < bucket_size // 2 stay exact; longer ones map logarithmically so that
  max_position - 1 lands on bucket_size - 1. Computed in float32 as transformers does."""
  rel = np.asarray(rel, np.int64)
  sign = np.sign(rel)
  mid = bucket_size // 2
  abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
  ratio = (abs_pos / mid).astype(np.float32)
  denom = np.log(np.float32((max_position - 1) / mid))
  log_pos = np.ceil(np.log(ratio) / denom * np.float32(mid - 1)).astype(np.float32) + mid
  return np.where(abs_pos <= mid, rel, log_pos * sign).astype(np.int64)


@functools.lru_cache(maxsize=64)
def distance_rows(length: int, span: int, buckets: int, max_position: int) -> np.ndarray:
  """(2T-1,) int32: the relative-embedding row of each distance d = i - j, ordered
  d = -(T-1), ..., T-1; the row is clip(bucket(d) + span, 0, 2 * span - 1)."""
  d = np.arange(-(length - 1), length)
  if buckets > 0 and max_position > 0:
    d = log_bucket_position(d, buckets, max_position)
  return np.clip(d + span, 0, 2 * span - 1).astype(np.int32)


def bucketed_distances(length: int, buckets: int, max_position: int) -> np.ndarray:
  """(T,T) int: bucket(i - j) of query i and key j (plain i - j without buckets)."""
  i = np.arange(length)
  d = i[:, None] - i[None, :]
  if buckets > 0 and max_position > 0:
    d = log_bucket_position(d, buckets, max_position)
  return d


def relative_shift(full: Array) -> Array:
  """(..., C, W) -> (..., C, W - C + 1) with [r, j] = full[r, j - r + C - 1]: for
  (..., T, 2T-1), whose column m holds offset j - i = m - (T-1), the (T,T) scores. Pad a
  column, flatten the last two dims, drop the first C - 1 entries and read rows of W
  (Transformer-XL's skew)."""
  *lead, c, width = full.shape
  if width < 2 * c - 1:
    raise ValueError(f"relative_shift needs (..., C, W) with W >= 2C - 1, got {full.shape}")
  flat = jnp.pad(full, [(0, 0)] * len(lead) + [(0, 0), (0, 1)])
  flat = flat.reshape(*lead, c * (width + 1))
  flat = jax.lax.slice_in_dim(flat, c - 1, c - 1 + c * width, axis=-1)
  return flat.reshape(*lead, c, width)[..., :width - c + 1]


def relative_products(x: Array, table: Array, block: int = 0, precision=jnp.float32) -> Array:
  """x (B,T,H,K), table (2T-1,H,K) indexed by offset o + T - 1 -> (B,H,T,T) with
  [r, c] = x_r . table[c - r + T - 1].

  block = 0 (or one not dividing T): one product over all 2T-1 offsets per row. block = C:
  rows in blocks of C, each multiplied by only the T + C - 1 offsets its rows use
  (a small gather of table slices), which cuts the product and its intermediate from
  T(2T-1) to T(T+C-1) per head: ~37% less at T=512, C=128."""
  b, t, h, k = x.shape
  kw = dict(preferred_element_type=precision)
  if not block or t % block or block >= t:
    return relative_shift(jnp.einsum("bihk,mhk->bhim", x, table, **kw))
  nb, width = t // block, t + block - 1
  starts = t - block - block * np.arange(nb)  # block n (rows a = nC ..) starts at T-C-a
  tables = jnp.take(table, jnp.asarray(starts[:, None] + np.arange(width)[None]), axis=0)
  full = jnp.einsum("bnchk,nwhk->bhncw", x.reshape(b, nb, block, h, k), tables, **kw)
  return relative_shift(full).reshape(b, h, t, t)


def relative_scores(q: Array, k: Array, pos_key: Array, pos_query: Array,
                    terms: Sequence[str], rows: Tuple[int, int, int], impl: str = "shift",
                    block: int = 0) -> Array:
  """The c2p + p2c score term (B,H,T,T) in q's dtype (scale the tables to scale it).

  q, k (B,T,H,K); pos_key, pos_query (2S,H,K) projections of the relative table (either
  may be None when its term is off); rows = (span, buckets, max_position); `block`: the
  "shift" formulation's row block (`relative_products`; 0: none). The products
  accumulate in float32 and are stored in q's dtype: in bfloat16 the (B,H,T,2T-1)
  intermediates, which set this term's memory traffic, are half the bytes."""
  t = q.shape[1]
  span, buckets, max_position = rows
  out = 0.0
  f32 = dict(preferred_element_type=jnp.float32)
  if q.dtype != jnp.float32:
    f32 = dict(preferred_element_type=q.dtype)
  if impl == "gather":
    rel = bucketed_distances(t, buckets, max_position)
    if "c2p" in terms:  # [i, j] = q_i . Pk[clip(bucket(i - j) + S)]
      idx = jnp.asarray(np.clip(rel + span, 0, 2 * span - 1).astype(np.int32))
      c2p = jnp.einsum("bihk,rhk->bhir", q, pos_key, **f32)
      out = out + jnp.take_along_axis(c2p, jnp.broadcast_to(idx, c2p.shape[:2] + (t, t)),
                                      axis=-1)
    if "p2c" in terms:  # [j, i] = k_j . Pq[clip(S - bucket(j - i))], then transposed
      idx = jnp.asarray(np.clip(span - rel, 0, 2 * span - 1).astype(np.int32))
      p2c = jnp.einsum("bjhk,rhk->bhjr", k, pos_query, **f32)
      g = jnp.take_along_axis(p2c, jnp.broadcast_to(idx, p2c.shape[:2] + (t, t)), axis=-1)
      out = out + jnp.swapaxes(g, -1, -2)
    return out
  if impl != "shift":
    raise ValueError(f"unknown relative attention impl {impl!r}; use one of {REL_IMPLS}")
  dist = distance_rows(t, span, buckets, max_position)  # row of d = -(T-1) .. T-1
  if "c2p" in terms:
    # [i, j] = q_i . Pk[row(i - j)]: offset j - i = m - (T-1) is distance d = T-1-m
    table = jnp.take(pos_key, jnp.asarray(dist[::-1].copy()), axis=0)
    out = out + relative_products(q, table, block, f32["preferred_element_type"])
  if "p2c" in terms:
    # [i, j] = k_j . Pq[row(i - j)]: rows j, offset i - j = m - (T-1) is d itself
    table = jnp.take(pos_query, jnp.asarray(dist), axis=0)
    out = out + jnp.swapaxes(
        relative_products(k, table, block, f32["preferred_element_type"]), -1, -2)
  return out


def _products_hm(x: Array, table: Array, block: int, dtype) -> Array:
  """Head-major `relative_products`: x (H,B,T,K), table (2T-1,H,K) -> (H,B,T,T) with
  [h, b, r, c] = x[h, b, r] . table[c - r + T - 1, h]."""
  h, b, t, k = x.shape
  kw = {"preferred_element_type": dtype}
  if not block or t % block or block >= t:
    return relative_shift(jnp.einsum("hbik,mhk->hbim", x, table, **kw))
  nb, width = t // block, t + block - 1
  starts = t - block - block * np.arange(nb)
  tables = jnp.take(table, jnp.asarray(starts[:, None] + np.arange(width)[None]), axis=0)
  full = jnp.einsum("hbnck,nwhk->hbncw", x.reshape(h, b, nb, block, k), tables, **kw)
  return relative_shift(full).reshape(h, b, t, t)


def headmajor_attention(q, k, v, pos_key, pos_query, terms, rows, block, mask, scale,
                        dropout_fn=None):
  """Softmax attention with DeBERTa's c2p/p2c terms, head-major: q, k, v (B,T,H,K),
  pos_key / pos_query (2S,H,K) scaled tables (or None), mask (B,1|H,T,T) bool ->
  context (B,T,H,K). The same math as `relative_scores` + `kernels.attention_scores_
  einsum` (content scores and the sum in float32, probabilities in v's dtype)."""
  t = q.shape[1]
  span, buckets, max_position = rows
  rel_dtype = jnp.float32 if q.dtype == jnp.float32 else q.dtype
  qh, kh, vh = (jnp.transpose(x, (2, 0, 1, 3)) for x in (q, k, v))
  scores = jnp.einsum("hbik,hbjk->hbij", qh, kh,
                      preferred_element_type=jnp.float32) * scale
  dist = distance_rows(t, span, buckets, max_position)
  if "c2p" in terms:
    table = jnp.take(pos_key, jnp.asarray(dist[::-1].copy()), axis=0)
    scores = scores + _products_hm(qh, table, block, rel_dtype).astype(jnp.float32)
  if "p2c" in terms:
    table = jnp.take(pos_query, jnp.asarray(dist), axis=0)
    scores = scores + jnp.swapaxes(_products_hm(kh, table, block, rel_dtype),
                                   -1, -2).astype(jnp.float32)
  mask = jnp.swapaxes(mask, 0, 1)  # (1|H,B,T,T)
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  if dropout_fn is not None:
    probs = dropout_fn(probs)
  ctx = jnp.einsum("hbij,hbjk->hbik", probs, vh)
  return jnp.transpose(ctx, (1, 2, 0, 3))


class DisentangledAttention(MultiHeadAttention):
  """DeBERTa's disentangled self-attention: MultiHeadAttention's projections and kernels,
  with the c2p/p2c terms added to the scores as an additive bias and every term scaled by
  1/sqrt(K * (1 + number of terms)).

  Reads `inputs.rel_embeddings` (2S, D): the (normed) relative table, shared by all
  layers. `share_att_key`: the relative table goes through this layer's own key (c2p) and
  query (p2c) projections; otherwise through `pos_key` / `pos_query` of its own.
  `relative_attention=False` leaves only the content term (still scaled by the terms
  named in `pos_att_type`, as transformers does). `pos_key_bias=False`: `pos_key` has no
  bias (DeBERTa v1's `pos_proj`).
  """
  pos_att_type: Tuple[str, ...] = TERMS
  share_att_key: bool = True
  relative_attention: bool = True
  span: int = 256
  position_buckets: int = 256
  max_relative_positions: int = 512
  pos_dropout_rate: float = 0.0
  rel_impl: str = "shift"
  rel_block: int = 0
  pos_key_bias: bool = True

  def setup(self):
    super().setup()
    unknown = set(self.pos_att_type) - set(TERMS)
    if unknown:
      raise ValueError(f"unknown pos_att_type {sorted(unknown)}; use a subset of {TERMS}")
    if self.relative_attention and not self.share_att_key:
      proj = functools.partial(Dense, (self.num_heads, self.head_dim),
                               ("embed", "heads", "kv"), use_bias=True,
                               init_std=self.init_std, dtype=self.dtype)
      if "c2p" in self.pos_att_type:
        self.pos_key = proj(name="pos_key", use_bias=self.pos_key_bias)
      if "p2c" in self.pos_att_type:
        self.pos_query = proj(name="pos_query")
    self.pos_dropout = Dropout(self.pos_dropout_rate)

  def __call__(self, x, inputs: AttentionInputs, deterministic: bool = True):
    if self.impl == "splash":
      raise ValueError("DeBERTa's relative terms are an additive score bias, which "
                       "attention_impl='splash' does not take; use 'xla'")
    q, k, v = self.project(x, inputs.query)
    n_terms = len(self.pos_att_type)
    scale = float(1.0 / np.sqrt(self.head_dim * (1 + n_terms)))
    bias = None
    if self.relative_attention and n_terms:
      if inputs.rel_embeddings is None:
        raise ValueError("relative attention needs inputs.rel_embeddings")
      rel = inputs.rel_embeddings[:2 * self.span].astype(self.dtype)
      rel = self.pos_dropout(rel, deterministic=deterministic)
      pk = pq = None  # scaled here, on the (2S,H,K) tables, not on (B,H,T,T) scores
      if "c2p" in self.pos_att_type:
        pk = (self.key if self.share_att_key else self.pos_key)(rel) * scale
      if "p2c" in self.pos_att_type:
        pq = (self.query if self.share_att_key else self.pos_query)(rel) * scale
      rel_impl = self.rel_impl
      if rel_impl == "auto":  # built for TPU without knowing the length: chosen per call
        t = attention.concrete_length(q.shape[1])
        rel_impl, reason = choose_impl(
            jax.default_backend(), t, 0.0 if deterministic else float(self.dropout_rate))
        attention.log_call_choice("relative attention", t, rel_impl, reason)
      # init may trace any length (e.g. 8 tokens); the kernel has no parameters of its own,
      # so initialisation takes the shift formulation, which creates the same ones
      if rel_impl == "fused" and not self.is_initializing():
        if not deterministic and self.dropout_rate > 0.0:
          raise ValueError("relative_impl='fused' has no attention-probability dropout; set "
                           "attention_probs_dropout_prob=0 (or relative_impl='shift')")
        seg = (inputs.extra or {}).get("segments")
        if seg is None:
          raise ValueError("relative_impl='fused' needs the (B,T) segment ids in "
                           "inputs.extra['segments'] (DeBERTa's attention_inputs sets them)")
        t = q.shape[1]
        dist = distance_rows(t, self.span, self.position_buckets, self.max_relative_positions)
        ctx = relative_kernel.fused_relative_attention(
            q, k, v, pk, pq, dist, seg, scale)
        return self.out(ctx)
      if rel_impl == "headmajor":
        mask = inputs.mask_of(self.mask_kind)
        if isinstance(mask, SegmentMask):
          mask = mask.dense()
        use_dropout = not deterministic and self.dropout_rate > 0.0
        ctx = headmajor_attention(
            q, k, v, pk, pq, self.pos_att_type,
            (self.span, self.position_buckets, self.max_relative_positions),
            self.rel_block, mask, scale,
            (lambda p: self.attn_dropout(p, deterministic=False)) if use_dropout else None)
        return self.out(ctx)
      bias = relative_scores(q, k, pk, pq, self.pos_att_type,
                             (self.span, self.position_buckets, self.max_relative_positions),
                             "shift" if rel_impl == "fused" else rel_impl,
                             self.rel_block)
    ctx = self.attend(q, k, v, inputs.mask_of(self.mask_kind), bias, deterministic,
                      scale=scale)
    return self.out(ctx)
