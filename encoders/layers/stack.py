"""The layer stack: per-layer, shared (ALBERT) or scanned parameters; remat by policy.

Layouts of the stack's params (the HF import/export converts with `stack_layer_params` /
`unstack_layer_params`):
- unscanned: `layer_0`, `layer_1`, ... (one per parameter set; with sharing, one per
  set that layers use, named `<param_name>_<j>`);
- scanned (`scan=True`, no sharing): `layers`, whose leaves carry a leading (L // period,)
  axis. With period 1, `layers` holds one block's params; with period p > 1 it holds
  `layer_0 .. layer_{p-1}` (the blocks of one period), and the L % p layers left over run
  unscanned after it as `layer_<i>` (i their global index);
- scanned with sharing: each run of consecutive layers that use one parameter set is one
  `nn.scan` with that set's params broadcast (not stacked): the layout is the unscanned one.
"""
from typing import Callable, Optional, Sequence as Seq

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from encoders.layers.blocks import Sequence
from encoders.layers.masks import AttentionInputs

SCANNED_LAYERS = "layers"

_REMAT_POLICIES = {
    "full": None,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
}


def remat_block(block_cls, policy: str):
  """Wraps a block class (called as block(x, inputs, deterministic)) in nn.remat by policy
  name ("none" leaves it as is)."""
  if policy == "none":
    return block_cls
  if policy not in _REMAT_POLICIES:
    raise ValueError(f"unknown remat policy {policy!r}; use none or {sorted(_REMAT_POLICIES)}")
  return nn.remat(block_cls, policy=_REMAT_POLICIES[policy], static_argnums=(3,))


@jax.custom_vjp
def cotangent_barrier(x):
  """Identity whose backward makes XLA's CPU backend materialise the incoming cotangent.

  Why: in a pre-LN stack (ModernBERT) the residual stream's gradient is one elementwise
  chain from the final norm down to layer 0: adds, and the norms' backward terms (their
  reductions and the dots come in as separate buffers). XLA CPU's fusion pass duplicates
  elementwise producers into every consumer, so each layer's gradient fusion recomputed
  the whole chain above it: the unrolled backward's work grew as L^2 (ModernBERT-base,
  22 layers: a train step 3x transformers'; its compiled HLO had 2.3x the lines at
  L=16 that it had at L=8). A loop boundary is the one cut that pass respects
  (`jax.lax.optimization_barrier` is removed before it, and divisions are duplicated
  too), so on CPU the cotangent goes through a one-trip `while` loop; the trip count
  and the factor are a runtime 1 (1 + 0 * g[0, ..., 0]) that XLA cannot fold away. A
  NaN or inf there makes it NaN: 0 trips, g unchanged. Elsewhere (TPU, GPU) it is a plain
  identity, chosen when lowering (`jax.lax.platform_dependent`). Values and gradients
  are unchanged on every platform.
  """
  return x


def _barrier_fwd(x):
  return x, None


def _loop_cut(g):
  one = 1.0 + 0.0 * g[(0,) * g.ndim]
  _, g = jax.lax.while_loop(lambda c: c[0] < one.astype(jnp.int32),
                            lambda c: (c[0] + 1, c[1] * one), (jnp.int32(0), g))
  return g


def _barrier_bwd(_, g):
  return (jax.lax.platform_dependent(g, cpu=_loop_cut, default=lambda g: g),)


cotangent_barrier.defvjp(_barrier_fwd, _barrier_bwd)


def _runs(mapping: Seq[int]):
  """[(param set, first layer, number of consecutive layers)] of a layer -> set mapping."""
  runs = []
  for i, j in enumerate(mapping):
    if runs and runs[-1][0] == j:
      runs[-1][2] += 1
    else:
      runs.append([j, i, 1])
  return runs


