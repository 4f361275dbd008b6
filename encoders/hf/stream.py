"""Streamed loading of HF safetensors directories, optionally straight onto a mesh.

`load` (what `encoders.from_hf` runs) never holds the checkpoint in host memory:

- `Tensors` reads only the safetensors headers up front; a tensor's bytes are read when
  a rule needs them, through a memory map of just that tensor that is closed right after
  (so resident memory stays at about one tensor, not the file).
- Rules that move one HF tensor to one param of ours ("vector", "embedding", "linear",
  with or without vocabulary padding) are read per shard: `jax.make_array_from_callback`
  asks for each of this process's devices' index in our layout, and that index is mapped
  back to the HF layout (a transpose, and a flattening of head dims that is one
  contiguous range when the shard cuts whole heads), so each process reads only the
  slices its devices hold. Other rules (split, concat, a shard that is not one range)
  read their tensors whole, one rule at a time, and are cut from that.
- With `mesh`, each param is placed by its logical axes through `rules` (default
  encoders.sharding_rules.DEFAULT_RULES); `shardings` (a params-shaped tree of
  shardings, e.g. the trainer's) overrides that per param. Without either, params land
  on the default device as before.

Every check of the in-memory path is kept: missing, unexpected and mis-shaped tensors,
tied weights (compared in row blocks), computed tables, the mapping's coverage. Before
any tensor is read, each file's header is checked (`read_header`: its length, dtypes,
shapes and offsets; a sharded index naming a missing file); as each tensor streams in,
it is refused when stored as integers, or holding NaN / inf (unless `allow_nonfinite`).

A directory that `launch.convert` wrote from an HF one (config.json + our params as an
Orbax checkpoint under `params/`, no safetensors) loads the same way: Orbax restores each
param straight onto its sharding.
"""
import json
import math
import os
from typing import Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
from flax import traverse_util

from encoders import base, layers
from encoders.hf import rules as rules_lib
from encoders.hf.mapping import architecture, family_hook, hf_config, mapping_for
from encoders.hf.rules import expand, import_rule
from encoders.sharding_rules import DEFAULT_RULES, rules_tuple

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
           "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32, "I16": np.int16,
           "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_PLAIN = ("vector", "embedding", "linear")  # kinds read per shard
_TIE_BLOCK = 4096  # rows compared at a time when checking tied weights


MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on a file's JSON header
_CHECK_BLOCK = 1 << 24  # elements tested for finiteness at a time (bounded temporaries)


def weight_files(path: str):
  """The safetensors files of an HF directory (single or sharded). Refuses pickle, and an
  index that is malformed or names a shard that is not there."""
  single = os.path.join(path, "model.safetensors")
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.isfile(single):
    return [single]
  if os.path.isfile(index):
    try:
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
      names = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
      raise ValueError(f"{index} is not a safetensors index (a JSON object with a "
                       f"'weight_map' of tensor -> file): {type(e).__name__}: {e}") from None
    if not names:
      raise ValueError(f"{index}: its weight_map names no file")
    for name in names:
      if not isinstance(name, str) or os.path.basename(name) != name or name in (".", ".."):
        raise ValueError(f"{index} names shard {name!r}, which is not a file name in "
                         f"{path}")
      if not os.path.isfile(os.path.join(path, name)):
        raise ValueError(f"{index} names shard {name}, which is missing from {path}")
    return [os.path.join(path, name) for name in names]
  if any(os.path.isfile(os.path.join(path, n)) for n in ("pytorch_model.bin", "tf_model.h5")):
    raise ValueError(f"{path} holds only a pickle-based checkpoint (pytorch_model.bin); "
                     "encoder-zoo never unpickles files. Convert it to safetensors first "
                     "(e.g. save_pretrained(..., safe_serialization=True) in a trusted "
                     "environment).")
  raise ValueError(f"no model.safetensors or model.safetensors.index.json in {path}")


