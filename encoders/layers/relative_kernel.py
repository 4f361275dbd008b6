"""DeBERTa's disentangled attention as one Pallas kernel (TPU): the c2p and p2c terms are
computed tile by tile inside a flash-attention loop, so no (B,H,T,T)-sized score, bias or
probability tensor is ever written to memory, forward or backward.

Notation as in `relative.py`: c2p[i, j] = q_i . Pk[row(i - j)], p2c[i, j] = k_j . Pq[row(i - j)]
with (2S,H,K) tables Pk, Pq (projected, already scaled) and row() the bucketed distance.

Tiles are C x C (C = 128, the TPU's lane width). Query block I and key block J see only
the 2C - 1 distances (I - J) C + (-(C-1) .. C-1), so each of the 2T/C - 1 block
diagonals delta = I - J gets its own small (2C, K) slice of the table, laid out so that
one MXU product and one strided lane rotation give the tile's term:

  c2p: A = q_I @ Rk[delta]^T (C, 2C) with column n holding distance delta C + C - n;
       tile[a, b] = A[a, b + C - a] = roll(A, C + a)[a, b]   (`pltpu.roll`, stride 1)
  p2c: B = k_J @ Rq[delta]^T (C, 2C) with column n holding distance delta C + n - C;
       tile[a, b] = B[b, a + C - b], the same rotation of B, transposed.

The backward pass carries the score gradient back onto the (C, 2C) products
(`_unskew_reversed`: the inverse rotation, done on reversed columns because Mosaic's
strided rotation takes no negative stride), then to q / k and to the diagonal tables.
The table gradients accumulate across the batch and all tiles of a head in a resident
VMEM block, so the head axis is the only parallel grid axis of the backward kernels
(12+ heads: enough for both cores of a v4/v5p chip).

Masking follows `masks.make_attention_mask` for segment ids: a key must be real (id > 0);
a real query sees keys of its own segment; a padding query sees every real key. A fully
masked row gets equal weights instead of NaN (a finite mask value), as the dense path's
self-attention rule also avoids NaN.

Work per C x C tile, in C x C x K matmul units: forward 2 + 2 per term; the dq kernel
3 + 2 per term + 4 with c2p; the dk/dv kernel 4 + 2 per term + 4 with p2c
(`matmul_units`, used by launch/perf/kernel_cost.py to price the calls). `interpret=True`
runs the same kernels in the Pallas interpreter on any backend (the CPU tests).
"""
import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from encoders.layers import kernels

Array = jax.Array
BLOCK = 128
KERNEL_NAMES = ("deberta_rel_fwd", "deberta_rel_dq", "deberta_rel_dkv")
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
_NT = (((1,), (1,)), ((), ()))  # x @ y^T
_TN = (((0,), (0,)), ((), ()))  # x^T @ y
_NN = (((1,), (0,)), ((), ()))  # x @ y


def kernel_name(kernel: str, c2p: bool, p2c: bool) -> str:
  """The pallas_call name, which carries the terms (launch/perf/kernel_cost.py reads them)."""
  return kernel + "__" + "_".join(t for t, on in (("c2p", c2p), ("p2c", p2c)) if on)


def matmul_units(kernel: str, c2p: bool, p2c: bool) -> int:
  """C x C x K matmuls per tile of each kernel (see the module docstring); the permutation
  matmul of the backward's `_unskew_reversed` (C x C x C) is not counted."""
  terms = int(c2p) + int(p2c)
  return {"deberta_rel_fwd": 2 + 2 * terms,
          "deberta_rel_dq": 3 + 2 * terms + 4 * int(c2p),
          "deberta_rel_dkv": 4 + 2 * terms + 4 * int(p2c)}[kernel]


