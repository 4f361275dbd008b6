"""Mesh, logical-axis rules and the shardings of a train state.

Model code names logical axes only; `config.mesh.rules` maps them to the mesh axes
(data, fsdp, tensor), and this module turns that into NamedShardings for params, optimizer
state and batches.
"""
import functools
import math
from typing import Dict, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from encoders.sharding_rules import rules_tuple

MESH_AXES = ("data", "fsdp", "tensor")


def make_mesh(shape: Sequence[int], devices=None) -> Mesh:
  """(data, fsdp, tensor) sizes, one of them may be -1 (= the remaining devices)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = list(shape)
  if len(shape) != 3:
    raise ValueError(f"mesh.shape must have 3 entries (data, fsdp, tensor), got {shape}")
  if shape.count(-1) > 1:
    raise ValueError(f"mesh.shape may contain at most one -1, got {shape}")
  known = int(np.prod([s for s in shape if s != -1]))
  if -1 in shape:
    if len(devices) % known:
      raise ValueError(f"{len(devices)} devices do not divide by mesh {shape}")
    shape[shape.index(-1)] = len(devices) // known
  if int(np.prod(shape)) != len(devices):
    raise ValueError(f"mesh {tuple(shape)} needs {int(np.prod(shape))} devices, "
                     f"have {len(devices)}")
  try:
    arr = jax.experimental.mesh_utils.create_device_mesh(shape, devices)
  except Exception:  # fake CPU devices / AOT topologies without a physical layout
    arr = np.asarray(devices).reshape(shape)
  return Mesh(arr, MESH_AXES)


def _axes(entry) -> Tuple[str, ...]:
  """A PartitionSpec / rules entry (None, an axis name or a tuple of them) as a tuple."""
  return (entry,) if isinstance(entry, str) else tuple(entry or ())


def logical_shardings(boxed_tree, mesh: Mesh, rules):
  """Shardings for a pytree of (abstract) boxed params (nn.LogicallyPartitioned)."""
  specs = nn.get_partition_spec(boxed_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules_tuple(rules))


def _dict_path(path) -> Tuple[str, ...]:
  return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def mirror_shardings(tree, params, param_shardings, mesh: Mesh):
  """Shardings for e.g. an optimizer state: a leaf whose dict path ends with a param's path
  and has its shape (Adam's mu/nu, accumulated grads) gets that param's sharding; any other
  leaf (counts, scalars) is replicated."""
  by_path = {}
  flat_p = jax.tree_util.tree_flatten_with_path(params)[0]
  flat_s = jax.tree.leaves(param_shardings)
  for (path, leaf), s in zip(flat_p, flat_s):
    by_path[_dict_path(path)] = (tuple(leaf.shape), s)
  replicated = NamedSharding(mesh, P())

  def pick(path, leaf):
    names = _dict_path(path)
    for start in range(len(names)):
      shape, s = by_path.get(names[start:], (None, None))
      if s is not None and shape == tuple(getattr(leaf, "shape", ())):
        return s
    return replicated

  return jax.tree_util.tree_map_with_path(pick, tree)


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
  """Rows over the axes `act_batch` maps to; the sequence dim replicated."""
  axes = dict(rules_tuple(rules)).get("act_batch")
  return NamedSharding(mesh, P(axes))


def batch_unit(mesh: Mesh, rules, accum: int = 1) -> int:
  """What a global batch's row count must be a multiple of: the data-parallel shards
  (the mesh axes `act_batch` maps to) and `accum` micro-batches per process."""
  axes = _axes(dict(rules_tuple(rules)).get("act_batch"))
  shards = math.prod(mesh.shape[a] for a in axes)
  return math.lcm(shards, accum * jax.process_count())


def row_sharding(sharding: NamedSharding, ndim: int) -> NamedSharding:
  """For a batch array of `ndim` dims: rows split as `sharding` splits them (see
  `batch_sharding`), every other dim replicated."""
  return NamedSharding(sharding.mesh, P(*sharding.spec[:1], *([None] * (ndim - 1))))


def global_batch(local: Dict[str, np.ndarray], sharding: NamedSharding):
  """This process's rows -> global jax.Arrays sharded over the mesh (multi-host safe)."""
  return {k: jax.make_array_from_process_local_data(row_sharding(sharding, v.ndim), v)
          for k, v in local.items()}


class MeshJit:
  """A jitted step that is traced, lowered and called under `jax.set_mesh(mesh)`, so the
  model's activation constraints (`nn.with_logical_constraint`) and per-shard kernels
  (Splash through shard_map) see the trainer's mesh; without a mesh context they are
  no-ops."""

  def __init__(self, mesh, jitted):
    self.mesh, self.jitted = mesh, jitted

  def __call__(self, *args):
    with jax.set_mesh(self.mesh):
      return self.jitted(*args)

  def lower(self, *args):
    with jax.set_mesh(self.mesh):
      return self.jitted.lower(*args)


# Leaves below this many elements stay as the model shards them under `split_over_data`:
# biases and norms, whose update is cheap and whose gather would cost a collective each.
MIN_SPLIT_SIZE = 1 << 16


def split_over_data(params, shardings, mesh: Mesh, min_size: int = MIN_SPLIT_SIZE):
  """The shardings of the trained params' float32 master copy (and, mirrored, of their
  optimizer state) when `mesh.shard_state_over_data` is on, as in ZeRO (Rajbhandari et
  al. 2020): each leaf of at least `min_size` elements also split over the `data` axis, on
  its first dim whose size still divides by the `data` axis after the model's own split;
  every other leaf keeps the model's sharding. A dim the model maps to a size-1 axis (the
  `fsdp` and `tensor` axes of a data-parallel mesh) thus becomes e.g. (fsdp, data). Each
  data-parallel replica then updates a 1/data share of the params and of Adam's moments
  instead of all of them."""
  n = mesh.shape["data"]

  def split(leaf, s):
    if n == 1 or math.prod(leaf.shape) < min_size:
      return s
    spec = [_axes(a) for a in s.spec] + [()] * (len(leaf.shape) - len(s.spec))
    if any("data" in a for a in spec):
      return s
    for d, size in enumerate(leaf.shape):  # the major-most dim that still divides
      if size % (math.prod(mesh.shape[a] for a in spec[d]) * n) == 0:
        spec[d] = spec[d] + ("data",)
        return NamedSharding(mesh, P(*[a if len(a) > 1 else (a[0] if a else None)
                                       for a in spec]))
    return s

  return jax.tree.map(split, params, shardings)


def _sub_jaxprs(eqn, i):
  """(jaxpr, var) pairs that input `i` of a call-like equation becomes inside it, or None
  when it cannot be followed (then the input counts as read as it is)."""
  open_ = lambda j: j.jaxpr if isinstance(j, jcore.ClosedJaxpr) else j
  name = eqn.primitive.name
  if name == "cond":
    return None if i == 0 else [(open_(b), open_(b).invars[i - 1])
                                for b in eqn.params["branches"]]
  if name == "while":
    nc, nb = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
    cond, body = open_(eqn.params["cond_jaxpr"]), open_(eqn.params["body_jaxpr"])
    if i < nc:
      return [(cond, cond.invars[i])]
    if i < nc + nb:
      return [(body, body.invars[i - nc])]
    return None  # a loop carry
  subs = [open_(v) for v in eqn.params.values()
          if isinstance(v, (jcore.Jaxpr, jcore.ClosedJaxpr))]
  if len(subs) != 1 or len(subs[0].invars) != len(eqn.invars):
    return None
  return [(subs[0], subs[0].invars[i])]


def _only_cast(jaxpr, var, dtype) -> bool:
  """Whether `var` is only ever read through a cast to `dtype` in `jaxpr` (following it into
  nested calls: jit, remat, scan bodies, custom derivatives)."""
  if any(v is var for v in jaxpr.outvars):
    return False
  for eqn in jaxpr.eqns:
    for i, x in enumerate(eqn.invars):
      if x is not var:
        continue
      if eqn.primitive.name == "convert_element_type":
        if eqn.params["new_dtype"] != dtype:
          return False
        continue
      inner = _sub_jaxprs(eqn, i)
      if inner is None or not all(_only_cast(j, v, dtype) for j, v in inner):
        return False
  return True


def cast_on_use(fn, params, dtype):
  """For each leaf of `params`: whether `fn(params)` reads it only through a cast to
  `dtype` (a Dense kernel or embedding table in a bfloat16 model; not DeBERTa's float32
  relative-position table, nor a LayerNorm scale). Read off the jaxpr of `fn`, traced on
  the leaves' shapes (no computation)."""
  dtype = jnp.dtype(dtype)
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  closed = jax.make_jaxpr(fn)(shapes)
  flags = [_only_cast(closed.jaxpr, v, dtype) for v in closed.jaxpr.invars]
  return jax.tree.unflatten(jax.tree.structure(params), flags)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _gather_narrow(x, sharding, dtype):
  """`x` gathered to `sharding` in `dtype` (half the bytes of a float32 gather), handed on
  in x's dtype; a reader that casts it to `dtype` sees exactly its own cast of `x`."""
  return jax.lax.with_sharding_constraint(x.astype(dtype), sharding).astype(x.dtype)


def _gather_narrow_fwd(x, sharding, dtype):
  return _gather_narrow(x, sharding, dtype), None


def _gather_narrow_bwd(sharding, dtype, _, ct):
  # Straight through: the leaf is only read through a cast to `dtype`, whose own derivative
  # is this identity, so the cotangent is the one the plain program computes (the readers'
  # float32 cotangents, summed in float32), not one rounded to `dtype`.
  del sharding, dtype
  return (ct,)


_gather_narrow.defvjp(_gather_narrow_fwd, _gather_narrow_bwd)


def gathered_view(params, shardings, compute_dtype, narrow=None):
  """The trained params as the model reads them, inside a jitted step: each leaf under the
  model's own sharding (`shardings`; for a leaf split over `data` by `split_over_data`, an
  all-gather). The leaves flagged in `narrow` (`cast_on_use`: read only through a cast to
  `compute_dtype`) are gathered in that dtype, which changes no value the model computes
  and no gradient (tests/launch/test_state_split.py checks each family bitwise)."""
  narrow = narrow if narrow is not None else jax.tree.map(lambda _: False, params)

  def view(leaf, s, cast):
    if cast:
      return _gather_narrow(leaf, s, jnp.dtype(compute_dtype))
    return jax.lax.with_sharding_constraint(leaf, s)

  return jax.tree.map(view, params, shardings, narrow)


def state_view(model_shardings, compute_dtype):
  """What the train and eval steps get under `mesh.shard_state_over_data`: view(fn,
  params) -> (p -> `gathered_view` of p), where `fn(params)` is the step's loss on the
  plain params, traced once to find the leaves to gather narrow."""
  narrower = jnp.dtype(compute_dtype).itemsize < 4

  def make(fn, params):
    narrow = cast_on_use(fn, params, compute_dtype) if narrower else None
    return lambda p: gathered_view(p, model_shardings, compute_dtype, narrow)
  return make