def read_header(name: str):
  """The checked header of safetensors file `name` -> ({key: (dtype, shape, absolute byte
  offset)}, data bytes). Everything is checked before a tensor byte is read: the header
  length against the file and MAX_HEADER_BYTES, the JSON, every entry's dtype, shape and
  offsets (inside the file, not negative, not overlapping, the byte size of the shape).
  Every error names the file, and the tensor where there is one."""
  size = os.path.getsize(name)
  with open(name, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise ValueError(f"{name}: {size} bytes, too short for a safetensors file")
    n = int.from_bytes(head, "little")
    if n > MAX_HEADER_BYTES:
      raise ValueError(f"{name}: header length {n} bytes exceeds the "
                       f"{MAX_HEADER_BYTES}-byte limit; not a safetensors file, or corrupt")
    if n > size - 8:
      raise ValueError(f"{name}: header length {n} bytes is larger than the file "
                       f"({size} bytes); truncated or not a safetensors file")
    raw = f.read(n)
  try:
    header = json.loads(raw)
  except (ValueError, UnicodeDecodeError) as e:
    raise ValueError(f"{name}: the safetensors header is not valid JSON ({e})") from None
  if not isinstance(header, dict):
    raise ValueError(f"{name}: the safetensors header is not a JSON object")
  data = size - 8 - n
  entries, spans = {}, []
  for key, meta in header.items():
    if key == "__metadata__":
      continue
    where = f"{name}: tensor {key!r}"
    if not isinstance(meta, dict) or not {"dtype", "shape", "data_offsets"} <= set(meta):
      raise ValueError(f"{where}: header entry needs dtype, shape and data_offsets")
    if meta["dtype"] not in _DTYPES:
      raise ValueError(f"{where} has dtype {meta['dtype']}, which encoder-zoo does not "
                       f"read (supported: {sorted(_DTYPES)})")
    shape, offsets = meta["shape"], meta["data_offsets"]
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
      raise ValueError(f"{where} has shape {shape!r}; expected a list of non-negative ints")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(
        isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
      raise ValueError(f"{where} has data_offsets {offsets!r}; expected [start, end]")
    start, end = offsets
    if start < 0 or end < start:
      raise ValueError(f"{where} has data_offsets [{start}, {end}]: negative or reversed")
    if end > data:
      raise ValueError(f"{where} has data_offsets [{start}, {end}] past the end of the "
                       f"file's {data} data bytes; truncated or corrupt")
    dtype, shape = np.dtype(_DTYPES[meta["dtype"]]), tuple(shape)
    if end - start != math.prod(shape) * dtype.itemsize:
      raise ValueError(f"{where} header is inconsistent (shape {shape} of "
                       f"{meta['dtype']} is {math.prod(shape) * dtype.itemsize} bytes, its "
                       f"data_offsets span {end - start} bytes)")
    spans.append((start, end, key))
    entries[key] = (dtype, shape, 8 + n + start)
  reach, holder = 0, None  # the furthest end so far, and whose it is
  for start, end, key in sorted(spans):
    if end == start:  # zero-size tensors overlap nothing
      continue
    if start < reach:
      raise ValueError(f"{name}: tensors {holder!r} and {key!r} overlap (their bytes "
                       f"share [{start}, {min(end, reach)}))")
    reach, holder = end, key
  return entries, data


def is_float(dtype) -> bool:
  return dtype.kind == "f" or dtype == ml_dtypes.bfloat16


def count_nonfinite(value: np.ndarray) -> int:
  """Non-finite (NaN, inf) elements of float array `value`, in blocks (the temporaries
  stay small however large the tensor)."""
  flat = value.reshape(-1)
  bad = 0
  for i in range(0, flat.size, _CHECK_BLOCK):
    part = flat[i:i + _CHECK_BLOCK]
    if not np.isfinite(part).all():
      bad += int(part.size - np.count_nonzero(np.isfinite(part)))
  return bad


class Tensors:
  """The tensors of an HF directory, by key, read on demand (floats as float32).

  Only headers are read at construction (and checked: `read_header`). `tensors[key]`
  reads a whole tensor; `read(key, index)` only the part `index` (a tuple of slices).
  A read refuses a tensor stored with an integer or bool dtype (every param is a float)
  and, unless `allow_nonfinite`, one holding NaN or inf; both errors name the file and
  the tensor. The finiteness check runs on each part as it is read, so it costs no more
  memory than the read itself."""

  def __init__(self, path: str, allow_nonfinite: bool = False):
    self.allow_nonfinite = allow_nonfinite
    self.entries = {}  # key -> (file, dtype, shape, byte offset)
    for name in weight_files(path):
      entries, _ = read_header(name)
      for key, (dtype, shape, offset) in entries.items():
        if key in self.entries:
          raise ValueError(f"tensor {key!r} is stored twice: in {self.entries[key][0]} "
                           f"and in {name}")
        self.entries[key] = (name, dtype, shape, offset)

  def strip_prefix(self, prefix: str):
    """HF files name base-model tensors with or without `prefix.`; drop it (in place)."""
    if prefix:
      self.entries = {(k[len(prefix) + 1:] if k.startswith(prefix + ".") else k): v
                      for k, v in self.entries.items()}

  def shape(self, key: str) -> Tuple[int, ...]:
    return self.entries[key][2]

  def read(self, key: str, index=None) -> np.ndarray:
    """Float tensor `key` (or its part `index`) as float32, checked (class docstring)."""
    name, dtype, shape, _ = self.entries[key]
    if not is_float(dtype):
      raise ValueError(f"{name}: tensor {key!r} is stored as {dtype.name}, but every "
                       "encoder-zoo param is floating point; refusing to convert integers "
                       "into weights (a corrupt or mislabelled file)")
    value = self.read_raw(key, index)
    if not self.allow_nonfinite:
      bad = count_nonfinite(value)
      if bad:
        raise ValueError(
            f"{name}: tensor {key!r} holds {bad} non-finite value(s) (NaN or inf)"
            f"{'' if index is None else ' in the part read'}; refusing to load it. Pass "
            "allow_nonfinite=True to load it anyway.")
    return value

  def read_raw(self, key: str, index=None) -> np.ndarray:
    """Tensor `key` (or its part `index`) as stored, floats as float32; unchecked."""
    name, dtype, shape, offset = self.entries[key]
    out_dtype = np.float32 if is_float(dtype) else dtype
    if math.prod(shape) == 0:
      value = np.zeros(shape, out_dtype)
      return value if index is None else value[index]
    mm = np.memmap(name, dtype=dtype, mode="r", offset=offset, shape=shape)
    try:
      return np.array(mm if index is None else mm[index], dtype=out_dtype)
    finally:
      mm._mmap.close()  # unmap now: resident pages must not pile up across tensors

  def __getitem__(self, key):
    return self.read(key)

  def __contains__(self, key):
    return key in self.entries

  def __iter__(self):
    return iter(self.entries)

  def __len__(self):
    return len(self.entries)

  def keys(self):
    return self.entries.keys()


# ---- one shard of a plain rule ------------------------------------------------------------

def _ranges(index, shape):
  return [slice(*s.indices(n)[:2]) for s, n in zip(index, shape)]


def _flat_range(shape, index) -> Optional[Tuple[int, int]]:
  """The flat (row-major) range that `index` selects in `shape`, if it is one range."""
  if not shape:
    return 0, 1
  lengths = [s.stop - s.start for s in index]
  if not all(lengths):
    return 0, 0
  k = next((i for i, n in enumerate(lengths) if n != 1), len(shape) - 1)
  if any(lengths[i] != shape[i] for i in range(k + 1, len(shape))):
    return None
  start = int(np.ravel_multi_index([s.start for s in index], shape))
  return start, start + math.prod(lengths)


def _read_rows(tensors, key, rows, rest, vocab_rows):
  """HF tensor `key`[rows, *rest] with rows past `vocab_rows` (our padding) as zeros."""
  r0, r1 = rows
  stop = min(r1, vocab_rows) if vocab_rows is not None else r1
  value = tensors.read(key, (slice(r0, max(stop, r0)),) + tuple(rest))
  if stop < r1:
    pad = np.zeros((r1 - max(stop, r0),) + value.shape[1:], value.dtype)
    value = np.concatenate([value, pad], axis=0)
  return value


def _shard(rule, tensors, ours, index, cfg) -> Optional[np.ndarray]:
  """Our `index` of the param of plain `rule` (shape `ours`), read from its HF tensor
  alone; None when that part is not one block of the HF tensor."""
  index = _ranges(index, ours)
  key = rule.hf_keys[0]
  vocab = cfg.vocab_size if rule.vocab else None
  lengths = [s.stop - s.start for s in index]
  if rule.kind == "linear":
    n_in = rule.n_in if rule.shape is not None else 1
    cols = _flat_range(ours[:n_in], index[:n_in])
    rows = _flat_range(ours[n_in:], index[n_in:])
    if cols is None or rows is None:
      return None
    return _read_rows(tensors, key, rows, (slice(*cols),), vocab).T.reshape(lengths)
  if rule.shape is not None:  # a declared vector: HF's is our shape flattened
    rows = _flat_range(ours, index)
    if rows is None:
      return None
    return _read_rows(tensors, key, rows, (), vocab).reshape(lengths)
  if not index:  # a scalar
    return tensors.read(key)
  return _read_rows(tensors, key, (index[0].start, index[0].stop), index[1:], vocab)


def _check_plain(rule, tensors, shapes, cfg):
  """The checks `rules.import_rule` makes for a plain rule, without reading data."""
  path = rule.our_paths[0]
  ours = rules_lib._our_shape(rule, path, shapes)
  want = rules_lib.hf_shape(rule.kind, ours, rule.n_in, rule.shape is not None)
  if rule.vocab:
    want = (cfg.vocab_size,) + tuple(want[1:])
  key = rule.hf_keys[0]
  if key not in tensors:
    raise ValueError(f"tensor {key!r} (needed for {path}) is missing")
  got = tensors.shape(key)
  if tuple(got) != tuple(want):
    raise ValueError(f"tensor {key!r} has shape {tuple(got)}, expected {tuple(want)} (for "
                     f"{path}); encoder-zoo reshapes only where its mapping declares a "
                     "reshape")
  return ours


def _place(shape, dtype, sharding, read):
  """A jax.Array of `shape` from `read(index)` (numpy), on `sharding` or the default
  device."""
  if sharding is None:
    return jnp.asarray(read(tuple(slice(None) for _ in shape)), dtype)
  cache = {}

  def callback(index):
    k = tuple((s.start, s.stop) for s in _ranges(index, shape))
    if k not in cache:  # replicated shards ask for the same part
      cache[k] = np.asarray(read(index), dtype)
    return cache[k]
  return jax.make_array_from_callback(tuple(shape), sharding, callback)


def _check_tied(tensors, tied, source, path):
  a, b = tensors.shape(tied), tensors.shape(source)
  same = a == b
  for r in range(0, a[0] if (same and a) else 0, _TIE_BLOCK):
    rows = (slice(r, min(r + _TIE_BLOCK, a[0])),)
    if not np.array_equal(tensors.read(tied, rows), tensors.read(source, rows),
                          equal_nan=True):  # NaN only gets here with allow_nonfinite
      same = False
      break
  if same and not a:
    same = np.array_equal(tensors.read(tied), tensors.read(source), equal_nan=True)
  if not same:
    raise ValueError(f"{path}: {tied!r} differs from {source!r}; encoder-zoo ties them "
                     "and does not support untied weights")


# ---- the loader ---------------------------------------------------------------------------

def _boxed(model):
  ids = jnp.zeros((1, 8), jnp.int32)
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), ids))["params"]