def diagonal_tables(table: Array, dist: np.ndarray, t: int, block: int, term: str) -> Array:
  """(2S,H,K) table, `dist` the (2T-1,) row of each distance -(T-1)..T-1 ->
  (H, 2T/C - 1, 2C, K): per block diagonal delta = I - J, the 2C rows the tile's
  product uses (module docstring). Rows no tile reads are clipped copies."""
  nb = t // block
  delta = np.arange(-(nb - 1), nb)[:, None]
  n = np.arange(2 * block)[None, :]
  d = delta * block + block - n if term == "c2p" else delta * block + n - block
  rows = dist[np.clip(d + t - 1, 0, 2 * t - 2)]
  h, k = table.shape[1:]
  out = jnp.take(table, jnp.asarray(rows.reshape(-1).astype(np.int32)), axis=0)
  return out.reshape(2 * nb - 1, 2 * block, h, k).transpose(2, 0, 1, 3)


def _skew(x, c):
  """(C, 2C) -> (C, C): [a, b] = x[a, b + C - a]."""
  return pltpu.roll(x, c, 1, stride=1, stride_axis=0)[:, :c]


def _reverse_columns(x):
  """x @ J, J the exchange matrix: the columns in reverse order (Mosaic has no lane
  reversal; a C x C permutation matmul is exact)."""
  c = x.shape[1]
  rows = jax.lax.broadcasted_iota(jnp.int32, (c, c), 0)
  cols = jax.lax.broadcasted_iota(jnp.int32, (c, c), 1)
  exchange = (rows + cols == c - 1).astype(x.dtype)
  precision = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
  return jax.lax.dot_general(x, exchange, _NN, precision=precision,
                             preferred_element_type=jnp.float32)


def _unskew_reversed(g, c):
  """(C, C) -> (C, 2C): the transpose of `_skew` with its 2C axis reversed, i.e.
  [a, 2C - 1 - (b + C - a)] = g[a, b], zero elsewhere. `_skew`'s own transpose would
  rotate row a by C - a (a stride of -1, which Mosaic's strided rotation cannot do: its
  per-vreg shifts must stay within a vreg); with g's columns reversed first the rotation
  is by +a. The caller multiplies by the diagonal table with its 2C rows reversed. The
  rotation runs in float32 (Mosaic rotates no packed 16-bit vectors); g's dtype out."""
  x = _reverse_columns(g)
  x = jnp.concatenate([x, jnp.zeros_like(x)], axis=1)
  return pltpu.roll(x, 0, 1, stride=1, stride_axis=0).astype(g.dtype)


def _rows(ref, c):
  """A lane-dense (1, C) per-query row -> (C, C) with [a, b] = row[a]."""
  return jnp.broadcast_to(ref[...].astype(jnp.float32), (c, c)).T


def _scores(q, k, rk, rq, segq_ref, segk_ref, scale, c):
  """The tile's float32 scores (content + relative terms), masked."""
  s = jax.lax.dot_general(q, k, _NT, preferred_element_type=jnp.float32) * scale
  if rk is not None:
    s = s + _skew(jax.lax.dot_general(q, rk, _NT, preferred_element_type=jnp.float32), c)
  if rq is not None:
    s = s + _skew(jax.lax.dot_general(k, rq, _NT, preferred_element_type=jnp.float32), c).T
  segq = _rows(segq_ref, c)
  segk = jnp.broadcast_to(segk_ref[...].astype(jnp.float32), (c, c))
  allowed = (segk > 0) & ((segq == segk) | (segq == 0))
  return jnp.where(allowed, s, MASK_VALUE)


def _split(refs, c2p, p2c):
  refs = list(refs)
  rk = refs.pop(0) if c2p else None
  rq = refs.pop(0) if p2c else None
  return rk, rq, refs


