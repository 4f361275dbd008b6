"""The fused DeBERTa attention kernel (encoders/layers/relative_kernel.py), run in the
Pallas interpreter on the CPU: values and gradients (q, k, v and both relative tables) of
its forward and its one fused backward equal the gather reference's bias fed to the
reference attention, on padded and packed batches, for both terms and each alone, at
tiles of 128 and 256; skipping the tiles packed documents never share changes no bit;
its skew helpers place what they claim at every tile size."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from encoders.layers import kernels, masks, relative
from encoders.layers import relative_kernel as rk_lib

C = rk_lib.BLOCK


@pytest.mark.parametrize("C", [C, pytest.param(2 * C, marks=pytest.mark.slow)])
def test_skew_and_unskew_are_transposes(C):  # noqa: N803
  x = jax.random.normal(jax.random.PRNGKey(0), (C, 2 * C))
  a, b = np.meshgrid(np.arange(C), np.arange(C), indexing="ij")
  skew_fn = jax.jit(lambda x: rk_lib._skew(x, C))  # roll_p has a lowering, no eager rule
  unskew_fn = jax.jit(lambda g: rk_lib._unskew_reversed(g, C)[:, ::-1])
  skew = np.asarray(skew_fn(x))
  np.testing.assert_array_equal(skew, np.asarray(x)[a, b + C - a])
  g = jax.random.normal(jax.random.PRNGKey(1), (C, C))
  # <skew(x), g> == <x, unskew(g)>: with its columns put back in order, the backward's
  # unskew is skew's transpose
  lhs = jnp.vdot(skew_fn(x), g)
  rhs = jnp.vdot(x, unskew_fn(g))
  np.testing.assert_allclose(float(lhs), float(rhs), rtol=1e-5)
  dense = np.zeros((C, 2 * C), np.float32)
  dense[a, b + C - a] = np.asarray(g)
  np.testing.assert_array_equal(np.asarray(unskew_fn(g)), dense)


def _inputs(t, seed, span=16, heads=2, kdim=8):
  ks = jax.random.split(jax.random.PRNGKey(seed), 5)
  q, k, v = (jax.random.normal(x, (2, t, heads, kdim)) for x in ks[:3])
  pk, pq = (0.3 * jax.random.normal(x, (2 * span, heads, kdim)) for x in ks[3:])
  return q, k, v, pk, pq


SLOW = pytest.mark.slow  # default-suite time: each interpreted case costs 7-18 s


def _segments(t, packed):
  """Row 0 full, row 1 padded by 37; packed: row 0 holds documents [0, 60), [60, 128),
  [128, t) (at 128-wide tiles, query block 0 meets no key of block 1 and vice versa),
  row 1 documents [0, 150), [150, t - 37) and padding."""
  pos = np.arange(t)[None, :]
  seg = (pos < np.array([[t], [t - 37]])).astype(np.int32)
  if packed:
    seg = seg * (1 + (pos >= np.array([[60], [150]])) + (pos >= np.array([[C], [t]])))
  return jnp.asarray(seg)


def _check(terms, packed, t, block, seed, bitwise_skip=False):
  rows = (16, 16, 64)  # log buckets: distances past 8 share rows
  q, k, v, pk, pq = _inputs(t, seed)
  pk = pk if "c2p" in terms else None
  pq = pq if "p2c" in terms else None
  seg = _segments(t, packed)
  mask = masks.SegmentMask(seg).dense()
  dist = relative.distance_rows(t, *rows)
  scale = 0.21

  def ref(q, k, v, pk, pq):
    bias = relative.relative_scores(q, k, pk, pq, terms, rows, "gather")
    return kernels.attention_scores_einsum(q, k, v, mask, bias, scale)

  def fused(q, k, v, pk, pq, skip=True):
    return rk_lib.fused_relative_attention(q, k, v, pk, pq, dist, seg, scale, interpret=True,
                                           block=block, skip_empty_tiles=skip)

  args = (q, k, v, pk, pq)
  out, want = jax.jit(fused)(*args), jax.jit(ref)(*args)
  np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-5, rtol=2e-5)
  argnums = tuple(i for i, a in enumerate(args) if a is not None)
  w = jax.random.normal(jax.random.PRNGKey(9), out.shape)  # a loss that weights every output

  def g(f):
    return jax.jit(jax.value_and_grad(lambda *a: jnp.sum(w * f(*a)), argnums=argnums))

  names = [("q", "k", "v", "pk", "pq")[i] for i in argnums]
  got = g(fused)(*args)
  for name, a, b in zip(names, got[1], g(ref)(*args)[1]):
    assert np.abs(np.asarray(b)).max() > 1e-3, name  # not vacuous
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4,
                               err_msg=name)
  if bitwise_skip:  # every tile computed: the same bits, forward and backward
    dense = g(lambda *a: fused(*a, skip=False))(*args)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(dense[0]))
    for name, a, b in zip(names, got[1], dense[1]):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


@pytest.mark.parametrize("terms,packed,block", [
    # both terms, packed, at 128: the skipping test below runs it
    pytest.param(("c2p", "p2c"), False, C, marks=SLOW),
    pytest.param(("c2p", "p2c"), True, C, marks=SLOW),
    pytest.param(("c2p",), False, C, marks=SLOW), pytest.param(("p2c",), True, C, marks=SLOW),
    (("c2p", "p2c"), True, 2 * C), pytest.param(("c2p",), True, 2 * C, marks=SLOW),
    pytest.param(("p2c",), False, 2 * C, marks=SLOW)])
def test_fused_kernel_equals_reference(terms, packed, block):
  _check(terms, packed, 2 * C, block, len(terms) + 2 * packed)


def test_tiles_packed_documents_never_share_are_skipped_and_change_no_bit():
  """At 128-wide tiles row 0's query block 0 and key block 1 hold different documents:
  those tiles are flagged off; the padded row 1 keeps all (its padding queries see every
  real key); a row with no real key keeps all (its queries weigh every key equally).
  Computing every tile instead gives the same bits, values and gradients; NaN values in
  row 0's key block 1 do not reach query block 0 (its tile is skipped)."""
  seg = _segments(2 * C, packed=True)
  flags = np.asarray(rk_lib.tile_flags(seg, C))
  np.testing.assert_array_equal(flags, [[[True, False], [False, True]],
                                        [[True, True], [True, True]]])
  assert np.asarray(rk_lib.tile_flags(jnp.zeros((1, 2 * C), jnp.int32), C)).all()
  assert np.asarray(rk_lib.tile_flags(seg, 2 * C)).all()
  _check(("c2p", "p2c"), True, 2 * C, C, 5, bitwise_skip=True)
  q, k, v, pk, pq = _inputs(2 * C, 5)
  v = v.at[0, C:].set(jnp.nan)
  dist = relative.distance_rows(2 * C, 16, 16, 64)

  # computed, the tile would give 0 * NaN = NaN
  out = jax.jit(lambda *a: rk_lib.fused_relative_attention(
      *a, dist, seg, 0.21, interpret=True, block=C))(q, k, v, pk, pq)
  assert np.isfinite(np.asarray(out)[0, :C]).all()


