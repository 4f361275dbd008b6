"""A pretrained encoder inside other JAX code: a plain function, a Linen submodule, an NNX
module.

    apply_fn, params = encoders.load(path)                   # or load(path, mesh=mesh)
    out = apply_fn(params, input_ids, attention_mask)        # jit / grad / vmap freely
    out.last_hidden_state

- `load` / `as_function`: `apply_fn(params, input_ids, attention_mask=None,
  token_type_ids=None, *, dropout_rng=None, **extra)` is a plain function of a nested
  dict of arrays and integer arrays; it returns `EncoderOutput`, a registered pytree of
  arrays (fields a model lacks are None). Dropout runs only when `dropout_rng` is given.
  Out-of-range inputs (an id outside [0, vocab_size), a bad token type, position or mask
  value) raise ValueError when called eagerly; under jit every output of that row is NaN.
- Linen: make the encoder module (`model` from `encoders.from_hf`) a field of your module,
  initialise your module as usual, then `place(variables["params"], params, "encoder")`
  puts the pretrained weights into that subtree. It checks the structure and every shape
  first and names each mismatch; nothing is half-replaced.
- NNX: `to_nnx(model, params)` is an `nnx.Module` holding the weights as `nnx.Param`s;
  use it as a submodule, with `nnx.jit`, `nnx.grad`, `nnx.Optimizer`. It is a thin
  wrapper and not `nnx.bridge.ToNNX`: the bridge turns our logical-axis annotations into
  NNX sharding metadata that then needs a mesh context around every call, and its
  `lazy_init` initialises the whole model randomly before the weights could be loaded.
"""
from typing import Sequence, Union

import flax.core.meta
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util

from encoders.hf import from_hf


def as_function(model):
  """The Flax module `model` -> `apply_fn(params, input_ids, ...)` (module docstring)."""
  def apply_fn(params, input_ids, attention_mask=None, token_type_ids=None, *,
               dropout_rng=None, **extra):
    return model.apply({"params": params}, input_ids, attention_mask, token_type_ids,
                       deterministic=dropout_rng is None,
                       rngs=None if dropout_rng is None else {"dropout": dropout_rng},
                       **extra)
  apply_fn.config = model.config  # the model's settings, for reading (sizes, heads)
  return apply_fn


def load(path: str, heads=None, *, mesh=None, rules=None, shardings=None, param_dtype=None,
         allow_nonfinite=False, **overrides):
  """An HF directory -> (apply_fn, params). The arguments are `encoders.from_hf`'s:
  with `mesh` the params are sharded jax.Arrays on it, streamed from the files; weights
  holding NaN or inf are refused unless `allow_nonfinite=True`."""
  model, params = from_hf(path, heads, mesh=mesh, rules=rules, shardings=shardings,
                          param_dtype=param_dtype, allow_nonfinite=allow_nonfinite,
                          **overrides)
  return as_function(model), params


# ---- Linen: pretrained weights into a subtree of the user's params ------------------------

def _is_box(x):
  return isinstance(x, flax.core.meta.AxisMetadata)


def _copy(tree):
  return {k: _copy(v) if hasattr(v, "items") and not _is_box(v) else v
          for k, v in tree.items()}


def _fit(value, target):
  """`value` as `target`'s dtype, on `target`'s sharding, in `target`'s box."""
  inner = target.unbox() if _is_box(target) else target
  value = jnp.asarray(value, getattr(inner, "dtype", None))
  sharding = getattr(inner, "sharding", None)
  if sharding is not None:
    value = jax.device_put(value, sharding)
  return target.replace_boxed(value) if _is_box(target) else value


def place(params, pretrained, at: Union[str, Sequence[str]] = "encoder"):
  """A copy of the user's `params` with `pretrained` (the encoder's params, as from
  `encoders.from_hf` / `load`) at the subtree `at` ("encoder", "backbone/encoder" or a
  sequence of keys). The subtree must have exactly the pretrained structure and shapes:
  any missing, unexpected or mis-shaped entry is a ValueError naming it, raised before
  anything is replaced. Each value takes the dtype (and sharding, and logical-axis box)
  of the leaf it replaces; `params` itself is not modified."""
  keys = tuple(at.split("/")) if isinstance(at, str) else tuple(at)
  if hasattr(params, "unfreeze"):
    params = params.unfreeze()
  node = params
  for i, k in enumerate(keys):
    if not hasattr(node, "items") or k not in node:
      have = sorted(node) if hasattr(node, "items") else type(node).__name__
      raise ValueError(f"place: the params have no subtree {'/'.join(keys[:i + 1])!r} "
                       f"(keys there: {have}); `at` must name the encoder's field")
    node = node[k]
  ours, theirs = traverse_util.flatten_dict(node), traverse_util.flatten_dict(pretrained)

  def name(p):
    return "/".join(keys + p)

  def shape(x):
    x = x.unbox() if _is_box(x) else x
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)
  missing = sorted(name(p) for p in ours if p not in theirs)
  unexpected = sorted("/".join(p) for p in theirs if p not in ours)
  shapes = [f"{name(p)}: model {shape(ours[p])} vs pretrained {shape(v)}"
            for p, v in theirs.items() if p in ours and shape(v) != shape(ours[p])]
  if missing or unexpected or shapes:
    parts = []
    if missing:
      parts.append(f"not in the pretrained params: {', '.join(missing[:10])}")
    if unexpected:
      parts.append(f"pretrained params the model does not have: {', '.join(unexpected[:10])}")
    if shapes:
      parts.append(f"shape mismatches: {'; '.join(shapes[:10])}")
    raise ValueError(f"place: the pretrained encoder does not fit {'/'.join(keys)!r} ("
                     + " | ".join(parts) + "); build the field with the same config, e.g. "
                     "the `model` that encoders.from_hf returned")
  out = _copy(params)
  parent = out
  for k in keys[:-1]:
    parent = parent[k]
  parent[keys[-1]] = traverse_util.unflatten_dict({p: _fit(theirs[p], ours[p]) for p in ours})
  return out


# ---- NNX ----------------------------------------------------------------------------------

class NnxEncoder(nnx.Module):
  """A pretrained encoder as an NNX module: `params` is the encoder's param tree with
  every array an `nnx.Param`; calling it runs the Linen model on their values, with
  `apply_fn`'s arguments."""

  def __init__(self, model, params):
    self.model = model  # a Linen module: static configuration, no arrays
    self.params = nnx.data(jax.tree.map(nnx.Param, params))

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
               dropout_rng=None, **extra):
    values = jax.tree.map(lambda v: v[...], self.params,
                          is_leaf=lambda x: isinstance(x, nnx.Variable))
    return as_function(self.model)(values, input_ids, attention_mask, token_type_ids,
                                   dropout_rng=dropout_rng, **extra)


def to_nnx(model, params) -> NnxEncoder:
  """(model, params) from `encoders.from_hf` -> an NNX module holding the weights."""
  return NnxEncoder(model, params)


__all__ = ["as_function", "load", "place", "to_nnx", "NnxEncoder"]