def _fwd_kernel(segq_ref, segk_ref, q_ref, k_ref, v_ref, *refs, scale, c, c2p, p2c, nk):
  rk_ref, rq_ref, (o_ref, lse_ref, m_scr, l_scr, acc_scr) = _split(refs, c2p, p2c)
  j = pl.program_id(3)

  @pl.when(j == 0)
  def _init():
    m_scr[...] = jnp.full(m_scr.shape, MASK_VALUE, jnp.float32)
    l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
    acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

  v = v_ref[...]
  s = _scores(q_ref[...], k_ref[...], rk_ref[...] if c2p else None,
              rq_ref[...] if p2c else None, segq_ref, segk_ref, scale, c)
  m_prev = m_scr[...]  # (C, C): every column holds the row's value
  m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
  p = jnp.exp(s - m_new)
  alpha = jnp.exp(m_prev - m_new)
  l_scr[...] = alpha * l_scr[...] + p.sum(axis=-1, keepdims=True)
  m_scr[...] = m_new
  acc_scr[...] = alpha[:, :1] * acc_scr[...] + jax.lax.dot_general(
      p.astype(v.dtype), v, _NN, preferred_element_type=jnp.float32)

  @pl.when(j == nk - 1)
  def _done():
    denom = l_scr[...]
    o_ref[...] = (acc_scr[...] / denom[:, :1]).astype(o_ref.dtype)
    lse_ref[...] = (m_scr[...] + jnp.log(denom)).T[:1, :]


def _probs_and_grad(q, k, v, do, rk_ref, rq_ref, segq_ref, segk_ref, lse_ref, dsum_ref,
                    scale, c):
  """The backward kernels' tile: probabilities recomputed from the saved log-sum-exp, and
  the score gradient ds = p * (dO V^T - rowsum(dO * O))."""
  s = _scores(q, k, None if rk_ref is None else rk_ref[...],
              None if rq_ref is None else rq_ref[...], segq_ref, segk_ref, scale, c)
  p = jnp.exp(s - _rows(lse_ref, c))
  dp = jax.lax.dot_general(do, v, _NT, preferred_element_type=jnp.float32)
  return p, p * (dp - _rows(dsum_ref, c))


def _relative_grad(ds_rows, x, rev_ref, table_ref, delta, c):
  """One relative term's backward in a tile: ds_rows (C, C) the score gradient with the
  term's own rows first (queries for c2p, keys for p2c), x those rows' q or k. Adds the
  diagonal table's gradient (rows reversed) into its resident block; returns x's."""
  g = _unskew_reversed(ds_rows.astype(x.dtype), c)  # (C, 2C), table rows reversed
  table_ref[delta] = table_ref[delta] + jax.lax.dot_general(
      g, x, _TN, preferred_element_type=jnp.float32)
  return jax.lax.dot_general(g, rev_ref[...], _NN, preferred_element_type=jnp.float32)


def _dq_kernel(segq_ref, segk_ref, q_ref, k_ref, v_ref, *refs, scale, c, c2p, p2c, nb):
  rk_ref, rq_ref, refs = _split(refs, c2p, p2c)
  rev_ref = refs.pop(0) if c2p else None  # rk with its 2C rows reversed
  do_ref, lse_ref, dsum_ref, dq_ref, *rest = refs
  drk_ref, acc_scr = (rest if c2p else (None,) + tuple(rest))
  b, i, j = pl.program_id(1), pl.program_id(2), pl.program_id(3)

  @pl.when(j == 0)
  def _init():
    acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

  if c2p:
    @pl.when((b == 0) & (i == 0) & (j == 0))
    def _init_table():
      drk_ref[...] = jnp.zeros(drk_ref.shape, jnp.float32)

  q, k = q_ref[...], k_ref[...]
  _, ds = _probs_and_grad(q, k, v_ref[...], do_ref[...], rk_ref, rq_ref, segq_ref, segk_ref,
                          lse_ref, dsum_ref, scale, c)
  acc = jax.lax.dot_general(ds.astype(k.dtype), k, _NN,
                            preferred_element_type=jnp.float32) * scale
  if c2p:
    acc = acc + _relative_grad(ds, q, rev_ref, drk_ref, i - j + nb - 1, c)
  acc_scr[...] += acc

  @pl.when(j == pl.num_programs(3) - 1)
  def _done():
    dq_ref[...] = acc_scr[...].astype(dq_ref.dtype)