class Stack(nn.Module):
  """x (B,T,D), inputs: AttentionInputs -> (B,T,D) through `num_layers` layers.

  `block(j)` returns the block factory of parameter set j (a module class or partial,
  called as block(x, inputs, deterministic)). Without `layer_to_param`, layer i has its
  own set i. With it (ALBERT's cross-layer sharing), layer i runs set `layer_to_param[i]`.
  `scan=True` runs the layers as `nn.scan`: over stacked params (L // period iterations of
  one period of `period` blocks; block(i) must then depend only on i % period), or, with
  sharing, over each run of layers that share a set (params broadcast).
  """
  num_layers: int
  block: Callable[[int], Callable[..., nn.Module]]
  layer_to_param: Optional[Seq[int]] = None
  param_name: str = "layer"
  scan: bool = False
  period: int = 1

  @nn.compact
  def __call__(self, x, inputs: AttentionInputs, deterministic: bool = True):
    def body(block, carry, inputs):
      return block(carry, inputs, deterministic), None

    if self.layer_to_param is not None:
      sets = {}
      for j, first, length in _runs(self.layer_to_param):
        if j not in sets:
          sets[j] = self.block(j)(name=f"{self.param_name}_{j}")
        if self.scan and length > 1:
          scanned = nn.scan(body, variable_broadcast="params",
                            split_rngs={"params": False, "dropout": True},
                            in_axes=(nn.broadcast,), length=length)
          x, _ = scanned(sets[j], x, inputs)
        else:
          for _ in range(length):
            x = sets[j](cotangent_barrier(x), inputs, deterministic)
      return x
    if not self.scan:
      for i in range(self.num_layers):
        x = self.block(i)(name=f"{self.param_name}_{i}")(cotangent_barrier(x), inputs,
                                                          deterministic)
      return x
    p = self.period
    repeats = self.num_layers // p
    if repeats:
      unit = (self.block(0) if p == 1 else
              lambda name: Sequence(tuple(self.block(r) for r in range(p)), name=name))
      scanned = nn.scan(body, variable_axes={"params": 0},
                        split_rngs={"params": True, "dropout": True},
                        in_axes=(nn.broadcast,), length=repeats,
                        metadata_params={nn.PARTITION_NAME: SCANNED_LAYERS})
      x, _ = scanned(unit(name=SCANNED_LAYERS), x, inputs)
    for i in range(repeats * p, self.num_layers):
      x = self.block(i)(name=f"{self.param_name}_{i}")(cotangent_barrier(x), inputs,
                                                        deterministic)
    return x


def _stack(xs):
  return jnp.stack(xs) if isinstance(xs[0], jax.Array) else np.stack(xs)


def stack_layer_params(tree: dict, num_layers: int, period: int = 1) -> dict:
  """Per-layer params {"layer_0": t0, ..., "layer_{L-1}": t} (anywhere in the tree) -> the
  scanned layout of `Stack(scan=True, period=period)`: {"layers": stacked} with a
  leading (L // period,) axis, plus the unscanned tail layers."""
  names = [f"layer_{i}" for i in range(num_layers)]
  if all(n in tree for n in names) and isinstance(tree[names[0]], dict):
    repeats = num_layers // period
    out = {k: v for k, v in tree.items() if k not in names[:repeats * period]}
    if repeats:
      if period == 1:
        out[SCANNED_LAYERS] = jax.tree.map(lambda *xs: _stack(xs), *[tree[n] for n in names])
      else:
        out[SCANNED_LAYERS] = {
            f"layer_{r}": jax.tree.map(lambda *xs: _stack(xs),
                                       *[tree[names[k * period + r]] for k in range(repeats)])
            for r in range(period)}
    return out
  return {k: stack_layer_params(v, num_layers, period) if isinstance(v, dict) else v
          for k, v in tree.items()}


def unstack_layer_params(tree: dict, period: int = 1) -> dict:
  """The inverse of `stack_layer_params`."""
  out = {}
  for k, v in tree.items():
    if k == SCANNED_LAYERS and isinstance(v, dict):
      n = jax.tree.leaves(v)[0].shape[0]
      for rep in range(n):
        for r in range(period):
          sub = v if period == 1 else v[f"layer_{r}"]
          out[f"layer_{rep * period + r}"] = jax.tree.map(lambda x, rep=rep: x[rep], sub)
    elif isinstance(v, dict):
      out[k] = unstack_layer_params(v, period)
    else:
      out[k] = v
  return out
