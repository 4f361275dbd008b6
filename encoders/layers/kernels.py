"""Attention kernels on (B,T,H,K) q, k, v: the einsum reference, the CPU layout, Pallas
Splash (TPU), and rotary position embedding."""
import contextlib
import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as sa

Array = jax.Array

SPLASH_BLOCKS = (512, 256, 128)
_STAND_INS = []  # non-empty: splash_attention traces a cheap stand-in (`kernel_stand_ins`)


@contextlib.contextmanager
def kernel_stand_ins():
  """While active, `splash_attention` traces an elementwise stand-in (q * k + v, the same
  inputs, output and sharding) instead of the Pallas kernel: launch.aot prices the rest of
  the step with XLA's cost model on such a twin and the kernel by its roofline, because
  XLA's cost model cannot see inside the kernel. Never for real computation."""
  _STAND_INS.append(True)
  try:
    yield
  finally:
    _STAND_INS.pop()


def splash_attention(q: Array, k: Array, v: Array, segment_ids: Array,
                     scale: Optional[float] = None, interpret: bool = False,
                     local_window: Optional[int] = None) -> Array:
  """Pallas Splash attention (TPU): q (B,T,H,K), k, v (B,T,G,K), segment_ids (B,T) ->
  (B,T,H,K). G < H is grouped-query attention: the kernel reads query head h against K/V
  head h // (H / G) itself (its MQA/GQA form), so K/V are never repeated.

  Full bidirectional attention restricted to equal segment ids, so packed documents never
  see each other and padding (id 0) is never attended by a real token; blocks with no
  allowed pair are skipped. T must be a multiple of 128. Under a mesh context
  (`jax.set_mesh`) the kernel runs per shard through shard_map, with the batch and head
  dims split as the logical rules place `act_batch` and `act_heads`; without one it runs
  as one call. `interpret=True` runs the kernel in the Pallas interpreter (any backend;
  tests on the CPU). `local_window` w restricts each query to keys with |i - j| <= w // 2
  (a banded `LocalMask`: blocks outside the band are skipped, so the work is windowed).
  """
  b, t, h, d = q.shape
  if t % 128:
    raise ValueError(f"splash attention needs a sequence length that is a multiple of 128, "
                     f"got {t}; pad the batch or use attention_impl='xla'")
  scale = 1.0 / math.sqrt(d) if scale is None else scale
  q = q * jnp.asarray(scale, q.dtype)
  block = next(s for s in SPLASH_BLOCKS if t % s == 0)
  sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
                        use_fused_bwd_kernel=True)

  def local(q, k, v, seg):
    if _STAND_INS:
      k, v = (repeat_kv(x, q.shape[2]) for x in (k, v))
      return q * k + v * (seg[:, :, None, None] > 0).astype(v.dtype)
    heads = q.shape[2]
    one_head = (sa.FullMask((t, t)) if not local_window else
                sa.LocalMask((t, t), (local_window // 2, local_window // 2), offset=0))
    mask = sa.MultiHeadMask([one_head] * heads)
    kernel = sa.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes,
                                interpret=interpret)

    def one(q, k, v, s):  # (T,H,K) -> the kernel's (H,T,K)
      out = kernel(q.swapaxes(0, 1), k.swapaxes(0, 1), v.swapaxes(0, 1), sa.SegmentIds(s, s))
      return out.swapaxes(0, 1)

    return jax.vmap(one)(q, k, v, seg)

  return per_shard(local, "splash attention", (q, k, v), segment_ids.astype(jnp.int32))


def per_shard(local, what: str, qkv, segment_ids: Array, per_head=()):
  """Runs an attention kernel `local(q, k, v, *per_head, segment_ids)` -> (B,T,H,K) on
  each shard: under a mesh context (`jax.set_mesh`) through shard_map, with q, k, v
  (B,T,H,K) and the output split over batch and heads as the logical rules place
  `act_batch` and `act_heads`, `segment_ids` (B,T) over batch, and each `per_head` array
  (heads first; None allowed) over heads; without one (or on one device) as one call.
  `what` names the kernel in the error for rules that shard the length or head dim."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return local(*qkv, *per_head, segment_ids)
  spec = nn.logical_to_mesh_axes(("act_batch", "act_len", "act_heads", "act_kv"))
  spec = tuple(spec) + (None,) * (4 - len(tuple(spec)))
  if spec[1] is not None or spec[3] is not None:
    raise ValueError(f"{what} shards only the batch and head dims; the rules map "
                     f"act_len/act_kv to {spec[1]}/{spec[3]}")
  if spec[2] is not None:  # grouped-query K/V have fewer heads than q to split
    names = spec[2] if isinstance(spec[2], tuple) else (spec[2],)
    shards = math.prod(mesh.shape[n] for n in names)
    uneven = sorted({x.shape[2] for x in qkv if x.shape[2] % shards})
    if uneven:
      raise ValueError(f"{what} splits heads over {shards} shards (act_heads -> {spec[2]}), "
                       f"which {uneven[0]} heads do not divide (num_key_value_heads?)")
  P = jax.sharding.PartitionSpec
  heads = [P() if x is None else P(spec[2], *(None,) * (x.ndim - 1)) for x in per_head]
  in_specs = (P(*spec),) * len(qkv) + tuple(heads) + (P(spec[0], None),)
  return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=P(*spec),
                       check_vma=False)(*qkv, *per_head, segment_ids)


def repeat_kv(x: Array, num_heads: int) -> Array:
  """(B,T,G,K) -> (B,T,H,K): each K/V head repeated for its H / G query heads, in
  transformers' repeat_kv order (query head h reads K/V head h // (H / G)). For reference
  paths and tests; the kernels take the G heads as they are."""
  return x if x.shape[2] == num_heads else jnp.repeat(x, num_heads // x.shape[2], axis=2)


def _grouped(q: Array, kv_heads: int) -> Array:
  """(B,T,H,K) -> (B,T,G,H/G,K): the query heads of each K/V head together."""
  b, t, h, d = q.shape
  return q.reshape(b, t, kv_heads, h // kv_heads, d)


def rotary(x: Array, positions: Array, theta: float) -> Array:
  """Rotary position embedding (half-split layout, as HF/ModernBERT): x (B,T,H,K)."""
  k = x.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, k, 2, dtype=jnp.float32) / k))
  angles = positions[..., None].astype(jnp.float32) * inv_freq  # (B,T,K/2)
  cos = jnp.cos(jnp.concatenate([angles, angles], -1))[:, :, None, :]
  sin = jnp.sin(jnp.concatenate([angles, angles], -1))[:, :, None, :]
  xf = x.astype(jnp.float32)
  x1, x2 = jnp.split(xf, 2, axis=-1)
  rotated = jnp.concatenate([-x2, x1], -1)
  return (xf * cos + rotated * sin).astype(x.dtype)


def rope_positions(positions: Array, factor: float = 1.0) -> Array:
  """The positions `rotary` takes under linear RoPE scaling (position interpolation, HF's
  rope_type "linear"): (B,T) position ids / `factor` in float32; unchanged for factor 1."""
  if factor == 1.0:
    return positions
  if factor <= 0:
    raise ValueError(f"RoPE scaling factor {factor} must be > 0")
  return positions.astype(jnp.float32) / jnp.float32(factor)


def attention_scores_einsum(q, k, v, mask, bias=None, scale=None, dropout_fn=None):
  """Reference attention: q (B,T,H,K), k, v (B,S,G,K) with G dividing H (grouped-query
  when G < H), mask (B,1|H,T,S) bool, bias (B|1,H|1,T,S). Scores and the probs @ V
  product accumulate in float32 whatever the input dtype (bfloat16 scores would round
  QK^T before the softmax; every other path keeps float32 scores too), and the context
  comes back in v's dtype."""
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  if k.shape[2] != q.shape[2]:
    return _grouped_einsum(q, k, v, mask, bias, scale, dropout_fn)
  scores = jnp.einsum("bqhk,bshk->bhqs", q, k, preferred_element_type=jnp.float32) * scale
  if bias is not None:
    scores = scores + bias.astype(jnp.float32)
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  if dropout_fn is not None:
    probs = dropout_fn(probs)
  return jnp.einsum("bhqs,bshk->bqhk", probs, v,
                    preferred_element_type=jnp.float32).astype(v.dtype)


def _grouped_einsum(q, k, v, mask, bias, scale, dropout_fn):
  """`attention_scores_einsum` for G < H K/V heads: each K/V head against its query
  heads, in one einsum (no repeated K/V)."""
  b, t, h, _ = q.shape
  g, s = k.shape[2], k.shape[1]
  scores = jnp.einsum("bqgrk,bsgk->bgrqs", _grouped(q, g), k,
                      preferred_element_type=jnp.float32).reshape(b, h, t, s) * scale
  if bias is not None:
    scores = scores + bias.astype(jnp.float32)
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  if dropout_fn is not None:
    probs = dropout_fn(probs)
  ctx = jnp.einsum("bgrqs,bsgk->bqgrk", probs.reshape(b, g, h // g, t, s), v,
                   preferred_element_type=jnp.float32)
  return ctx.reshape(q.shape).astype(v.dtype)


def attention_head_major(q, k, v, mask, bias=None, scale=None, dropout_fn=None):
  """The reference's math arranged for XLA's CPU backend: q,k,v (B,T,H,K) moved to
  (B,H,T,K) so both batched matmuls run on contiguous (T,K) tiles, and the softmax left
  unnormalised until after the probs @ V product (exp(s - max) @ V / sum, dividing a
  (T,K) tile instead of a (T,T) one). Same result as `attention_scores_einsum` (to float
  rounding) and the same dropout (applied to exp(s - max) with its inverse keep
  scaling, which equals dropping the normalised probabilities). About 2x faster than
  `jax.nn.dot_product_attention(implementation="xla")` on the CPU at T=128."""
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  b, t, h, _ = q.shape
  g, s = k.shape[2], k.shape[1]
  if g != h:  # grouped-query: (B,G,H/G*T,K) query rows against each K/V head's (S,K)
    qh = jnp.moveaxis(_grouped(q * jnp.asarray(scale, q.dtype), g), 1, 3)
    qh = qh.reshape(b, g, (h // g) * t, q.shape[-1])
  else:
    qh = jnp.swapaxes(q * jnp.asarray(scale, q.dtype), 1, 2)
  kh, vh = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)
  scores = jnp.einsum("bhqk,bhsk->bhqs", qh, kh, preferred_element_type=jnp.float32)
  scores = scores.reshape(b, h, t, s)
  if bias is not None:
    scores = scores + bias.astype(jnp.float32)
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  peak = jax.lax.stop_gradient(scores.max(-1, keepdims=True))
  unnorm = jnp.exp(scores - peak)
  denom = unnorm.sum(-1, keepdims=True)
  unnorm = unnorm.astype(v.dtype)
  if dropout_fn is not None:
    unnorm = dropout_fn(unnorm)
  ctx = jnp.einsum("bhqs,bhsk->bhqk", unnorm.reshape(b, g, -1, s), vh,
                   preferred_element_type=jnp.float32).reshape(b, h, t, -1)
  return jnp.swapaxes(ctx / denom, 1, 2).astype(v.dtype)


