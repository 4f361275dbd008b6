"""The shared bucketed relative position bias (encoders/layers/position_bias.py): buckets
against a direct reference written from the definition (and transformers' T5 function),
long distances included; the module's (1,H,T,T) layout; named config errors; the generic
encoder adding it once for every layer."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from encoders import layers

# (num_buckets, max_distance): MPNet/T5's, few buckets, odd, a range shorter than them.
SETTINGS = [(32, 128), (8, 20), (7, 9), (4, 3), (64, 256)]
OFFSETS = np.concatenate([np.arange(-300, 301), [-10**6, -20000, -4097, 4097, 20000, 10**6]])


def reference_bucket(rel: int, num_buckets: int, max_distance: int, bidirectional: bool):
  """The definition, one offset at a time in float64: a direction's n buckets are exact
  below n // 2, then log-spaced up to max_distance, then the last."""
  bucket = 0
  if bidirectional:
    num_buckets //= 2
    bucket = num_buckets if rel > 0 else 0
    n = abs(rel)
  else:
    n = max(-rel, 0)
  exact = num_buckets // 2
  if n < exact:
    return bucket + n
  spread = int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
  return bucket + min(exact + spread, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", SETTINGS)
def test_buckets_match_the_definition_and_t5(num_buckets, max_distance, bidirectional):
  got = np.asarray(layers.relative_position_bucket(OFFSETS, num_buckets, max_distance,
                                                   bidirectional))
  want = np.array([reference_bucket(int(r), num_buckets, max_distance, bidirectional)
                   for r in OFFSETS])
  np.testing.assert_array_equal(got, want)
  t5 = T5Attention._relative_position_bucket(torch.tensor(OFFSETS), bidirectional,
                                             num_buckets, max_distance).numpy()
  np.testing.assert_array_equal(got, t5)
  assert got.min() == 0 and got.max() == (num_buckets if not bidirectional
                                          else 2 * (num_buckets // 2)) - 1


def test_buckets_are_exact_near_and_saturate_far():
  b = np.asarray(layers.relative_position_bucket(np.arange(-200, 201)))
  assert b[200] == 0
  assert list(b[201:209]) == [17, 18, 19, 20, 21, 22, 23, 24]  # keys after: 16 + offset
  assert list(b[192:200][::-1]) == [1, 2, 3, 4, 5, 6, 7, 8]  # keys before: the offset
  assert (b[200 + 128:] == 31).all() and (b[:200 - 128 + 1] == 15).all()  # saturated
  assert (np.diff(b[200:]) >= 0).all() and (np.diff(b[:201]) <= 0).all()  # monotone


def test_module_is_a_table_lookup_at_offsets():
  module = layers.RelativePositionBias(num_heads=3, num_buckets=8, max_distance=20,
                                       table_size=11)
  params = nn.unbox(jax.jit(module.init, static_argnums=1)(jax.random.PRNGKey(0), 30))
  table = np.asarray(params["params"]["embedding"])
  assert table.shape == (11, 3)
  apply = jax.jit(module.apply, static_argnums=1)
  bias = np.asarray(apply(params, 30))
  assert bias.shape == (1, 3, 30, 30)
  pos = np.arange(30)
  buckets = np.asarray(layers.relative_position_bucket(pos[None] - pos[:, None], 8, 20))
  np.testing.assert_array_equal(bias[0], table[buckets].transpose(2, 0, 1))
  # Toeplitz: (i, j) depends on j - i only, so shifting a row shifts nothing
  np.testing.assert_array_equal(bias[0, :, 1:, 1:], bias[0, :, :-1, :-1])
  # trained: each row's gradient counts the (i, j) pairs in its bucket, per head
  grad = jax.grad(lambda p: apply(p, 30).sum())(params)["params"]["embedding"]
  counts = np.bincount(buckets.ravel(), minlength=11)
  np.testing.assert_array_equal(np.asarray(grad), np.repeat(counts[:, None], 3, 1))
  # offset 0 takes bucket 0, so bucket 4 (keys after, distance 0) and the rows past the
  # 8 buckets are never read
  assert set(np.flatnonzero(counts)) == {0, 1, 2, 3, 5, 6, 7}


def test_errors_are_named():
  with pytest.raises(ValueError, match="too few"):
    layers.relative_position_bucket(np.arange(3), num_buckets=3)
  with pytest.raises(ValueError, match="max_distance"):
    layers.relative_position_bucket(np.arange(3), num_buckets=32, max_distance=8)
  with pytest.raises(ValueError, match="table of 8 rows"):
    layers.RelativePositionBias(num_heads=2, num_buckets=32, table_size=8).init(
        jax.random.PRNGKey(0), 4)


def test_score_bias_keeps_auto_off_splash():
  choose = layers.attention.choose_impl
  assert choose("tpu", 512)[0] == "splash"
  impl, reason = choose("tpu", 512, score_bias=True)
  assert impl == "xla" and "bias" in reason
  assert choose("gpu", 512, score_bias=True)[0] == "cudnn"


def test_attention_adds_the_bias_on_every_kernel_path():
  """One (1,H,T,T) bias broadcast over the batch: the cpu and xla paths equal the einsum
  reference, and the bias changes the result."""
  rng = np.random.RandomState(0)
  q, k, v = (jnp.asarray(rng.randn(2, 9, 3, 8), jnp.float32) for _ in range(3))
  mask = layers.make_attention_mask(jnp.asarray([[1] * 9, [1] * 5 + [0] * 4]))
  bias = jnp.asarray(rng.randn(1, 3, 9, 9), jnp.float32)
  ref = layers.attention_scores_einsum(q, k, v, mask, bias)
  got = layers.attention_head_major(q, k, v, mask, bias)
  np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5)
  xla = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, implementation="xla")
  np.testing.assert_allclose(np.asarray(xla), np.asarray(ref), atol=1e-5)
  plain = layers.attention_scores_einsum(q, k, v, mask)
  assert np.abs(np.asarray(plain - ref)).max() > 1e-2