def _flat_shardings(tree):
  """A params-shaped tree of shardings -> {"a/b/kernel": sharding}."""
  if tree is None:
    return {}
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(str(getattr(k, "key", k)) for k in path): s for path, s in leaves}


def _rule_shardings(boxed, mesh, rules):
  specs = nn.get_partition_spec(boxed)
  return traverse_util.flatten_dict(nn.logical_to_mesh_sharding(
      specs, mesh, rules_tuple(DEFAULT_RULES if rules is None else rules)), sep="/")


def _import_tensors(path, tensors, mapping, hf, arch, cfg, expected, shapes, place_at,
                    dtype_of):
  """The HF tensors through the mapping's rules -> {our path: placed jax.Array}."""
  tensors.strip_prefix(mapping.base_prefix(hf))
  flat, used = {}, set()
  try:
    for rule in expand(mapping.rules(cfg), cfg):
      if rule.kind in _PLAIN and len(rule.our_paths) == 1:
        key = rule.our_paths[0]
        ours = _check_plain(rule, tensors, shapes, cfg)
        whole = {}

        def read(index, rule=rule, ours=ours, whole=whole):
          part = _shard(rule, tensors, ours, index, cfg)
          if part is None:  # not one block: convert the whole tensor once, then cut
            if "v" not in whole:
              whole["v"] = import_rule(rule, tensors, shapes, cfg)[rule.our_paths[0]]
            part = whole["v"][tuple(index)]
          return part
        flat[key] = _place(ours, dtype_of(key), place_at.get(key), read)
      else:
        for key, value in import_rule(rule, tensors, shapes, cfg).items():
          flat[key] = _place(value.shape, dtype_of(key), place_at.get(key),
                             lambda index, v=value: v[tuple(index)])
      used.update(k for k in rule.hf_keys if k in tensors)
  except ValueError as e:
    raise ValueError(f"{path}: {e}") from None
  for tied, source in mapping.tied.items():
    if tied in tensors:
      used.add(tied)
      _check_tied(tensors, tied, source, path)
  unexpected = sorted(k for k in tensors if k not in used and not mapping.is_ignorable(k))
  if unexpected:
    raise ValueError(f"{path}: unexpected tensors not used by {arch} in encoder-zoo: "
                     f"{', '.join(unexpected[:20])}")
  missing, extra = sorted(set(expected) - set(flat)), sorted(set(flat) - set(expected))
  if missing or extra:
    raise ValueError(f"{path}: the {hf['model_type']} mapping does not cover the model's "
                     f"parameters; missing {missing}, extra {extra}")
  return flat


