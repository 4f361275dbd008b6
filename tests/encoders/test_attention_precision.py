"""bfloat16 attention and MLM logits accumulate in float32 on every path.

The inputs are bfloat16 values, so the float32 reference on the same values is exact up to
float32 rounding; what separates the paths from it is only where they round. With scores
of magnitude ~20 (q, k of std 3, head dim 64), rounding QK^T to bfloat16 before the
softmax (the einsum path before the fix) gives errors ~0.09 max / 0.006 mean on outputs
of std ~1, while float32 scores with bfloat16 probabilities and output stay ~0.013 /
0.001: the tolerances below sit between the two.
"""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoders import layers
from encoders.layers import kernels

B, T, H, K = 2, 128, 2, 64
MAX_ERR, MEAN_ERR = 0.03, 0.002


def _qkv():
  rng = np.random.default_rng(0)
  mk = lambda s: jnp.asarray(rng.normal(0, s, (B, T, H, K)), jnp.bfloat16)
  return mk(3.0), mk(3.0), mk(1.0)


def _reference(q, k, v, mask):
  return kernels.attention_scores_einsum(*(x.astype(jnp.float32) for x in (q, k, v)), mask)


def _bf16_rounded_scores(q, k, v, mask):
  """The einsum path as it was: a bfloat16 QK^T, then the float32 softmax."""
  scores = jnp.einsum("bqhk,bshk->bhqs", q, k).astype(jnp.float32) / math.sqrt(K)
  scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
  return jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(scores, -1).astype(v.dtype), v)


def _errors(out, ref):
  d = jnp.abs(out.astype(jnp.float32) - ref)
  return float(d.max()), float(d.mean())


PATHS = {
    "einsum": kernels.attention_scores_einsum,
    "cpu": kernels.attention_head_major,
    "xla": lambda q, k, v, m: jax.nn.dot_product_attention(q, k, v, mask=m,
                                                           implementation="xla"),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_bf16_attention_paths_keep_float32_scores(path):
  q, k, v = _qkv()
  mask = jnp.ones((B, 1, T, T), bool).at[1, :, :, 100:].set(False)
  ref = _reference(q, k, v, mask)
  out = PATHS[path](q, k, v, mask)
  assert out.dtype == jnp.bfloat16
  worst, mean = _errors(out, ref)
  assert worst < MAX_ERR and mean < MEAN_ERR, (path, worst, mean)


def test_the_tolerance_catches_bf16_rounded_scores():
  q, k, v = _qkv()
  mask = jnp.ones((B, 1, T, T), bool)
  worst, mean = _errors(_bf16_rounded_scores(q, k, v, mask), _reference(q, k, v, mask))
  assert worst > MAX_ERR and mean > MEAN_ERR, (worst, mean)


def test_splash_bf16_keeps_float32_scores():
  q, k, v = _qkv()
  seg = jnp.ones((B, T), jnp.int32).at[1, 100:].set(0)
  mask = layers.make_attention_mask(seg > 0, seg)
  ref = _reference(q, k, v, mask)
  out = kernels.splash_attention(q, k, v, seg, interpret=True)
  worst, mean = _errors(out[1, :100], ref[1, :100])  # padding rows attend nothing real
  w0, m0 = _errors(out[0], ref[0])
  assert max(worst, w0) < MAX_ERR and max(mean, m0) < MEAN_ERR


def test_training_and_eval_attention_agree_in_bf16():
  """Training (einsum: dropout needs the probabilities) and eval (jax.nn's kernel) on the
  same bfloat16 inputs: both at float32 scores, so they agree to bfloat16 output rounding."""
  q, k, v = _qkv()
  mask = jnp.ones((B, 1, T, T), bool)
  a = kernels.attention_scores_einsum(q, k, v, mask).astype(jnp.float32)
  b = jax.nn.dot_product_attention(q, k, v, mask=mask).astype(jnp.float32)
  assert float(jnp.abs(a - b).max()) < MAX_ERR


def test_mlm_logits_are_float32_accumulated_in_bf16():
  emb = layers.Embeddings(vocab_size=300, embedding_size=64, dtype=jnp.bfloat16)
  ids = jnp.zeros((1, 4), jnp.int32)
  params = nn.unbox(emb.init(jax.random.PRNGKey(0), ids))["params"]
  x = jnp.asarray(np.random.default_rng(1).normal(0, 4, (2, 5, 64)), jnp.float32)
  logits = emb.apply({"params": params}, x, method=emb.attend)
  assert logits.dtype == jnp.float32
  table = params["word_embeddings"]["embedding"]
  rounded = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)
  exact = jnp.einsum("...e,ve->...v", rounded(x), rounded(table),
                     precision=jax.lax.Precision.HIGHEST)
  # bfloat16 logits would be off by up to 2^-9 of their size; float32 ones agree closely.
  np.testing.assert_allclose(np.asarray(logits), np.asarray(exact), rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(rounded(exact) - exact).max()) > 1e-3  # what bf16 would lose