def test_block_size_follows_length_head_size_and_dtype():
  assert rk_lib.choose_block(512, 64, jnp.bfloat16) == 256  # 512-wide temporaries: too big
  assert rk_lib.choose_block(384, 64, jnp.bfloat16) == 128  # 384 is no multiple of 256
  assert rk_lib.choose_block(128, 64, jnp.float32) == 128
  for t in (256, 512, 1024):
    c = rk_lib.choose_block(t, 64, jnp.bfloat16)
    assert t % c == 0 and rk_lib._vmem_bytes(c, t, 64, 2) <= rk_lib.VMEM_BUDGET
  q, k, v, pk, pq = _inputs(2 * C, 0)
  seg = jnp.ones((2, 2 * C), jnp.int32)
  with pytest.raises(ValueError, match="block must be a multiple of 128"):
    rk_lib.fused_relative_attention(q, k, v, pk, pq, None, seg, 1.0, interpret=True,
                                    block=192)


def test_bad_lengths_and_no_terms_are_refused():
  q, k, v, pk, pq = _inputs(C + 8, 0)
  seg = jnp.ones((2, C + 8), jnp.int32)
  with pytest.raises(ValueError, match="multiple of 128"):
    rk_lib.fused_relative_attention(q, k, v, pk, pq, None, seg, 1.0, interpret=True)
  q, k, v, _, _ = _inputs(C, 0)
  with pytest.raises(ValueError, match="at least one relative term"):
    rk_lib.fused_relative_attention(q, k, v, None, None, None, seg[:, :C], 1.0,
                                    interpret=True)