def _dkv_kernel(segq_ref, segk_ref, q_ref, k_ref, v_ref, *refs, scale, c, c2p, p2c, nb):
  rk_ref, rq_ref, refs = _split(refs, c2p, p2c)
  rev_ref = refs.pop(0) if p2c else None  # rq with its 2C rows reversed
  do_ref, lse_ref, dsum_ref, dk_ref, dv_ref, *rest = refs
  drq_ref, dk_scr, dv_scr = (rest if p2c else (None,) + tuple(rest))
  b, j, i = pl.program_id(1), pl.program_id(2), pl.program_id(3)

  @pl.when(i == 0)
  def _init():
    dk_scr[...] = jnp.zeros(dk_scr.shape, jnp.float32)
    dv_scr[...] = jnp.zeros(dv_scr.shape, jnp.float32)

  if p2c:
    @pl.when((b == 0) & (j == 0) & (i == 0))
    def _init_table():
      drq_ref[...] = jnp.zeros(drq_ref.shape, jnp.float32)

  q, k, do = q_ref[...], k_ref[...], do_ref[...]
  p, ds = _probs_and_grad(q, k, v_ref[...], do, rk_ref, rq_ref, segq_ref, segk_ref,
                          lse_ref, dsum_ref, scale, c)
  dv_scr[...] += jax.lax.dot_general(p.astype(do.dtype), do, _TN,
                                     preferred_element_type=jnp.float32)
  dk = jax.lax.dot_general(ds.astype(q.dtype), q, _TN,
                           preferred_element_type=jnp.float32) * scale
  if p2c:
    dk = dk + _relative_grad(ds.T, k, rev_ref, drq_ref, i - j + nb - 1, c)
  dk_scr[...] += dk

  @pl.when(i == pl.num_programs(3) - 1)
  def _done():
    dk_ref[...] = dk_scr[...].astype(dk_ref.dtype)
    dv_ref[...] = dv_scr[...].astype(dv_ref.dtype)


def _specs(kdim, nb, c, c2p, p2c, order):
  """BlockSpecs of (seg as q rows, seg as keys, q, k, v, [rk], [rq]) for a grid whose last
  three axes are (b, i, j) in `order` ("bij" or "bji"); axis 0 is the head."""
  def ij(fn):
    if order == "bij":
      return lambda h, b, i, j: fn(h, b, i, j)
    return lambda h, b, j, i: fn(h, b, i, j)

  tile = (None, None, c, kdim)
  specs = [pl.BlockSpec((None, 1, c), ij(lambda h, b, i, j: (b, 0, i))),
           pl.BlockSpec((None, 1, c), ij(lambda h, b, i, j: (b, 0, j))),
           pl.BlockSpec(tile, ij(lambda h, b, i, j: (b, h, i, 0))),
           pl.BlockSpec(tile, ij(lambda h, b, i, j: (b, h, j, 0))),
           pl.BlockSpec(tile, ij(lambda h, b, i, j: (b, h, j, 0)))]
  specs += [_diag_spec(kdim, nb, c, order)] * (int(c2p) + int(p2c))
  return specs


def _diag_spec(kdim, nb, c, order):
  """The (2C, K) slice of a diagonal table for tile (i, j): diagonal i - j."""
  if order == "bij":
    return pl.BlockSpec((None, None, 2 * c, kdim), lambda h, b, i, j: (h, i - j + nb - 1, 0, 0))
  return pl.BlockSpec((None, None, 2 * c, kdim), lambda h, b, j, i: (h, i - j + nb - 1, 0, 0))


def _backward_params():
  """Only the head axis is parallel: the table gradients of a head accumulate over its
  batch rows and tiles in one resident block."""
  return pltpu.CompilerParams(
      dimension_semantics=("parallel", "arbitrary", "arbitrary", "arbitrary"))


