"""Mesh, logical-axis rules and the shardings of a train state.

Model code names logical axes only; `config.mesh.rules` maps them to the mesh axes
(data, fsdp, tensor), and this module turns that into NamedShardings for params, optimizer
state and batches.
"""
import math
from typing import Any, Dict, Sequence, Tuple

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

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


def rules_tuple(rules) -> Tuple[Tuple[str, Any], ...]:
  return tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in rules)


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
  axes = dict(rules_tuple(rules)).get("act_batch")
  axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
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
