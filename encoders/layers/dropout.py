"""Dropout whose keep mask is drawn by a fused Threefry cipher (JAX's default PRNG)."""
import math
from typing import Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
WORD = 2 ** 32


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


def counter_split(shape: Sequence[int], word: int = WORD) -> int:
  """The first dim of the low counter word: the trailing dims `shape[k:]` (fewest leading
  dims left out) whose element count fits in one `word`; the leading dims `shape[:k]`
  number the high word. k = 0 for any tensor under 2^32 elements."""
  for k in range(len(shape) + 1):
    if math.prod(shape[k:]) < word:
      if math.prod(shape[:k]) >= word:
        raise ValueError(f"dropout over shape {tuple(shape)} needs more than 64 counter bits")
      return k
  raise AssertionError("unreachable")


def _index(shape: Tuple[int, ...], dims: Sequence[int]) -> Array:
  """Row-major flat index over `dims` of `shape`, as uint32 iotas in `shape` itself."""
  out = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for d in reversed(dims):
    out = out + jax.lax.broadcasted_iota(jnp.uint32, shape, d) * jnp.uint32(stride)
    stride *= shape[d]
  return out


def counters(shape: Sequence[int], word: int = WORD):
  """The two Threefry counter words of every element of `shape`: (low, high) = (flat index
  over the trailing dims of `counter_split`, flat index over the leading ones). Every
  element gets a distinct pair, so no keep pattern repeats however large the tensor; below
  2^32 elements high is 0 and low the flat index, the counter of `jax.random.bits`."""
  shape = tuple(shape)
  k = counter_split(shape, word)
  return _index(shape, range(k, len(shape))), _index(shape, range(k))


def random_bits(key: Array, shape: Sequence[int]) -> Array:
  """uint32 bits of `shape` from a raw threefry key (uint32[2]): the first word of
  threefry2x32(key, counters(shape)). Below 2^32 elements, element i (row-major) gets
  `jax.extend.random.threefry2x32_p.bind(k0, k1, i, 0)[0]`. The counters are iotas in
  `shape` itself, so the cipher fuses into whatever consumes the bits."""
  low, high = counters(shape)
  bits, _ = threefry2x32(key[0], key[1], low, high)
  return bits


class Dropout(nn.Module):
  """Inverted dropout, as `nn.Dropout`, with the keep mask drawn by `random_bits` when the
  rng is a threefry key (JAX's default): the same cipher as jax.random, but one fused
  pass instead of JAX's looped CPU lowering (which made dropout ~8% of a BERT train step
  on the CPU). Other key types fall back to `jax.random.bernoulli`.

  The keep mask is a materialised boolean (an optimization barrier): left free, XLA fuses
  the 20-round cipher into each consumer of the mask, forward and backward, and the TPU
  v6e backend's instruction scheduler spends minutes per such fusion (a BERT-base step
  compiled for v6e:2x2 in over 30 min; 200 s with the barrier)."""
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
      keep = jax.lax.optimization_barrier(random_bits(data, x.shape) < jnp.uint32(threshold))
    else:
      keep = jax.random.bernoulli(rng, keep_prob, x.shape)
    return jnp.where(keep, x / jnp.asarray(keep_prob, x.dtype), jnp.zeros((), x.dtype))
