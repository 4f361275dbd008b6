"""Shared primitives every family composes: dense, embeddings, norms, attention, MLPs, blocks.

Parameters are created with logical axis names (`vocab`, `embed`, `heads`, `kv`, `mlp`);
activations are constrained with `act_*` names. Model code never names a mesh axis: one
rules table (config.mesh.rules) maps the logical names onto the (data, fsdp, tensor) mesh.

Shapes: B batch, T sequence, D hidden, E embedding, H heads, K head dim, F MLP width, V vocab.
"""
import functools
import math
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

Array = jax.Array
Dtype = Any

def gelu_erf(x: Array) -> Array:
  """Exact GELU, x * Phi(x), written with erf as BERT and torch do. `jax.nn.gelu`'s exact
  form goes through erfc, which XLA's CPU backend evaluates ~2.5x slower."""
  return 0.5 * x * (1.0 + jax.lax.erf(x * jnp.asarray(1 / math.sqrt(2.0), x.dtype)))


_ACTIVATIONS = {
    "gelu": gelu_erf,
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_fast": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
}


def activation(name: str) -> Callable[[Array], Array]:
  if name not in _ACTIVATIONS:
    raise ValueError(f"unsupported activation {name!r}; supported: {sorted(_ACTIVATIONS)}")
  return _ACTIVATIONS[name]


def constrain(x: Array, axes: Sequence[Optional[str]]) -> Array:
  """Logical sharding constraint on an activation (a no-op outside a mesh/rules context)."""
  return nn.with_logical_constraint(x, tuple(axes))


def normal_init(std: float, axes: Sequence[Optional[str]]):
  return nn.with_logical_partitioning(nn.initializers.normal(std), tuple(axes))


def zeros_init(axes: Sequence[Optional[str]]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), tuple(axes))


def ones_init(axes: Sequence[Optional[str]]):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), tuple(axes))


class Dense(nn.Module):
  """A linear map over the trailing `len(in_axes)` dims with logical kernel axes.

  Kernel shape = in_shape + features; e.g. the query projection is (D,) -> (H, K) with
  kernel_axes ("embed", "heads", "kv"); the attention output is (H, K) -> (D,).
  """
  features: Sequence[int]
  kernel_axes: Sequence[Optional[str]]
  use_bias: bool = True
  init_std: float = 0.02
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    features = tuple(self.features)
    n_in = len(self.kernel_axes) - len(features)
    in_shape = x.shape[x.ndim - n_in:]
    kernel = self.param("kernel", normal_init(self.init_std, self.kernel_axes),
                        in_shape + features, jnp.float32)
    x = x.astype(self.dtype)
    contract = tuple(range(x.ndim - n_in, x.ndim))
    y = jax.lax.dot_general(x, kernel.astype(self.dtype),
                            ((contract, tuple(range(n_in))), ((), ())))
    if self.use_bias:
      bias = self.param("bias", zeros_init(self.kernel_axes[n_in:]), features, jnp.float32)
      y = y + bias.astype(self.dtype)
    return y


class LayerNorm(nn.Module):
  """LayerNorm over the last dim, statistics in float32, with or without a bias."""
  epsilon: float = 1e-12
  use_bias: bool = True
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    d = x.shape[-1]
    scale = self.param("scale", ones_init(("embed",)), (d,), jnp.float32)
    xf = x.astype(jnp.float32)
    mean = xf.mean(-1, keepdims=True)
    var = jnp.square(xf - mean).mean(-1, keepdims=True)
    y = (xf - mean) * jax.lax.rsqrt(var + self.epsilon) * scale
    if self.use_bias:
      y = y + self.param("bias", zeros_init(("embed",)), (d,), jnp.float32)
    return y.astype(self.dtype)


def _rotl(x: Array, r: int) -> Array:
  return (x << jnp.uint32(r)) | (x >> jnp.uint32(32 - r))