@pytest.mark.parametrize("style", ["v3", pytest.param("v2", marks=SLOW)])
def test_model_on_the_fused_kernel_matches_transformers_and_the_shift_gradients(style, tmp_path):
  """DeBERTa with relative_impl='fused' (interpreted): MLM logits equal transformers' on a
  padded batch at T=128, and the parameter gradients of a loss equal the shift
  formulation's (every parameter, relative table and projections included)."""
  import transformers as T  # noqa: N812
  import encoders
  from tests.encoders import hf_helpers as H
  from tests.encoders.deberta_helpers import compare, tiny_hf
  hf = tiny_hf("DebertaV2ForMaskedLM", style, seed=6, max_position_embeddings=128)
  assert isinstance(hf, T.DebertaV2ForMaskedLM)
  hf.save_pretrained(tmp_path)
  fused, params = encoders.from_hf(str(tmp_path), dtype="float32", relative_impl="fused")
  shift, _ = encoders.from_hf(str(tmp_path), dtype="float32", relative_impl="shift")
  assert fused.config.relative_impl == "fused"
  ids, mask, types = H.padded_batch(hf.config, length=C, seed=7)
  assert not mask.all()
  args = (jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  out = jax.jit(lambda p, *a: fused.apply({"params": p}, *a))(params, *args)
  compare(out, H.torch_outputs(hf, ids, mask, types), mask)

  w = jax.random.normal(jax.random.PRNGKey(3), out.last_hidden_state.shape) * mask[..., None]

  def grads(model):
    def loss(p):
      return jnp.sum(w * model.apply({"params": p}, *args).last_hidden_state)
    return jax.jit(jax.grad(loss))(params)

  got, want = grads(fused), grads(shift)
  flat_want = dict(jax.tree_util.tree_leaves_with_path(want))
  for path, g in jax.tree_util.tree_leaves_with_path(got):
    np.testing.assert_allclose(np.asarray(g), np.asarray(flat_want[path]), atol=2e-4,
                               rtol=2e-4, err_msg=jax.tree_util.keystr(path))
  rel = [g for path, g in jax.tree_util.tree_leaves_with_path(got)
         if "rel_embeddings" in jax.tree_util.keystr(path)]
  assert rel and np.abs(np.asarray(rel[0])).max() > 1e-4  # the table is learned through it


def test_auto_picks_the_fused_kernel_on_tpu_only_when_it_can():
  from encoders.layers import relative
  assert relative.choose_impl("tpu", 512)[0] == "fused"
  assert relative.choose_impl("cpu", 512)[0] == "shift"
  for args, why in (((300,), "multiple of 128"), ((512, 0.1), "attention_probs_dropout"),
                    ((None,), "not known")):
    impl, reason = relative.choose_impl("tpu", *args)
    assert impl == "shift" and why in reason


@SLOW
def test_sharded_over_a_mesh_gives_the_unsharded_values_and_gradients():
  """Under a (data=2, fsdp=2, tensor=2) mesh the kernel runs per shard (batch over
  data x fsdp, heads over tensor); the tables' gradients, summed over every shard's
  batch rows, equal the unsharded ones."""
  import flax.linen as nn
  from jax.sharding import Mesh
  from encoders import sharding_rules
  t, rows = C, (16, 16, 64)
  ks = jax.random.split(jax.random.PRNGKey(4), 5)
  q, k, v = (jax.random.normal(x, (4, t, 2, 8)) for x in ks[:3])
  pk, pq = (0.3 * jax.random.normal(x, (32, 2, 8)) for x in ks[3:])
  seg = jnp.asarray((np.arange(t)[None, :] < np.array([[t], [90], [t], [17]])).astype(np.int32))
  dist = relative.distance_rows(t, *rows)
  w = jax.random.normal(jax.random.PRNGKey(5), q.shape)

  def loss(q, k, v, pk, pq):
    out = rk_lib.fused_relative_attention(q, k, v, pk, pq, dist, seg, 0.3, interpret=True)
    return jnp.sum(w * out)

  grad = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))
  want = grad(q, k, v, pk, pq)
  mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(2, 2, 2), ("data", "fsdp", "tensor"))
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding_rules.DEFAULT_RULES):
    got = grad(q, k, v, pk, pq)
  np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-5)
  for name, a, b in zip("q k v pk pq".split(), got[1], want[1]):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4,
                               err_msg=name)