ORBAX_PARAMS = "params"  # the Orbax item of a converted directory (launch/convert.py)


def is_orbax_dir(path: str) -> bool:
  """A directory `launch.convert` wrote from an HF one: config.json (HF's) plus our
  params as an Orbax checkpoint under `params/`, instead of safetensors."""
  return (os.path.isdir(os.path.join(path, ORBAX_PARAMS))
          and not os.path.isfile(os.path.join(path, "model.safetensors"))
          and not os.path.isfile(os.path.join(path, "model.safetensors.index.json")))


def _restore_orbax(path, expected, place_at, dtype_of, vocab_size):
  """Our params from the Orbax item, restored straight onto their shardings (Orbax reads
  each process's slices). Stored unscanned, float32 and without vocabulary padding, as
  `launch.convert` writes; padding rows (vocab_pad_multiple) are added here as zeros."""
  import orbax.checkpoint as ocp  # slow to import; only converted directories need it
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  item = os.path.join(os.path.abspath(path), ORBAX_PARAMS)
  with ocp.StandardCheckpointer() as ckpt:
    stored = {k: tuple(v.shape) for k, v in
              traverse_util.flatten_dict(ckpt.metadata(item).item_metadata.tree,
                                         sep="/").items()}
    padded = {k for k, v in expected.items() if k in stored and len(v.shape) >= 1
              and stored[k] == (vocab_size,) + tuple(v.shape[1:]) and v.shape[0] > vocab_size}
    missing = sorted(set(expected) - set(stored))
    extra = sorted(set(stored) - set(expected))
    wrong = sorted(k for k in expected if k in stored and k not in padded
                   and stored[k] != tuple(expected[k].shape))
    if missing or extra or wrong:
      raise ValueError(f"{path}: the Orbax params do not match the model of its config.json"
                       f" (missing {missing[:10]}, unexpected {extra[:10]}, mis-shaped "
                       f"{wrong[:10]})")
    target = {}
    for key in expected:
      where = place_at.get(key, device)
      if key in padded:  # restored whole (replicated), padded below onto its sharding
        where = jax.sharding.NamedSharding(where.mesh, jax.sharding.PartitionSpec()) if (
            isinstance(where, jax.sharding.NamedSharding)) else device
      target[key] = jax.ShapeDtypeStruct(stored[key], dtype_of(key), sharding=where)
    flat = traverse_util.flatten_dict(
        ckpt.restore(item, traverse_util.unflatten_dict(target, sep="/")), sep="/")
  for key in padded:
    rows = expected[key].shape[0] - vocab_size
    pad = lambda x, rows=rows: jnp.pad(x, [(0, rows)] + [(0, 0)] * (x.ndim - 1))  # noqa: E731
    flat[key] = jax.jit(pad, out_shardings=place_at.get(key, device))(flat[key])
  return flat


