"""Tensor rules: the declarative part of an HF mapping, its one expander, and the
per-kind conversions that import (HF -> ours) and export (ours -> HF) use.

Pure numpy; nothing here knows a family. See encoders/hf/__init__.py for the API overview.
Every shape is checked exactly: a tensor is reshaped only where its rule declares our
`shape`, and any other difference is an error that names the HF key, the expected and the
actual shape.
"""
import dataclasses
import math
import re
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

PLAIN = ("vector", "embedding")  # same layout in both (two names, for the reader)
KINDS = PLAIN + ("linear", "split", "concat", "computed")
Shape = Tuple[int, ...]
_PLACEHOLDER = re.compile(r"\{[^{}]*\}")


@dataclasses.dataclass(frozen=True)
class Rule:
  """One HF tensor <-> one of our params (or several, for split/concat).

  ours: our param path(s), "a/b/kernel" (a tuple for "split"; "" for "computed").
  hf: the HF key(s), without the base-model prefix when `base` (a tuple for "concat").
  kind: "vector"/"embedding" (same layout), "linear" (HF (out, in) <-> our kernel
    (in..., out...)), "split", "concat" or "computed".
  shape: our shape, a tuple or `cfg -> tuple`. Declaring it is what allows a reshape:
    "linear" then flattens our kernel to HF's (prod(shape[n_in:]), prod(shape[:n_in]));
    "vector" flattens it to (prod(shape),). Without it the layouts must agree exactly
    (a linear kernel is then (in, out) against HF (out, in)).
  n_in: with a declared linear shape, how many leading dims of our kernel are inputs.
  base: the key lies under the base model's prefix ("bert.") in files that have one.
  vocab: HF's axis 0 is the vocabulary; ours may have padding rows (zero on import, cut
    off on export).
  of, axis, sizes: "split" and "concat": the kind of each part (vector or linear; with
    `shape` and `n_in` applying to each part for "split" and to the whole for "concat"),
    the HF-layout axis the parts are joined on, and for "concat" the parts' extents along
    it (default: equal).
  compute, atol: "computed": `cfg -> np.ndarray` in HF layout; an imported tensor must
    equal it within `atol`, and export writes it.
  groups: "split" only: the HF axis holds `groups` equal blocks, each with every part's
    1/groups share side by side (DeBERTa v1's fused `in_proj`: per head, its q, k and v
    rows); 1 (the default): the parts lie one after another.
  """
  ours: Union[str, Tuple[str, ...]]
  hf: Union[str, Tuple[str, ...]]
  kind: str = "vector"
  shape: Optional[Union[Shape, Callable]] = None
  n_in: int = 1
  base: bool = True
  vocab: bool = False
  of: str = "vector"
  axis: int = 0
  sizes: Optional[Tuple[int, ...]] = None
  compute: Optional[Callable] = None
  atol: float = 1e-4
  groups: int = 1

  @property
  def our_paths(self) -> Tuple[str, ...]:
    if isinstance(self.ours, str):
      return (self.ours,) if self.ours else ()
    return tuple(self.ours)

  @property
  def hf_keys(self) -> Tuple[str, ...]:
    return (self.hf,) if isinstance(self.hf, str) else tuple(self.hf)

  def format(self, index: Mapping[str, int]) -> "Rule":
    """The rule with "{name}" placeholders in `ours` and `hf` filled from `index`."""
    def fill(x):
      if isinstance(x, str):
        return x.format(**index)
      return tuple(s.format(**index) for s in x)
    return dataclasses.replace(self, ours=fill(self.ours), hf=fill(self.hf))


@dataclasses.dataclass(frozen=True)
class PerLayer:
  """A rule template repeated once per index dict, e.g. indices=[{"i": 0}, {"i": 1}] for
  "encoder/layer_{i}/..." <-> "encoder.layer.{i}....", or [{"g": 0, "j": 0}, ...] for
  grouped layers. `layer_indices(n)` builds the common range(n) case."""
  rules: Sequence[Rule]
  indices: Sequence[Mapping[str, int]]