def _forward(q, k, v, rk, rq, seg, scale, interpret):
  b, h, t, kdim = q.shape
  c, nb = BLOCK, t // BLOCK
  c2p, p2c = rk is not None, rq is not None
  kernel = functools.partial(_fwd_kernel, scale=scale, c=c, c2p=c2p, p2c=p2c, nk=nb)
  in_specs = _specs(kdim, nb, c, c2p, p2c, "bij")
  o, lse = pl.pallas_call(
      kernel, grid=(h, b, nb, nb), in_specs=in_specs,
      out_specs=[pl.BlockSpec((None, None, c, kdim), lambda h_, b_, i, j: (b_, h_, i, 0)),
                 pl.BlockSpec((None, None, 1, c), lambda h_, b_, i, j: (b_, h_, 0, i))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, 1, t), jnp.float32)],
      scratch_shapes=[pltpu.VMEM((c, c), jnp.float32), pltpu.VMEM((c, c), jnp.float32),
                      pltpu.VMEM((c, kdim), jnp.float32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
      interpret=interpret, name=kernel_name(KERNEL_NAMES[0], c2p, p2c),
  )(seg, seg, q, k, v, *[x for x in (rk, rq) if x is not None])
  return o, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _attention(q, k, v, rk, rq, seg, scale, interpret):
  return _forward(q, k, v, rk, rq, seg, scale, interpret)[0]


def _attention_fwd(q, k, v, rk, rq, seg, scale, interpret):
  o, lse = _forward(q, k, v, rk, rq, seg, scale, interpret)
  return o, (q, k, v, rk, rq, seg, o, lse)


def _attention_bwd(scale, interpret, res, do):
  q, k, v, rk, rq, seg, o, lse = res
  b, h, t, kdim = q.shape
  c, nb = BLOCK, t // BLOCK
  c2p, p2c = rk is not None, rq is not None
  tables = [x for x in (rk, rq) if x is not None]
  dsum = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)[:, :, None, :]
  row = lambda order: pl.BlockSpec(  # noqa: E731  (b, h, 1, T) per query block
      (None, None, 1, c), (lambda h_, b_, i, j: (b_, h_, 0, i)) if order == "bij"
      else (lambda h_, b_, j, i: (b_, h_, 0, i)))
  tile_q = pl.BlockSpec((None, None, c, kdim), lambda h_, b_, i, j: (b_, h_, i, 0))
  table_out = pl.BlockSpec((None, 2 * nb - 1, 2 * c, kdim), lambda h_, *_: (h_, 0, 0, 0))
  table_shape = jax.ShapeDtypeStruct((h, 2 * nb - 1, 2 * c, kdim), jnp.float32)
  grid = (h, b, nb, nb)

  dq_kernel = functools.partial(_dq_kernel, scale=scale, c=c, c2p=c2p, p2c=p2c, nb=nb)
  dq_out = pl.pallas_call(
      dq_kernel, grid=grid,
      in_specs=(_specs(kdim, nb, c, c2p, p2c, "bij") + [_diag_spec(kdim, nb, c, "bij")] * c2p
                + [tile_q, row("bij"), row("bij")]),
      out_specs=[tile_q] + ([table_out] if c2p else []),
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype)] + ([table_shape] if c2p else []),
      scratch_shapes=[pltpu.VMEM((c, kdim), jnp.float32)],
      compiler_params=_backward_params(), interpret=interpret,
      name=kernel_name(KERNEL_NAMES[1], c2p, p2c),
  )(seg, seg, q, k, v, *tables, *([rk[:, :, ::-1]] if c2p else []), do, lse, dsum)

  tile_k = pl.BlockSpec((None, None, c, kdim), lambda h_, b_, j, i: (b_, h_, j, 0))
  tile_dq = pl.BlockSpec((None, None, c, kdim), lambda h_, b_, j, i: (b_, h_, i, 0))
  dkv_kernel = functools.partial(_dkv_kernel, scale=scale, c=c, c2p=c2p, p2c=p2c, nb=nb)
  dkv_out = pl.pallas_call(
      dkv_kernel, grid=grid,
      in_specs=(_specs(kdim, nb, c, c2p, p2c, "bji") + [_diag_spec(kdim, nb, c, "bji")] * p2c
                + [tile_dq, row("bji"), row("bji")]),
      out_specs=[tile_k, tile_k] + ([table_out] if p2c else []),
      out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype),
                 jax.ShapeDtypeStruct(v.shape, v.dtype)] + ([table_shape] if p2c else []),
      scratch_shapes=[pltpu.VMEM((c, kdim), jnp.float32), pltpu.VMEM((c, kdim), jnp.float32)],
      compiler_params=_backward_params(), interpret=interpret,
      name=kernel_name(KERNEL_NAMES[2], c2p, p2c),
  )(seg, seg, q, k, v, *tables, *([rq[:, :, ::-1]] if p2c else []), do, lse, dsum)

  # the kernels accumulate the tables' gradients with the 2C rows reversed
  drk = dq_out[1][:, :, ::-1].astype(rk.dtype) if c2p else None
  drq = dkv_out[2][:, :, ::-1].astype(rq.dtype) if p2c else None
  return dq_out[0], dkv_out[0], dkv_out[1], drk, drq, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def fused_relative_attention(q: Array, k: Array, v: Array, pos_key: Optional[Array],
                             pos_query: Optional[Array], dist: np.ndarray,
                             segment_ids: Array, scale: float,
                             interpret: Optional[bool] = None) -> Array:
  """DeBERTa attention in the Pallas kernel: q, k, v (B,T,H,K); pos_key / pos_query
  (2S,H,K) scaled tables (None: that term is off); `dist` (2T-1,) the table row of each
  distance (relative.distance_rows); segment_ids (B,T) int, 0 = padding -> context
  (B,T,H,K). T must be a multiple of 128. `interpret`: None runs the Mosaic kernel when
  the program is lowered for TPU and the Pallas interpreter otherwise; True/False force
  one. Under a mesh the kernel runs per shard (`kernels.per_shard`: batch and heads)."""
  b, t, h, kdim = q.shape
  if t % BLOCK:
    raise ValueError(f"the fused relative attention kernel needs a sequence length that is "
                     f"a multiple of {BLOCK}, got {t}; use relative_impl='shift'")
  if pos_key is None and pos_query is None:
    raise ValueError("the fused relative attention kernel needs at least one relative term")
  if kernels._STAND_INS:  # launch.aot's twin: an elementwise stand-in, same inputs/output
    out = q * k + v * (segment_ids[:, :, None, None] > 0).astype(v.dtype)
    for table in (pos_key, pos_query):
      if table is not None:
        out = out + jnp.mean(table, axis=0).astype(v.dtype)
    return out
  rk = None if pos_key is None else diagonal_tables(pos_key, dist, t, BLOCK, "c2p")
  rq = None if pos_query is None else diagonal_tables(pos_query, dist, t, BLOCK, "p2c")

  def one(q, k, v, rk, rq, seg, interpret):
    qh, kh, vh = (x.swapaxes(1, 2) for x in (q, k, v))
    return _attention(qh, kh, vh, rk, rq, seg[:, None, :], scale, interpret).swapaxes(1, 2)

  def local(*args):
    if interpret is not None:
      return one(*args, interpret)
    # by the platform the program is lowered for (not the host's: launch.aot compiles
    # for TPU on a CPU host): the Mosaic kernel on TPU, the interpreter elsewhere
    return jax.lax.platform_dependent(*args, tpu=functools.partial(one, interpret=False),
                                      default=functools.partial(one, interpret=True))

  return kernels.per_shard(local, "the fused relative attention kernel", (q, k, v),
                           segment_ids.astype(jnp.int32), (rk, rq))