def check_finite(flat, what: str):
  """Raises ValueError naming the first param of {path: jax.Array} `flat` holding NaN or
  inf (checked on its devices; one scalar per param comes back)."""
  finite = jax.jit(lambda x: jnp.all(jnp.isfinite(x)))
  for key in sorted(flat):
    x = flat[key]
    if jnp.issubdtype(x.dtype, jnp.floating) and not bool(
        np.asarray(finite(x).addressable_data(0))):
      raise ValueError(f"{what} {key!r} holds non-finite values (NaN or inf); refusing to "
                       "load it. Pass allow_nonfinite=True to load it anyway.")


def config(path: str, heads: Optional[Sequence[str]] = None, *, allow_nonfinite=False,
           **overrides):
  """The model config of an HF directory (no tensor data is read; the safetensors headers
  are checked). -> (cfg, mapping, architecture, hf config dict, Tensors)."""
  hf = hf_config(path)
  mapping = mapping_for(hf.get("model_type"))
  tensors = None if is_orbax_dir(path) else Tensors(path, allow_nonfinite)
  arch = architecture(mapping, hf)
  _, arch_heads = mapping.architectures[arch]
  cfg = mapping.config_from_hf(hf, tuple(heads) if heads is not None else arch_heads)
  for key, value in overrides.items():
    cfg[key] = value
  return cfg, mapping, arch, hf, tensors