def threefry2x32(k0: Array, k1: Array, x0: Array, x1: Array):
  """The Threefry-2x32 block cipher (20 rounds), the same function as JAX's default PRNG
  (`jax.extend.random.threefry_2x32`), written as plain elementwise ops. JAX lowers its
  own for the CPU as a 5-step while loop (5 passes over memory); written out like this,
  XLA fuses the whole cipher, and what consumes its bits, into one loop."""
  rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
  ks = (k0, k1, k0 ^ k1 ^ jnp.uint32(0x1BD11BDA))
  x0, x1 = x0 + ks[0], x1 + ks[1]
  for i in range(5):
    for r in rotations[i % 2]:
      x0 = x0 + x1
      x1 = _rotl(x1, r) ^ x0
    x0 = x0 + ks[(i + 1) % 3]
    x1 = x1 + ks[(i + 2) % 3] + jnp.uint32(i + 1)
  return x0, x1


def random_bits(key: Array, shape: Sequence[int]) -> Array:
  """uint32 bits of `shape` from a raw threefry key (uint32[2]): element i (row-major flat
  index) is the first word of threefry2x32(key, (i, 0)), i.e.
  `jax.extend.random.threefry2x32_p.bind(k0, k1, i, 0)[0]`. The counter is built from
  iotas in `shape` itself, so the cipher fuses into whatever consumes the bits."""
  shape = tuple(shape)
  count = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for d in range(len(shape) - 1, -1, -1):
    count = count + jax.lax.broadcasted_iota(jnp.uint32, shape, d) * jnp.uint32(stride)
    stride *= shape[d]
  bits, _ = threefry2x32(key[0], key[1], count, jnp.zeros((), jnp.uint32))
  return bits


class Dropout(nn.Module):
  """Inverted dropout, as `nn.Dropout`, with the keep mask drawn by `random_bits` when the
  rng is a threefry key (JAX's default): the same cipher as jax.random, but one fused
  pass instead of JAX's looped CPU lowering (which made dropout ~8% of a BERT train step
  on the CPU). Other key types fall back to `jax.random.bernoulli`."""
  rate: float
  rng_collection: str = "dropout"

  @nn.compact
  def __call__(self, x: Array, deterministic: bool = True) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    if self.rate >= 1.0:
      return jnp.zeros_like(x)
    keep_prob = 1.0 - self.rate
    rng = self.make_rng(self.rng_collection)
    if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
      data = jax.random.key_data(rng) if "threefry" in str(rng.dtype) else None
    else:
      data = rng
    if data is not None and data.shape == (2,) and data.dtype == jnp.uint32:
      threshold = min(int(round(keep_prob * 2.0**32)), 2**32 - 1)
      keep = random_bits(data, x.shape) < jnp.uint32(threshold)
    else:
      keep = jax.random.bernoulli(rng, keep_prob, x.shape)
    return jnp.where(keep, x / jnp.asarray(keep_prob, x.dtype), jnp.zeros((), x.dtype))


