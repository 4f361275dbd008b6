"""A bucketed relative position bias shared by every layer (T5's, Raffel et al. 2020; MPNet's
on top of absolute positions, Song et al. 2020): one learned scalar per (bucket, head),
looked up once per forward and added to each layer's attention scores through
`AttentionInputs.bias`.

A family switches it on in its `Parts` (`position_bias=`); the generic encoder computes it
once and every attention module adds it like any other score bias, so no layer has a
family branch. Splash cannot add a bias: `attention_impl: auto` does not pick it then.
"""
import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoders.layers.core import constrain, normal_init

Array = jax.Array


def check_buckets(num_buckets: int, max_distance: int, bidirectional: bool = True) -> None:
  """ValueError naming the setting when the buckets cannot be laid out: each direction
  needs at least two (half exact, half log-spaced), and the log range must start below
  `max_distance`."""
  per_side = num_buckets // 2 if bidirectional else num_buckets
  if per_side < 2:
    raise ValueError(f"relative position buckets: {num_buckets} is too few "
                     f"({'bidirectional needs >= 4' if bidirectional else 'needs >= 2'})")
  if max_distance <= per_side // 2:
    raise ValueError(f"relative position max_distance={max_distance} must exceed the "
                     f"{per_side // 2} exact buckets per direction")


def relative_position_bucket(relative_position: Array, num_buckets: int = 32,
                             max_distance: int = 128, bidirectional: bool = True) -> Array:
  """Relative positions (key - query; any shape, int) -> bucket ids, int32, in
  [0, num_buckets).

  Bidirectional: half the buckets for keys after the query (ids from num_buckets // 2).
  Within a direction, with n buckets, distances below n // 2 get a bucket each; longer
  ones share log-spaced buckets up to `max_distance`, and everything farther the last
  bucket. Unidirectional: keys after the query share bucket 0. The log is taken in
  float32 and truncated, as transformers' T5 and MPNet do, so boundaries match theirs."""
  check_buckets(num_buckets, max_distance, bidirectional)
  rel = jnp.asarray(relative_position, jnp.int32)
  if bidirectional:
    num_buckets //= 2
    ret = jnp.where(rel > 0, num_buckets, 0)
    n = jnp.abs(rel)
  else:
    ret = jnp.zeros_like(rel)
    n = jnp.maximum(-rel, 0)
  max_exact = num_buckets // 2
  # n < max_exact takes the exact branch; the max keeps log's argument positive there
  scaled = (jnp.log(jnp.maximum(n, max_exact).astype(jnp.float32) / max_exact)
            / jnp.float32(math.log(max_distance / max_exact)) * (num_buckets - max_exact))
  large = jnp.minimum(max_exact + scaled.astype(jnp.int32), num_buckets - 1)
  return (ret + jnp.where(n < max_exact, n, large)).astype(jnp.int32)


class RelativePositionBias(nn.Module):
  """length T -> (1,H,T,T) float32 score bias: `embedding` (table_size, H) looked up at the
  bucket of each (query i, key j) pair's offset j - i.

  `num_buckets` buckets the offsets (bidirectional: half per direction) up to
  `max_distance`; the table has `table_size` rows (default `num_buckets`; transformers'
  MPNet buckets into 32 whatever its `relative_attention_num_buckets` table holds).
  Offsets count along the row, so packed documents (whose cross-document pairs are
  masked) see the same bias as alone, and padding does not shift it."""
  num_heads: int
  num_buckets: int = 32
  max_distance: int = 128
  bidirectional: bool = True
  table_size: Optional[int] = None
  init_std: float = 0.02

  @nn.compact
  def __call__(self, length: int) -> Array:
    rows = self.table_size or self.num_buckets
    if rows < self.num_buckets:
      raise ValueError(f"relative position bias: a table of {rows} rows cannot hold "
                       f"{self.num_buckets} buckets")
    table = self.param("embedding", normal_init(self.init_std, (None, "heads")),
                       (rows, self.num_heads), jnp.float32)
    pos = jnp.arange(length, dtype=jnp.int32)
    buckets = relative_position_bucket(pos[None, :] - pos[:, None], self.num_buckets,
                                       self.max_distance, self.bidirectional)  # (T,T)
    bias = jnp.take(table, buckets, axis=0)  # (T,T,H)
    bias = jnp.transpose(bias, (2, 0, 1))[None]  # (1,H,T,T)
    return constrain(bias, (None, "act_heads", None, None))