def load(path: str, heads: Optional[Sequence[str]] = None, *, mesh=None, rules=None,
         shardings=None, param_dtype=None, allow_nonfinite=False, **overrides):
  """-> (model, params): see the module docstring and `encoders.from_hf`."""
  cfg, mapping, arch, hf, tensors = config(path, heads, allow_nonfinite=allow_nonfinite,
                                           **overrides)
  model = base.build(cfg)
  final_shardings = _flat_shardings(shardings)
  if mesh is None and final_shardings:
    mesh = next(iter(final_shardings.values())).mesh
  scan = cfg.get("scan_layers", False)
  flat_model = model
  if scan:  # rules name layers unscanned; stacked at the end
    flat_cfg = ml_collections.ConfigDict(cfg.to_dict())
    flat_cfg.scan_layers = False
    flat_model = base.build(flat_cfg)
  boxed = _boxed(flat_model)
  expected = traverse_util.flatten_dict(nn.unbox(boxed), sep="/")
  shapes = {k: tuple(v.shape) for k, v in expected.items()}
  place_at = {}
  if mesh is not None:
    place_at = _rule_shardings(boxed, mesh, rules)
    if not scan:
      place_at.update({k: v for k, v in final_shardings.items() if k in place_at})

  def dtype_of(key):
    return np.dtype(param_dtype or expected[key].dtype)

  if tensors is None:
    flat = _restore_orbax(path, expected, place_at, dtype_of, cfg.vocab_size)
    if not allow_nonfinite:
      check_finite(flat, f"{os.path.join(path, ORBAX_PARAMS)}: param")
  else:
    flat = _import_tensors(path, tensors, mapping, hf, arch, cfg, expected, shapes, place_at,
                           dtype_of)
  params = traverse_util.unflatten_dict({key: flat.pop(key) for key in expected}, sep="/")
  if scan:
    stack = family_hook(cfg, "scan_params", lambda c, p: layers.stack_layer_params(
        p, c.num_hidden_layers))
    if mesh is None:
      params = stack(cfg, params)
    else:
      out = _rule_shardings(_boxed(model), mesh, rules)
      out.update({k: v for k, v in final_shardings.items() if k in out})
      tree = traverse_util.unflatten_dict(out, sep="/")
      params = jax.jit(lambda p: stack(cfg, p), out_shardings=tree)(params)
  return model, params


def placed_bytes(params) -> int:
  """Bytes the params take on all devices together (replicas counted)."""
  return sum(s.data.nbytes for x in jax.tree.leaves(params) for s in x.addressable_shards)


__all__ = ["Tensors", "weight_files", "config", "load", "placed_bytes"]