def sinusoidal_table(num_positions: int, dim: int) -> Array:
  """(P, dim) fixed sin/cos position table (DistilBERT's sinusoidal_pos_embds layout)."""
  pos = jnp.arange(num_positions, dtype=jnp.float32)[:, None]
  inv = jnp.power(10000.0, -2.0 * (jnp.arange(dim) // 2) / dim)[None, :]
  angles = pos * inv
  table = jnp.where(jnp.arange(dim) % 2 == 0, jnp.sin(angles), jnp.cos(angles))
  return table


class Embeddings(nn.Module):
  """Word (+ position) (+ token type) embeddings, then LayerNorm, dropout and an optional
  E -> D projection (ALBERT, ELECTRA's small generators).

  input_ids (B,T), position_ids (B,T), token_type_ids (B,T) -> (B,T,D).
  `word_embeddings` is a separate submodule so MLM decoders can tie to it (`attend`).
  """
  vocab_size: int
  embedding_size: int
  max_position_embeddings: int = 0  # 0: no learned positions (DeBERTa, ModernBERT)
  type_vocab_size: int = 0  # 0: no token types
  sinusoidal_positions: bool = False
  layer_norm_eps: float = 1e-12
  norm_bias: bool = True
  use_norm: bool = True
  dropout_rate: float = 0.0
  projection_size: int = 0  # 0: no projection
  init_std: float = 0.02
  dtype: Dtype = jnp.float32

  def setup(self):
    self.word_embeddings = nn.Embed(
        self.vocab_size, self.embedding_size, dtype=self.dtype, param_dtype=jnp.float32,
        embedding_init=normal_init(self.init_std, ("vocab", "embed")))

  @nn.compact
  def __call__(self, input_ids, position_ids=None, token_type_ids=None, deterministic=True):
    x = self.word_embeddings(input_ids)
    if self.max_position_embeddings:
      if self.sinusoidal_positions:
        table = sinusoidal_table(self.max_position_embeddings, self.embedding_size)
        x = x + jnp.take(table, position_ids, axis=0).astype(self.dtype)
      else:
        x = x + nn.Embed(self.max_position_embeddings, self.embedding_size, dtype=self.dtype,
                         param_dtype=jnp.float32, name="position_embeddings",
                         embedding_init=normal_init(self.init_std, (None, "embed")))(position_ids)
    if self.type_vocab_size:
      x = x + nn.Embed(self.type_vocab_size, self.embedding_size, dtype=self.dtype,
                       param_dtype=jnp.float32, name="token_type_embeddings",
                       embedding_init=normal_init(self.init_std, (None, "embed")))(token_type_ids)
    if self.use_norm:
      x = LayerNorm(self.layer_norm_eps, self.norm_bias, self.dtype, name="norm")(x)
    x = Dropout(self.dropout_rate)(x, deterministic=deterministic)
    if self.projection_size:
      x = Dense((self.projection_size,), ("embed", "mlp"), init_std=self.init_std,
                dtype=self.dtype, name="projection")(x)
    return constrain(x, ("act_batch", "act_len", "act_embed"))

  def attend(self, x: Array) -> Array:
    """Tied decoder: (..., E) -> (..., V) logits against the word embedding table."""
    return self.word_embeddings.attend(x)


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
  with `dense()`. Passed wherever a (B,1,T,T) bool mask may be."""
  segment_ids: Array

  def dense(self) -> Array:
    seg = self.segment_ids
    return make_attention_mask((seg > 0).astype(jnp.int32), seg)


def segment_mask(attention_mask: Array, segment_ids: Optional[Array] = None) -> SegmentMask:
  """(B,T) padding mask [+ (B,T) segment ids of packed rows] -> SegmentMask."""
  valid = attention_mask.astype(jnp.int32) > 0
  seg = valid.astype(jnp.int32) if segment_ids is None else jnp.where(valid, segment_ids, 0)
  return SegmentMask(seg.astype(jnp.int32))


SPLASH_BLOCKS = (512, 256, 128)


def splash_attention(q: Array, k: Array, v: Array, segment_ids: Array,
                     scale: Optional[float] = None, interpret: bool = False) -> Array:
  """Pallas Splash attention (TPU): q,k,v (B,T,H,K), segment_ids (B,T) -> (B,T,H,K).

  Full bidirectional attention restricted to equal segment ids, so packed documents never
  see each other and padding (id 0) is never attended by a real token; blocks with no
  allowed pair are skipped. T must be a multiple of 128. Under a mesh context
  (`jax.set_mesh`) the kernel runs per shard through shard_map, with the batch and head
  dims split as the logical rules place `act_batch` and `act_heads`; without one it runs
  as one call. `interpret=True` runs the kernel in the Pallas interpreter (any backend;
  tests on the CPU).
  """
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
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
    heads = q.shape[2]
    mask = sa.MultiHeadMask([sa.FullMask((t, t))] * heads)
    kernel = sa.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=sizes,
                                interpret=interpret)

    def one(q, k, v, s):  # (T,H,K) -> the kernel's (H,T,K)
      out = kernel(q.swapaxes(0, 1), k.swapaxes(0, 1), v.swapaxes(0, 1), sa.SegmentIds(s, s))
      return out.swapaxes(0, 1)

    return jax.vmap(one)(q, k, v, seg)

  segment_ids = segment_ids.astype(jnp.int32)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return local(q, k, v, segment_ids)
  spec = nn.logical_to_mesh_axes(("act_batch", "act_len", "act_heads", "act_kv"))
  spec = tuple(spec) + (None,) * (4 - len(tuple(spec)))
  if spec[1] is not None or spec[3] is not None:
    raise ValueError("splash attention shards only the batch and head dims; the rules map "
                     f"act_len/act_kv to {spec[1]}/{spec[3]}")
  qkv = jax.sharding.PartitionSpec(*spec)
  seg = jax.sharding.PartitionSpec(spec[0], None)
  return jax.shard_map(local, mesh=mesh, in_specs=(qkv, qkv, qkv, seg), out_specs=qkv,
                       check_vma=False)(q, k, v, segment_ids)


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


def attention_scores_einsum(q, k, v, mask, bias=None, scale=None, dropout_fn=None):
  """Reference attention: q,k,v (B,T,H,K), mask (B,1|H,T,T) bool, bias (B|1,H|1,T,T)."""
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  scores = jnp.einsum("bqhk,bshk->bhqs", q, k).astype(jnp.float32) * scale
  if bias is not None:
    scores = scores + bias.astype(jnp.float32)
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  if dropout_fn is not None:
    probs = dropout_fn(probs)
  return jnp.einsum("bhqs,bshk->bqhk", probs, v)


def attention_head_major(q, k, v, mask, bias=None, scale=None, dropout_fn=None):
  """The reference's math arranged for XLA's CPU backend: q,k,v (B,T,H,K) moved to
  (B,H,T,K) so both batched matmuls run on contiguous (T,K) tiles, and the softmax left
  unnormalised until after the probs @ V product (exp(s - max) @ V / sum, dividing a
  (T,K) tile instead of a (T,T) one). Same result as `attention_scores_einsum` (to float
  rounding) and the same dropout (applied to exp(s - max) with its inverse keep
  scaling, which equals dropping the normalised probabilities). About 2x faster than
  `jax.nn.dot_product_attention(implementation="xla")` on the CPU at T=128."""
  scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
  qh, kh, vh = (jnp.swapaxes(x, 1, 2) for x in (q * jnp.asarray(scale, q.dtype), k, v))
  scores = jnp.einsum("bhqk,bhsk->bhqs", qh, kh, preferred_element_type=jnp.float32)
  if bias is not None:
    scores = scores + bias.astype(jnp.float32)
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  peak = jax.lax.stop_gradient(scores.max(-1, keepdims=True))
  unnorm = jnp.exp(scores - peak)
  denom = unnorm.sum(-1, keepdims=True)
  unnorm = unnorm.astype(v.dtype)
  if dropout_fn is not None:
    unnorm = dropout_fn(unnorm)
  ctx = jnp.einsum("bhqs,bhsk->bhqk", unnorm, vh, preferred_element_type=jnp.float32)
  return jnp.swapaxes(ctx / denom, 1, 2).astype(v.dtype)


class MultiHeadAttention(nn.Module):
  """Self-attention over (B,T,D) with a (B,1,T,T) boolean mask.

  Room for every family: `bias` adds a score term (B|1,H|1,T,T) (DeBERTa's c2p/p2c are
  computed by the family from `project` outputs and passed here, with `scale`);
  `rope_theta` applies rotary q/k at `positions`; the mask carries padding, segments and
  any local window. impl: "xla"/"cudnn" (jax.nn.dot_product_attention), "einsum"
  (the reference every path is tested against), "cpu" (`attention_head_major`, the
  reference's math laid out for XLA's CPU backend), "splash" (the Pallas TPU kernel; takes
  the mask as a `SegmentMask`). `mask` is a (B,1|H,T,T) bool array or a `SegmentMask`.
  Attention-probability dropout in training needs the probabilities: "cpu" applies it
  itself, "xla"/"cudnn" then take the einsum path, and splash refuses it (set
  attention_probs_dropout_prob=0).
  """
  num_heads: int
  head_dim: int
  hidden_size: int
  use_bias: bool = True
  dropout_rate: float = 0.0
  rope_theta: Optional[float] = None
  impl: str = "xla"
  init_std: float = 0.02
  dtype: Dtype = jnp.float32

  def setup(self):
    proj = functools.partial(Dense, (self.num_heads, self.head_dim), ("embed", "heads", "kv"),
                             use_bias=self.use_bias, init_std=self.init_std, dtype=self.dtype)
    self.query, self.key, self.value = proj(name="query"), proj(name="key"), proj(name="value")
    self.out = Dense((self.hidden_size,), ("heads", "kv", "embed"), use_bias=self.use_bias,
                     init_std=self.init_std, dtype=self.dtype)
    self.attn_dropout = Dropout(self.dropout_rate)

  def project(self, x: Array):
    """(B,T,D) -> q, k, v each (B,T,H,K)."""
    axes = ("act_batch", "act_len", "act_heads", "act_kv")
    return tuple(constrain(p(x), axes) for p in (self.query, self.key, self.value))

  def __call__(self, x, mask, positions=None, bias=None, scale=None, deterministic=True):
    q, k, v = self.project(x)
    if self.rope_theta is not None:
      q, k = rotary(q, positions, self.rope_theta), rotary(k, positions, self.rope_theta)
    use_dropout = not deterministic and self.dropout_rate > 0.0
    if self.impl == "splash":
      if use_dropout:
        raise ValueError("attention_impl='splash' has no attention-probability dropout; set "
                         "attention_probs_dropout_prob=0 (or use attention_impl='xla')")
      if bias is not None:
        raise ValueError("attention_impl='splash' takes no additive score bias")
      if not isinstance(mask, SegmentMask):
        raise ValueError("attention_impl='splash' needs the mask as a layers.SegmentMask "
                         "(segment ids), not a dense (T,T) mask")
      ctx = splash_attention(q, k, v, mask.segment_ids, scale)
    else:
      if isinstance(mask, SegmentMask):
        mask = mask.dense()
      dropout_fn = ((lambda p: self.attn_dropout(p, deterministic=False)) if use_dropout
                    else None)
      if self.impl == "cpu":
        ctx = attention_head_major(q, k, v, mask, bias, scale, dropout_fn)
      elif self.impl == "einsum" or use_dropout or (bias is not None and scale is not None):
        ctx = attention_scores_einsum(q, k, v, mask, bias, scale, dropout_fn)
      elif self.impl in ("xla", "cudnn"):
        ctx = jax.nn.dot_product_attention(
            q, k, v, bias=None if bias is None else bias.astype(q.dtype), mask=mask,
            scale=scale, implementation=self.impl)
      else:
        raise ValueError(f"unknown attention impl {self.impl!r}; use xla, cudnn, einsum, "
                         "cpu or splash")
    ctx = constrain(ctx, ("act_batch", "act_len", "act_heads", "act_kv"))
    return self.out(ctx)


class Mlp(nn.Module):
  """(B,T,D) -> (B,T,D): act(x W_in) W_out, or GeGLU act(x W_a) * (x W_g) W_out when gated."""
  intermediate_size: int
  hidden_size: int
  act: str = "gelu"
  gated: bool = False
  use_bias: bool = True
  init_std: float = 0.02
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    width = self.intermediate_size * (2 if self.gated else 1)
    h = Dense((width,), ("embed", "mlp"), self.use_bias, self.init_std, self.dtype,
              name="wi")(x)
    h = constrain(h, ("act_batch", "act_len", "act_mlp"))
    if self.gated:
      h, gate = jnp.split(h, 2, axis=-1)
      h = activation(self.act)(h) * gate
    else:
      h = activation(self.act)(h)
    return Dense((self.hidden_size,), ("mlp", "embed"), self.use_bias, self.init_std,
                 self.dtype, name="wo")(h)


class EncoderBlock(nn.Module):
  """One transformer layer composed of injected parts (flaxformer style).

  post-LN (BERT): x = LN(x + drop(attn(x))); x = LN(x + drop(mlp(x))).
  pre-LN (ModernBERT): x = x + attn(LN(x)); x = x + mlp(LN(x)); the first layer's attention
  norm may be absent (`attention_norm=False`).
  """
  attention: Callable[..., nn.Module]
  mlp: Callable[..., nn.Module]
  norm: Callable[..., nn.Module]
  pre_norm: bool = False
  attention_norm: bool = True
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x, mask, positions=None, bias=None, scale=None, deterministic=True):
    drop = Dropout(self.dropout_rate)
    attn = self.attention(name="attention")
    if self.pre_norm:
      h = self.norm(name="attention_norm")(x) if self.attention_norm else x
      x = x + drop(attn(h, mask, positions, bias, scale, deterministic), deterministic)
      x = x + drop(self.mlp(name="mlp")(self.norm(name="mlp_norm")(x)), deterministic)
    else:
      h = attn(x, mask, positions, bias, scale, deterministic)
      x = self.norm(name="attention_norm")(x + drop(h, deterministic))
      h = self.mlp(name="mlp")(x)
      x = self.norm(name="mlp_norm")(x + drop(h, deterministic))
    return constrain(x, ("act_batch", "act_len", "act_embed"))


_REMAT_POLICIES = {
    "full": None,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
}


def remat_block(block_cls, policy: str):
  """Wraps a block class in nn.remat by policy name ("none" leaves it as is)."""
  if policy == "none":
    return block_cls
  if policy not in _REMAT_POLICIES:
    raise ValueError(f"unknown remat policy {policy!r}; use none or {sorted(_REMAT_POLICIES)}")
  return nn.remat(block_cls, policy=_REMAT_POLICIES[policy], static_argnums=(6,))


class Encoder(nn.Module):
  """A stack of blocks: `block(i)` returns the (unbound) block for layer i.

  With `layer_to_param` (ALBERT's sharing) several layers reuse one parameter set:
  layer i runs block instance `layer_to_param[i]`.

  With `scan=True` the layers run as one `nn.scan` over a single block whose params carry
  a leading `layers` axis (one compiled layer body instead of L copies: faster compiles,
  and with remat the activation memory of one layer). Params then live under
  `layers/...` with shape (L, ...) instead of `layer_0/...`, `layer_1/...`;
  `stack_layer_params` / `unstack_layer_params` convert between the two layouts (the HF
  import/export does so). Every layer must then have the same block (`block(0)`).
  """
  num_layers: int
  block: Callable[[int], nn.Module]
  layer_to_param: Optional[Sequence[int]] = None
  scan: bool = False

  @nn.compact
  def __call__(self, x, mask, positions=None, bias=None, scale=None, deterministic=True):
    if self.scan:
      if self.layer_to_param is not None:
        raise ValueError("scan over layers does not combine with layer sharing "
                         "(layer_to_param)")

      def body(block, carry, mask, positions, bias, scale):
        return block(carry, mask, positions, bias, scale, deterministic), None

      scanned = nn.scan(body, variable_axes={"params": 0}, split_rngs={"params": True,
                                                                        "dropout": True},
                        in_axes=(nn.broadcast,) * 4, length=self.num_layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})
      x, _ = scanned(self.block(0)(name=SCANNED_LAYERS), x, mask, positions, bias, scale)
      return x
    mapping = self.layer_to_param or tuple(range(self.num_layers))
    blocks = {}
    for i in range(self.num_layers):
      j = mapping[i]
      if j not in blocks:
        blocks[j] = self.block(j)(name=f"layer_{j}")
      x = blocks[j](x, mask, positions, bias, scale, deterministic)
    return x


SCANNED_LAYERS = "layers"


def stack_layer_params(tree: dict, num_layers: int) -> dict:
  """Per-layer params {"layer_0": t0, ..., "layer_{L-1}": t} (anywhere in the tree) ->
  {"layers": stacked} with a leading (L,) axis: the layout of `Encoder(scan=True)`."""
  import numpy as np
  out = {}
  names = [f"layer_{i}" for i in range(num_layers)]
  if all(n in tree for n in names) and isinstance(tree[names[0]], dict):
    per = [tree[n] for n in names]
    out[SCANNED_LAYERS] = jax.tree.map(
        lambda *xs: (jnp.stack(xs) if isinstance(xs[0], jax.Array) else np.stack(xs)), *per)
    for k, v in tree.items():
      if k not in names:
        out[k] = v
    return out
  for k, v in tree.items():
    out[k] = stack_layer_params(v, num_layers) if isinstance(v, dict) else v
  return out


def unstack_layer_params(tree: dict) -> dict:
  """The inverse of `stack_layer_params`: {"layers": stacked} -> {"layer_i": ...}."""
  out = {}
  for k, v in tree.items():
    if k == SCANNED_LAYERS and isinstance(v, dict):
      n = jax.tree.leaves(v)[0].shape[0]
      for i in range(n):
        out[f"layer_{i}"] = jax.tree.map(lambda x, i=i: x[i], v)
    elif isinstance(v, dict):
      out[k] = unstack_layer_params(v)
    else:
      out[k] = v
  return out


def dtype_from_name(name: str):
  names = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
  if name not in names:
    raise ValueError(f"unsupported dtype {name!r}; use one of {sorted(names)}")
  return names[name]