def layer_indices(n: int, name: str = "i") -> List[Dict[str, int]]:
  """[{name: 0}, ..., {name: n - 1}]: the index dicts of n plainly numbered layers."""
  return [{name: i} for i in range(n)]


Table = Sequence[Union[Rule, PerLayer]]


def expand(table: Table, cfg) -> List[Rule]:
  """A mapping's table -> the flat list of concrete rules (placeholders filled, shapes
  resolved from `cfg`). Errors on an unknown kind, a malformed rule, an unfilled
  placeholder, or an HF key / our path claimed twice."""
  out = []
  for item in table:
    if isinstance(item, PerLayer):
      for index in item.indices:
        out += [r.format(index) for r in item.rules]
    elif isinstance(item, Rule):
      out.append(item)
    else:
      raise TypeError(f"a mapping table holds Rule and PerLayer items, not {item!r}")
  out = [dataclasses.replace(r, shape=r.shape(cfg)) if callable(r.shape) else r for r in out]
  seen_hf, seen_ours = {}, {}
  for r in out:
    _validate(r)
    for key in r.hf_keys:
      if key in seen_hf:
        raise ValueError(f"HF mapping: tensor {key!r} is claimed by two rules")
      seen_hf[key] = r
    for path in r.our_paths:
      if path in seen_ours:
        raise ValueError(f"HF mapping: param {path!r} is claimed by two rules")
      seen_ours[path] = r
  return out


def _validate(r: Rule):
  if r.kind not in KINDS:
    raise ValueError(f"HF mapping: unknown rule kind {r.kind!r} for {r.hf!r}; use {KINDS}")
  names = r.our_paths + r.hf_keys
  if any(_PLACEHOLDER.search(n) for n in names):
    raise ValueError(f"HF mapping: unfilled placeholder in {names}")
  n_ours, n_hf = len(r.our_paths), len(r.hf_keys)
  want = {"split": (n_ours >= 2 and n_hf == 1), "concat": (n_ours == 1 and n_hf >= 2),
          "computed": (n_ours == 0 and n_hf == 1 and r.compute is not None)}
  if not want.get(r.kind, n_ours == 1 and n_hf == 1):
    raise ValueError(f"HF mapping: malformed {r.kind!r} rule {r.ours!r} <-> {r.hf!r} (split: "
                     "several ours, one HF key; concat: one ours, several HF keys; computed: "
                     "no ours, one HF key and `compute`; else one and one)")
  if r.kind in ("split", "concat"):
    if r.of not in PLAIN + ("linear",):
      raise ValueError(f"HF mapping: {r.kind} parts of {r.hf!r} must be vector or linear")
    if r.vocab:
      raise ValueError(f"HF mapping: vocab padding is not supported on {r.kind} rules")
  if r.groups != 1 and (r.kind != "split" or r.groups < 1):
    raise ValueError(f"HF mapping: `groups` is for split rules, a positive count ({r.hf!r})")
  if r.sizes is not None and (r.kind != "concat" or len(r.sizes) != n_hf):
    raise ValueError(f"HF mapping: `sizes` is for concat rules, one per HF key ({r.hf!r})")


# ---- per-kind shapes and single-tensor conversions --------------------------------------

def hf_shape(kind: str, ours: Shape, n_in: int = 1, declared: bool = False) -> Shape:
  """HF's shape of a tensor that is `ours` in our layout (vector or linear)."""
  ours = tuple(ours)
  if kind == "linear":
    if not declared and len(ours) != 2:
      raise ValueError(f"HF mapping: a {len(ours)}-d linear kernel {ours} needs a declared "
                       "`shape` (and n_in)")
    return (math.prod(ours[n_in:]), math.prod(ours[:n_in]))
  return (math.prod(ours),) if declared else ours


def _to_ours(kind: str, value: np.ndarray, ours: Shape) -> np.ndarray:
  """HF layout (shape already checked) -> ours."""
  if kind == "linear":
    value = value.T
  return np.ascontiguousarray(value.reshape(ours))


