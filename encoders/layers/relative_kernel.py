"""DeBERTa's disentangled attention as one Pallas kernel (TPU): the c2p and p2c terms are
computed tile by tile inside a flash-attention loop, so no (B,H,T,T)-sized score, bias or
probability tensor is ever written to memory, forward or backward.

Notation as in `relative.py`: c2p[i, j] = q_i . Pk[row(i - j)], p2c[i, j] = k_j . Pq[row(i - j)]
with (2S,H,K) tables Pk, Pq (projected, already scaled) and row() the bucketed distance.

Tiles are C x C, C a multiple of 128 (the TPU's lane width) chosen per call by
`choose_block` from the length, head size and dtype (256 or 512 where T is a multiple and
the tile's working set fits in VMEM; 128 otherwise). Query block I and key block J see
only the 2C - 1 distances (I - J) C + (-(C-1) .. C-1), so each of the 2T/C - 1 block
diagonals delta = I - J gets its own small (2C, K) slice of the table, laid out so that
one MXU product and one strided lane rotation give the tile's term:

  c2p: A = q_I @ Rk[delta]^T (C, 2C) with column n holding distance delta C + C - n;
       tile[a, b] = A[a, b + C - a] = roll(A, C + a)[a, b]   (`pltpu.roll`, stride 1)
  p2c: B = k_J @ Rq[delta]^T (C, 2C) with column n holding distance delta C + n - C;
       tile[a, b] = B[b, a + C - b], the same rotation of B, transposed.

One backward kernel (grid head, row, key block J, query block I) recomputes each tile's
probabilities once and produces every gradient from them: dk and dv accumulate in VMEM
over the inner query loop; dq accumulates over the key blocks in a (T, K) float32 VMEM
scratch of the row, written to the row's resident output block after the last key block;
the score gradient is carried back onto the (C, 2C) products (`_unskew_reversed`: the
inverse rotation, done on reversed columns because Mosaic's strided rotation takes no
negative stride), then to q / k and to the diagonal tables. The table gradients
accumulate across the batch and all tiles of a head in a resident VMEM block, so the head
axis is the only parallel grid axis of the backward (12+ heads: enough for both cores of
a v4/v5p chip).

Masking follows `masks.make_attention_mask` for segment ids: a key must be real (id > 0);
a real query sees keys of its own segment; a padding query sees every real key. A fully
masked row gets equal weights instead of NaN (a finite mask value), as the dense path's
self-attention rule also avoids NaN. Tiles in which no query may see any key (packed
documents that do not meet, padding keys) are skipped, forward and backward, by a flag
computed from each block's segment-id range (`tile_flags`, scalar-prefetched): such a
tile's probabilities underflow to exactly 0, so skipping changes no bit of the result.

Work per C x C tile, in C x C x K matmul units (`matmul_units`, used by
launch/perf/kernel_cost.py to price the calls): forward 2 + 2 per term; backward
5 + 6 per term, plus the column reversal of `_unskew_reversed` (a 128 x 128 permutation
matmul per 128 columns: 128 / K units per term). `interpret=True` runs the same kernels
in the Pallas interpreter on any backend (the CPU tests).
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
BLOCK = 128  # the smallest tile, and what T must be a multiple of
BLOCKS = (512, 256, 128)
LANES = 128
VMEM_BUDGET = 12 * 2 ** 20  # below the 16 MiB default scoped VMEM of v4 / v5e / v5p
KERNEL_NAMES = ("deberta_rel_fwd", "deberta_rel_bwd")
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
_NT = (((1,), (1,)), ((), ()))  # x @ y^T
_TN = (((0,), (0,)), ((), ()))  # x^T @ y
_NN = (((1,), (0,)), ((), ()))  # x @ y


def kernel_name(kernel: str, c2p: bool, p2c: bool) -> str:
  """The pallas_call name, which carries the terms (launch/perf/kernel_cost.py reads them)."""
  return kernel + "__" + "_".join(t for t, on in (("c2p", c2p), ("p2c", p2c)) if on)


def matmul_units(kernel: str, c2p: bool, p2c: bool, kdim: int) -> float:
  """C x C x K matmuls per tile of each kernel (see the module docstring), the backward's
  column-reversal permutation matmuls (C x C x 128 per term) included."""
  terms = int(c2p) + int(p2c)
  return {"deberta_rel_fwd": 2 + 2 * terms,
          "deberta_rel_bwd": 5 + 6 * terms + terms * LANES / kdim}[kernel]


def _vmem_bytes(c: int, t: int, kdim: int, itemsize: int) -> int:
  """A generous estimate of the backward's VMEM (the larger kernel) at tile C: its float32
  C x C temporaries (scores, probabilities, gradients, the (C, 2C) products and their
  rotations, about 16 of them), double-buffered input tiles and tables, the (T, K)
  dq scratch and output, and both resident table-gradient blocks (double-buffered)."""
  temps = 16 * c * c * 4
  tiles = 2 * (4 * c * kdim + 4 * 2 * c * kdim) * itemsize
  dq = t * kdim * (4 + 2 * itemsize)
  tables = 2 * 2 * (2 * t // c - 1) * 2 * c * kdim * 4
  return temps + tiles + dq + tables


def choose_block(t: int, kdim: int, dtype) -> int:
  """The tile size for length T: the largest of 512, 256, 128 that divides T and whose
  working set fits `VMEM_BUDGET`; 128 at least (T is a multiple of 128)."""
  itemsize = jnp.dtype(dtype).itemsize
  for c in BLOCKS:
    if t % c == 0 and _vmem_bytes(c, t, kdim, itemsize) <= VMEM_BUDGET:
      return c
  return BLOCK


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


def _block_bounds(seg: Array, c: int) -> Array:
  """(B,T) segment ids -> (B, T/C, 4) int32 per block: the least and greatest id (as
  queries), the least and greatest id of a real key (as keys; 0 when none). A row with no
  real key at all gets bounds that keep every tile (its queries see every key, equally)."""
  b, t = seg.shape
  blocks = seg.reshape(b, t // c, c)
  big = jnp.iinfo(jnp.int32).max
  qmin, qmax = blocks.min(-1), blocks.max(-1)
  kmin = jnp.where(blocks > 0, blocks, big).min(-1)
  kmax = blocks.max(-1)
  empty = (seg.max(-1) == 0)[:, None]
  qmin = jnp.where(empty, 0, qmin)
  kmax = jnp.where(empty, 1, kmax)
  return jnp.stack([qmin, qmax, kmin, kmax], -1).astype(jnp.int32)


def _live(qmin, qmax, kmin, kmax):
  """Whether a query block may see a key block: some key is real, and some query is
  padding (it sees every real key) or the blocks' segment-id ranges meet. Exact for
  sorted (packed) rows, conservative otherwise."""
  return (kmax > 0) & ((qmin == 0) | ((qmin <= kmax) & (kmin <= qmax)))


def tile_flags(segment_ids: Array, block: int) -> Array:
  """(B,T) segment ids -> (B, T/C, T/C) bool: tile (query block, key block) is computed
  (False: skipped, no query of it may see any key)."""
  bounds = _block_bounds(jnp.asarray(segment_ids, jnp.int32), block)
  q, k = bounds[:, :, None, :], bounds[:, None, :, :]
  return _live(q[..., 0], q[..., 1], k[..., 2], k[..., 3])


def _tile_is_live(bounds_ref, b, i, j, nb):
  """`_live` for tile (i, j) of row b, from the flat scalar-prefetched bounds."""
  qi, kj = (b * nb + i) * 4, (b * nb + j) * 4
  return _live(bounds_ref[qi], bounds_ref[qi + 1], bounds_ref[kj + 2], bounds_ref[kj + 3])


def _skew(x, c):
  """(C, 2C) -> (C, C): [a, b] = x[a, b + C - a]."""
  return pltpu.roll(x, c, 1, stride=1, stride_axis=0)[:, :c]


def _reverse_columns(x):
  """x @ J, J the exchange matrix: the columns in reverse order (Mosaic has no lane
  reversal; a permutation matmul is exact). Done per 128 columns with one 128 x 128
  exchange matrix, the chunks taken in reverse order, so its cost does not grow with C."""
  c = x.shape[1]
  rows = jax.lax.broadcasted_iota(jnp.int32, (LANES, LANES), 0)
  cols = jax.lax.broadcasted_iota(jnp.int32, (LANES, LANES), 1)
  exchange = (rows + cols == LANES - 1).astype(x.dtype)
  precision = jax.lax.Precision.HIGHEST if x.dtype == jnp.float32 else None
  chunks = [jax.lax.dot_general(x[:, m:m + LANES], exchange, _NN, precision=precision,
                                preferred_element_type=jnp.float32)
            for m in range(c - LANES, -1, -LANES)]
  return chunks[0] if len(chunks) == 1 else jnp.concatenate(chunks, axis=1)


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


def _fwd_kernel(bounds_ref, segq_ref, segk_ref, q_ref, k_ref, v_ref, *refs, scale, c, c2p,
                p2c, nb):
  rk_ref, rq_ref, (o_ref, lse_ref, m_scr, l_scr, acc_scr) = _split(refs, c2p, p2c)
  b, i, j = pl.program_id(1), pl.program_id(2), pl.program_id(3)

  @pl.when(j == 0)
  def _init():
    m_scr[...] = jnp.full(m_scr.shape, MASK_VALUE, jnp.float32)
    l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
    acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

  @pl.when(_tile_is_live(bounds_ref, b, i, j, nb))
  def _tile():
    v = v_ref[...]
    s = _scores(q_ref[...], k_ref[...], rk_ref[...] if c2p else None,
                rq_ref[...] if p2c else None, segq_ref, segk_ref, scale, c)
    m_prev = m_scr[...]  # (C, 128): every lane holds the row's value
    m_new = jnp.maximum(m_prev, s.max(axis=-1, keepdims=True))
    p = jnp.exp(s - m_new[:, :1])
    alpha = jnp.exp(m_prev - m_new)
    l_scr[...] = alpha * l_scr[...] + p.sum(axis=-1, keepdims=True)
    m_scr[...] = m_new
    acc_scr[...] = alpha[:, :1] * acc_scr[...] + jax.lax.dot_general(
        p.astype(v.dtype), v, _NN, preferred_element_type=jnp.float32)

  @pl.when(j == nb - 1)
  def _done():
    denom = l_scr[...]
    o_ref[...] = (acc_scr[...] / denom[:, :1]).astype(o_ref.dtype)
    lse_ref[...] = (m_scr[...] + jnp.log(denom)).T[:1, :]


def _relative_grad(ds_rows, x, rev_ref, table_ref, delta, c):
  """One relative term's backward in a tile: ds_rows (C, C) the score gradient with the
  term's own rows first (queries for c2p, keys for p2c), x those rows' q or k. Adds the
  diagonal table's gradient (rows reversed) into its resident block; returns x's."""
  g = _unskew_reversed(ds_rows.astype(x.dtype), c)  # (C, 2C), table rows reversed
  table_ref[delta] = table_ref[delta] + jax.lax.dot_general(
      g, x, _TN, preferred_element_type=jnp.float32)
  return jax.lax.dot_general(g, rev_ref[...], _NN, preferred_element_type=jnp.float32)


def _bwd_kernel(bounds_ref, segq_ref, segk_ref, q_ref, k_ref, v_ref, *refs, scale, c, c2p,
                p2c, nb):
  rk_ref, rq_ref, refs = _split(refs, c2p, p2c)
  rk_rev_ref = refs.pop(0) if c2p else None  # the tables with their 2C rows reversed
  rq_rev_ref = refs.pop(0) if p2c else None
  do_ref, lse_ref, dsum_ref, dq_ref, dk_ref, dv_ref, *rest = refs
  drk_ref = rest.pop(0) if c2p else None
  drq_ref = rest.pop(0) if p2c else None
  dq_scr, dk_scr, dv_scr = rest
  b, j, i = pl.program_id(1), pl.program_id(2), pl.program_id(3)

  @pl.when((b == 0) & (j == 0) & (i == 0))
  def _init_tables():
    for ref in (drk_ref, drq_ref):
      if ref is not None:
        ref[...] = jnp.zeros(ref.shape, jnp.float32)

  @pl.when((j == 0) & (i == 0))
  def _init_dq():
    dq_scr[...] = jnp.zeros(dq_scr.shape, jnp.float32)

  @pl.when(i == 0)
  def _init_dkv():
    dk_scr[...] = jnp.zeros(dk_scr.shape, jnp.float32)
    dv_scr[...] = jnp.zeros(dv_scr.shape, jnp.float32)

  @pl.when(_tile_is_live(bounds_ref, b, i, j, nb))
  def _tile():
    q, k, do = q_ref[...], k_ref[...], do_ref[...]
    s = _scores(q, k, rk_ref[...] if c2p else None, rq_ref[...] if p2c else None,
                segq_ref, segk_ref, scale, c)
    p = jnp.exp(s - _rows(lse_ref, c))
    dp = jax.lax.dot_general(do, v_ref[...], _NT, preferred_element_type=jnp.float32)
    ds = p * (dp - _rows(dsum_ref, c))
    dv_scr[...] += jax.lax.dot_general(p.astype(do.dtype), do, _TN,
                                       preferred_element_type=jnp.float32)
    dq = jax.lax.dot_general(ds.astype(k.dtype), k, _NN,
                             preferred_element_type=jnp.float32) * scale
    dk = jax.lax.dot_general(ds.astype(q.dtype), q, _TN,
                             preferred_element_type=jnp.float32) * scale
    delta = i - j + nb - 1
    if c2p:
      dq = dq + _relative_grad(ds, q, rk_rev_ref, drk_ref, delta, c)
    if p2c:
      dk = dk + _relative_grad(ds.T, k, rq_rev_ref, drq_ref, delta, c)
    dq_scr[i] = dq_scr[i] + dq
    dk_scr[...] += dk

  @pl.when(i == nb - 1)
  def _done_dkv():
    dk_ref[...] = dk_scr[...].astype(dk_ref.dtype)
    dv_ref[...] = dv_scr[...].astype(dv_ref.dtype)

  @pl.when(j == nb - 1)
  def _done_dq():  # the row's dq block stays resident over (j, i): written back once
    dq_ref[i] = dq_scr[i].astype(dq_ref.dtype)


def _specs(kdim, nb, c, n_tables, order):
  """BlockSpecs of (seg as q rows, seg as keys, q, k, v, n_tables diagonal tables) for a
  grid whose last three axes are (b, i, j) in `order` ("bij" or "bji"); axis 0 is the
  head; the index maps also receive the scalar-prefetched bounds."""
  def ij(fn):
    if order == "bij":
      return lambda h, b, i, j, *_: fn(h, b, i, j)
    return lambda h, b, j, i, *_: fn(h, b, i, j)

  tile = (None, None, c, kdim)
  return ([pl.BlockSpec((None, 1, c), ij(lambda h, b, i, j: (b, 0, i))),
           pl.BlockSpec((None, 1, c), ij(lambda h, b, i, j: (b, 0, j))),
           pl.BlockSpec(tile, ij(lambda h, b, i, j: (b, h, i, 0))),
           pl.BlockSpec(tile, ij(lambda h, b, i, j: (b, h, j, 0))),
           pl.BlockSpec(tile, ij(lambda h, b, i, j: (b, h, j, 0)))]
          + [pl.BlockSpec((None, None, 2 * c, kdim),
                          ij(lambda h, b, i, j: (h, i - j + nb - 1, 0, 0)))] * n_tables)


def _bounds(seg, c):
  return _block_bounds(seg[:, 0, :], c).reshape(-1)


def _forward(q, k, v, rk, rq, seg, scale, block, skip, interpret):
  b, h, t, kdim = q.shape
  c, nb = block, t // block
  c2p, p2c = rk is not None, rq is not None
  tables = [x for x in (rk, rq) if x is not None]
  bounds = _bounds(seg if skip else jnp.zeros_like(seg), c)
  kernel = functools.partial(_fwd_kernel, scale=scale, c=c, c2p=c2p, p2c=p2c, nb=nb)
  o, lse = pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(h, b, nb, nb),
          in_specs=_specs(kdim, nb, c, len(tables), "bij"),
          out_specs=[pl.BlockSpec((None, None, c, kdim), lambda h_, b_, i, j, *_: (b_, h_, i, 0)),
                     pl.BlockSpec((None, None, 1, c), lambda h_, b_, i, j, *_: (b_, h_, 0, i))],
          scratch_shapes=[pltpu.VMEM((c, LANES), jnp.float32),
                          pltpu.VMEM((c, LANES), jnp.float32),
                          pltpu.VMEM((c, kdim), jnp.float32)]),
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype),
                 jax.ShapeDtypeStruct((b, h, 1, t), jnp.float32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
      interpret=interpret, name=kernel_name(KERNEL_NAMES[0], c2p, p2c),
  )(bounds, seg, seg, q, k, v, *tables)
  return o, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9))
def _attention(q, k, v, rk, rq, seg, scale, block, skip, interpret):
  return _forward(q, k, v, rk, rq, seg, scale, block, skip, interpret)[0]


def _attention_fwd(q, k, v, rk, rq, seg, scale, block, skip, interpret):
  o, lse = _forward(q, k, v, rk, rq, seg, scale, block, skip, interpret)
  return o, (q, k, v, rk, rq, seg, o, lse)


def _attention_bwd(scale, block, skip, interpret, res, do):
  q, k, v, rk, rq, seg, o, lse = res
  b, h, t, kdim = q.shape
  c, nb = block, t // block
  c2p, p2c = rk is not None, rq is not None
  tables = [x for x in (rk, rq) if x is not None]
  dsum = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)[:, :, None, :]
  bounds = _bounds(seg if skip else jnp.zeros_like(seg), c)
  row = pl.BlockSpec((None, None, 1, c), lambda h_, b_, j, i, *_: (b_, h_, 0, i))
  tile_q = pl.BlockSpec((None, None, c, kdim), lambda h_, b_, j, i, *_: (b_, h_, i, 0))
  tile_k = pl.BlockSpec((None, None, c, kdim), lambda h_, b_, j, i, *_: (b_, h_, j, 0))
  dq_row = pl.BlockSpec((None, None, nb, c, kdim), lambda h_, b_, *_: (b_, h_, 0, 0, 0))
  table_out = pl.BlockSpec((None, 2 * nb - 1, 2 * c, kdim), lambda h_, *_: (h_, 0, 0, 0))
  table_shape = jax.ShapeDtypeStruct((h, 2 * nb - 1, 2 * c, kdim), jnp.float32)

  kernel = functools.partial(_bwd_kernel, scale=scale, c=c, c2p=c2p, p2c=p2c, nb=nb)
  dq, dk, dv, *dtables = pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(h, b, nb, nb),
          in_specs=(_specs(kdim, nb, c, 2 * len(tables), "bji") + [tile_q, row, row]),
          out_specs=[dq_row, tile_k, tile_k] + [table_out] * len(tables),
          scratch_shapes=[pltpu.VMEM((nb, c, kdim), jnp.float32),
                          pltpu.VMEM((c, kdim), jnp.float32),
                          pltpu.VMEM((c, kdim), jnp.float32)]),
      out_shape=[jax.ShapeDtypeStruct((b, h, nb, c, kdim), q.dtype),
                 jax.ShapeDtypeStruct(k.shape, k.dtype),
                 jax.ShapeDtypeStruct(v.shape, v.dtype)] + [table_shape] * len(tables),
      # only the head axis is parallel: the table gradients of a head accumulate over its
      # batch rows and tiles in one resident block
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "arbitrary", "arbitrary", "arbitrary")),
      interpret=interpret, name=kernel_name(KERNEL_NAMES[1], c2p, p2c),
  )(bounds, seg, seg, q, k, v, *tables, *[x[:, :, ::-1] for x in tables], do, lse, dsum)

  # the kernel accumulates the tables' gradients with the 2C rows reversed
  dtables = [d[:, :, ::-1].astype(x.dtype) for d, x in zip(dtables, tables)]
  drk = dtables.pop(0) if c2p else None
  drq = dtables.pop(0) if p2c else None
  return dq.reshape(q.shape), dk, dv, drk, drq, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def fused_relative_attention(q: Array, k: Array, v: Array, pos_key: Optional[Array],
                             pos_query: Optional[Array], dist: np.ndarray,
                             segment_ids: Array, scale: float,
                             interpret: Optional[bool] = None, block: Optional[int] = None,
                             skip_empty_tiles: bool = True) -> Array:
  """DeBERTa attention in the Pallas kernel: q, k, v (B,T,H,K); pos_key / pos_query
  (2S,H,K) scaled tables (None: that term is off); `dist` (2T-1,) the table row of each
  distance (relative.distance_rows); segment_ids (B,T) int, 0 = padding -> context
  (B,T,H,K). T must be a multiple of 128. `interpret`: None runs the Mosaic kernel when
  the program is lowered for TPU and the Pallas interpreter otherwise; True/False force
  one. `block`: the tile size (a multiple of 128 dividing T; None: `choose_block`).
  `skip_empty_tiles=False` computes every tile (the result is the same; for tests).
  Under a mesh the kernel runs per shard (`kernels.per_shard`: batch and heads)."""
  b, t, h, kdim = q.shape
  if t % BLOCK:
    raise ValueError(f"the fused relative attention kernel needs a sequence length that is "
                     f"a multiple of {BLOCK}, got {t}; use relative_impl='shift'")
  if pos_key is None and pos_query is None:
    raise ValueError("the fused relative attention kernel needs at least one relative term")
  block = choose_block(t, kdim, q.dtype) if block is None else block
  if block % BLOCK or t % block:
    raise ValueError(f"the fused relative attention kernel's block must be a multiple of "
                     f"{BLOCK} dividing the sequence length {t}, got {block}")
  if kernels._STAND_INS:  # launch.aot's twin: an elementwise stand-in, same inputs/output
    out = q * k + v * (segment_ids[:, :, None, None] > 0).astype(v.dtype)
    for table in (pos_key, pos_query):
      if table is not None:
        out = out + jnp.mean(table, axis=0).astype(v.dtype)
    return out
  rk = None if pos_key is None else diagonal_tables(pos_key, dist, t, block, "c2p")
  rq = None if pos_query is None else diagonal_tables(pos_query, dist, t, block, "p2c")

  def one(q, k, v, rk, rq, seg, interpret):
    qh, kh, vh = (x.swapaxes(1, 2) for x in (q, k, v))
    return _attention(qh, kh, vh, rk, rq, seg[:, None, :], scale, block, skip_empty_tiles,
                      interpret).swapaxes(1, 2)

  def local(*args):
    if interpret is not None:
      return one(*args, interpret)
    # by the platform the program is lowered for (not the host's: launch.aot compiles
    # for TPU on a CPU host): the Mosaic kernel on TPU, the interpreter elsewhere
    return jax.lax.platform_dependent(*args, tpu=functools.partial(one, interpret=False),
                                      default=functools.partial(one, interpret=True))

  return kernels.per_shard(local, "the fused relative attention kernel", (q, k, v),
                           segment_ids.astype(jnp.int32), (rk, rq))
