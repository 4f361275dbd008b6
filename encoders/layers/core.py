"""Dense maps, LayerNorm and RMSNorm, activations and initialisers with logical axis names.

Parameters are created with logical axis names (`vocab`, `embed`, `heads`, `kv`, `mlp`);
activations are constrained with `act_*` names. Model code never names a mesh axis: one
rules table (config.mesh.rules) maps the logical names onto the (data, fsdp, tensor) mesh.
"""
import functools
import math
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _round_cotangent(x: Array, dtype) -> Array:
  return x


def _round_cotangent_fwd(x, dtype):
  return x, None


def _round_cotangent_bwd(dtype, _, ct):
  return (ct.astype(dtype).astype(ct.dtype),)


_round_cotangent.defvjp(_round_cotangent_fwd, _round_cotangent_bwd)


def round_cotangent(x: Array, dtype) -> Array:
  """`x`, whose cotangent is rounded to `dtype` on the way back (a no-op when `dtype` is
  not narrower than `x`'s). For a float32 output of a `dtype` matmul: its cotangent feeds
  that matmul's backward in `dtype` anyway, so rounding it once where it is made lets XLA
  write and read it in `dtype`, not float32 (the MLM logits: (B, M, V)). Only what else
  reads it (the decoder bias's gradient) sees the rounding, as under mixed-precision
  autocast."""
  dtype = jnp.dtype(dtype)
  if not jnp.issubdtype(x.dtype, jnp.floating) or dtype.itemsize >= x.dtype.itemsize:
    return x
  return _round_cotangent(x, dtype)


def normal_init(std: float, axes: Sequence[Optional[str]]):
  return nn.with_logical_partitioning(nn.initializers.normal(std), tuple(axes))


def zeros_init(axes: Sequence[Optional[str]]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), tuple(axes))


def ones_init(axes: Sequence[Optional[str]]):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), tuple(axes))


def dtype_from_name(name: str):
  names = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
  if name not in names:
    raise ValueError(f"unsupported dtype {name!r}; use one of {sorted(names)}")
  return names[name]


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


class RMSNorm(nn.Module):
  """RMSNorm over the last dim (Zhang & Sennrich 2019; Llama, EuroBERT): x / sqrt(mean(x^2)
  + eps) * scale, statistics in float32; no centring and no bias. Its param is `scale`,
  as LayerNorm's, so the weight-decay mask and sharding treat both alike."""
  epsilon: float = 1e-6
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    d = x.shape[-1]
    scale = self.param("scale", ones_init(("embed",)), (d,), jnp.float32)
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.square(xf).mean(-1, keepdims=True) + self.epsilon)
    return (y * scale).astype(self.dtype)


NORM_KINDS = ("layernorm", "rmsnorm")


def make_norm(kind: str, epsilon: float, use_bias: bool = True, dtype: Dtype = jnp.float32):
  """A norm factory (called with `name=`) by a config's norm kind: "layernorm" (with or
  without a bias) or "rmsnorm" (which has none: use_bias must be False)."""
  if kind == "layernorm":
    return functools.partial(LayerNorm, epsilon, use_bias, dtype)
  if kind == "rmsnorm":
    if use_bias:
      raise ValueError("norm_kind='rmsnorm' has no bias; set the norm bias off")
    return functools.partial(RMSNorm, epsilon, dtype)
  raise ValueError(f"unknown norm kind {kind!r}; use one of {NORM_KINDS}")