def _to_hf(kind: str, value: np.ndarray, n_in: int, declared: bool) -> np.ndarray:
  if kind == "linear":
    hf_shape(kind, value.shape, n_in, declared)  # raises on an undeclared reshape
    value = value.reshape(math.prod(value.shape[:n_in]), -1).T
  elif declared:
    value = value.reshape(-1)
  return np.ascontiguousarray(value)


def _our_shape(r: Rule, path: str, expected: Dict[str, Shape]) -> Shape:
  """Our shape of `path`: the model's, which a declared `shape` must equal."""
  if path not in expected:
    raise ValueError(f"HF mapping names param {path!r}, which the model does not have")
  model = tuple(expected[path])
  if r.shape is not None and tuple(r.shape) != model:
    raise ValueError(f"HF mapping declares {path!r} as {tuple(r.shape)}; the model's is "
                     f"{model}")
  return model


def _fetch(tensors, key: str, path: str, want: Shape) -> np.ndarray:
  if key not in tensors:
    raise ValueError(f"tensor {key!r} (needed for {path or 'a check'}) is missing")
  value = tensors[key]
  if tuple(value.shape) != tuple(want):
    raise ValueError(f"tensor {key!r} has shape {tuple(value.shape)}, expected "
                     f"{tuple(want)} (for {path}); encoder-zoo reshapes only where its "
                     "mapping declares a reshape")
  return value


def _offsets(extents: Sequence[int]) -> List[int]:
  return list(np.cumsum(extents)[:-1])


def _group_shares(r: Rule, extents: Sequence[int]) -> List[int]:
  """Each part's rows within one of a grouped split's `groups` blocks."""
  bad = [n for n in extents if n % r.groups]
  if bad:
    raise ValueError(f"HF mapping: the parts of {r.hf!r} ({list(extents)} along axis "
                     f"{r.axis}) do not divide into {r.groups} groups")
  return [n // r.groups for n in extents]


def _ungroup(r: Rule, value: np.ndarray, extents: Sequence[int]) -> np.ndarray:
  """A grouped split's HF tensor -> the same parts laid one after another along `axis`."""
  if r.groups == 1:
    return value
  shares = _group_shares(r, extents)
  v = np.moveaxis(value, r.axis, 0)
  blocks = v.reshape((r.groups, sum(shares)) + v.shape[1:])
  parts = np.split(blocks, _offsets(shares), axis=1)
  flat = np.concatenate([p.reshape((-1,) + v.shape[1:]) for p in parts], axis=0)
  return np.moveaxis(flat, 0, r.axis)


def _regroup(r: Rule, value: np.ndarray, extents: Sequence[int]) -> np.ndarray:
  """The inverse of `_ungroup`: parts one after another -> HF's grouped layout."""
  if r.groups == 1:
    return value
  shares = _group_shares(r, extents)
  v = np.moveaxis(value, r.axis, 0)
  parts = np.split(v, _offsets(extents), axis=0)
  blocks = np.concatenate([p.reshape((r.groups, n) + v.shape[1:])
                           for p, n in zip(parts, shares)], axis=1)
  return np.moveaxis(blocks.reshape(v.shape), 0, r.axis)


# ---- import and export of one rule -------------------------------------------------------

def import_rule(r: Rule, tensors: Dict[str, np.ndarray], expected: Dict[str, Shape],
                cfg) -> Dict[str, np.ndarray]:
  """HF tensors (keys as in `r`) -> {our path: value} for one concrete rule. `expected`:
  our path -> the model's shape. A "computed" rule is checked and yields nothing."""
  declared = r.shape is not None
  if r.kind == "computed":
    want = np.asarray(r.compute(cfg), np.float32)
    key = r.hf_keys[0]
    if key in tensors:  # absent is fine: it carries nothing we load
      got = _fetch(tensors, key, "", want.shape)
      err = float(np.max(np.abs(got - want))) if want.size else 0.0
      if not err <= r.atol:
        raise ValueError(f"tensor {key!r} differs from the table encoder-zoo computes "
                         f"(max abs difference {err:.3g} > {r.atol}); it is not loaded")
    return {}
  if r.kind == "split":
    shapes = [_our_shape(r, p, expected) for p in r.our_paths]
    parts = [hf_shape(r.of, s, r.n_in, declared) for s in shapes]
    whole = list(parts[0])
    whole[r.axis] = sum(p[r.axis] for p in parts)
    value = _fetch(tensors, r.hf_keys[0], ", ".join(r.our_paths), tuple(whole))
    extents = [p[r.axis] for p in parts]
    pieces = np.split(_ungroup(r, value, extents), _offsets(extents), axis=r.axis)
    return {p: _to_ours(r.of, v, s) for p, v, s in zip(r.our_paths, pieces, shapes)}
  path = r.our_paths[0]
  ours = _our_shape(r, path, expected)
  if r.kind == "concat":
    whole = hf_shape(r.of, ours, r.n_in, declared)
    extents = _concat_extents(r, whole)
    pieces = []
    for key, n in zip(r.hf_keys, extents):
      part = list(whole)
      part[r.axis] = n
      pieces.append(_fetch(tensors, key, path, tuple(part)))
    return {path: _to_ours(r.of, np.concatenate(pieces, axis=r.axis), ours)}
  want = hf_shape(r.kind, ours, r.n_in, declared)
  rows = want[0]
  if r.vocab:
    want = (cfg.vocab_size,) + tuple(want[1:])
  value = _fetch(tensors, r.hf_keys[0], path, want)
  if r.vocab and rows > cfg.vocab_size:
    value = np.concatenate([value, np.zeros((rows - cfg.vocab_size,) + value.shape[1:],
                                            value.dtype)], axis=0)
  return {path: _to_ours(r.kind, value, ours)}


def _concat_extents(r: Rule, whole: Shape) -> Tuple[int, ...]:
  n = len(r.hf_keys)
  if r.sizes is not None:
    if sum(r.sizes) != whole[r.axis]:
      raise ValueError(f"HF mapping: sizes {r.sizes} of {r.hf!r} do not add up to "
                       f"{whole[r.axis]}")
    return tuple(r.sizes)
  if whole[r.axis] % n:
    raise ValueError(f"HF mapping: {whole[r.axis]} does not split into {n} equal parts "
                     f"for {r.hf!r}; give `sizes`")
  return (whole[r.axis] // n,) * n


def export_rule(r: Rule, params: Dict[str, np.ndarray], cfg) -> Dict[str, np.ndarray]:
  """Our flat params (path -> array) -> {HF key: value} for one concrete rule."""
  declared = r.shape is not None

  def get(path):
    if path not in params:
      raise ValueError(f"HF mapping names param {path!r}, which the params do not have")
    value = np.asarray(params[path], np.float32)
    if declared and tuple(value.shape) != tuple(r.shape):
      raise ValueError(f"param {path!r} has shape {value.shape}; its HF mapping declares "
                       f"{tuple(r.shape)}")
    return value

  if r.kind == "computed":
    return {r.hf_keys[0]: np.ascontiguousarray(np.asarray(r.compute(cfg), np.float32))}
  if r.kind == "split":
    parts = [_to_hf(r.of, get(p), r.n_in, declared) for p in r.our_paths]
    whole = _regroup(r, np.concatenate(parts, axis=r.axis), [p.shape[r.axis] for p in parts])
    return {r.hf_keys[0]: np.ascontiguousarray(whole)}
  value = get(r.our_paths[0])
  if r.kind == "concat":
    whole = _to_hf(r.of, value, r.n_in, declared)
    pieces = np.split(whole, _offsets(_concat_extents(r, whole.shape)), axis=r.axis)
    return {k: np.ascontiguousarray(v) for k, v in zip(r.hf_keys, pieces)}
  value = _to_hf(r.kind, value, r.n_in, declared)
  if r.vocab:
    value = value[:cfg.vocab_size]  # padding rows exist only in our table
  return {r.hf_keys[0]: np.ascontiguousarray(value)}
