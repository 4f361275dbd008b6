"""The shared RMSNorm and grouped-query attention primitives: RMSNorm against its formula
and transformers' (Llama's) module; every attention kernel with G < H K/V heads against
the reference run on K/V heads repeated as transformers' repeat_kv does (Splash in the
Pallas interpreter); a BERT with GQA as a config change only, equal to the same BERT with
its K/V kernels repeated; `auto` keeping its kernel choice; the Splash GQA path compiled
ahead of time for a v5p slice (slow)."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import torch

import encoders
from encoders import base, bert, layers
from encoders.layers import attention, kernels
from tests.launch.aot_helpers import REPO
from tests.launch.aot_helpers import libtpu  # noqa: F401  (a fixture)

ATOL = 1e-5


def test_rmsnorm_matches_formula_and_transformers():
  from transformers.models.llama.modeling_llama import LlamaRMSNorm  # why: the reference
  rng = np.random.RandomState(0)
  x = rng.randn(2, 5, 12).astype(np.float32) * 3 + 1
  scale = (1 + 0.1 * rng.randn(12)).astype(np.float32)
  norm = layers.RMSNorm(1e-5)
  got = np.asarray(norm.apply({"params": {"scale": jnp.asarray(scale)}}, jnp.asarray(x)))
  want = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-5) * scale
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  ref = LlamaRMSNorm(12, eps=1e-5)
  with torch.no_grad():
    ref.weight.copy_(torch.tensor(scale))
    np.testing.assert_allclose(got, ref(torch.tensor(x)).numpy(), atol=1e-5, rtol=1e-5)
  # unlike LayerNorm, the mean is not removed
  ln = layers.LayerNorm(1e-5, use_bias=False).apply(
      {"params": {"scale": jnp.asarray(scale)}}, jnp.asarray(x))
  assert np.abs(np.asarray(ln) - got).max() > 0.1
  assert norm.apply({"params": {"scale": jnp.ones(12)}}, jnp.asarray(x),
                    ).dtype == jnp.float32


def test_make_norm_by_kind():
  x = jnp.ones((1, 3, 8))
  for kind, cls in (("layernorm", layers.LayerNorm), ("rmsnorm", layers.RMSNorm)):
    norm = layers.make_norm(kind, 1e-6, use_bias=False)(name="n")
    assert isinstance(norm, cls)
    assert list(norm.init(jax.random.PRNGKey(0), x)["params"]) == ["scale"]
  with pytest.raises(ValueError, match="no bias"):
    layers.make_norm("rmsnorm", 1e-6, use_bias=True)
  with pytest.raises(ValueError, match="unknown norm kind"):
    layers.make_norm("groupnorm", 1e-6)


def _qkv(h=6, g=2, t=256, b=2, k=16, seed=0):
  rng = np.random.RandomState(seed)
  q = jnp.asarray(rng.randn(b, t, h, k), jnp.float32)
  kk, v = (jnp.asarray(rng.randn(b, t, g, k), jnp.float32) for _ in range(2))
  lengths = [t, t - 37][:b]
  seg = np.zeros((b, t), np.int32)
  for i, n in enumerate(lengths):
    seg[i, :n] = np.where(np.arange(n) < n // 2, 1, 2)  # two packed documents, then pads
  return q, kk, v, jnp.asarray(seg)


@pytest.mark.parametrize("path", ["einsum", "cpu", "xla", "splash"])
def test_every_kernel_takes_grouped_kv_as_is(path):
  q, k, v, seg = _qkv()
  mask = layers.SegmentMask(seg).dense()
  h = q.shape[2]
  ref = kernels.attention_scores_einsum(q, kernels.repeat_kv(k, h), kernels.repeat_kv(v, h),
                                        mask)
  if path == "einsum":
    got = kernels.attention_scores_einsum(q, k, v, mask)
  elif path == "cpu":
    got = kernels.attention_head_major(q, k, v, mask)
  elif path == "xla":
    got = jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="xla")
  else:
    got = kernels.splash_attention(q, k, v, seg, interpret=True)
  real = np.asarray(seg) > 0
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(ref)[real], atol=ATOL)
  # the pairing of query and K/V heads matters: the other grouping differs
  wrong = kernels.attention_scores_einsum(q, jnp.tile(k, (1, 1, 3, 1)),
                                          jnp.tile(v, (1, 1, 3, 1)), mask)
  assert np.abs(np.asarray(wrong) - np.asarray(ref))[real].max() > 1e-2


def test_grouped_gradients_match_the_repeated_reference():
  q, k, v, seg = _qkv(t=16, k=8)
  mask = layers.SegmentMask(seg).dense()

  def loss(fn, q, k, v):
    return jnp.sum(jnp.sin(fn(q, k, v)))
  for fn in (kernels.attention_scores_einsum, kernels.attention_head_major):
    got = jax.jit(jax.grad(lambda *a: loss(lambda q, k, v: fn(q, k, v, mask), *a),
                           (0, 1, 2)))(q, k, v)
    want = jax.jit(jax.grad(lambda *a: loss(
        lambda q, k, v: kernels.attention_scores_einsum(
            q, kernels.repeat_kv(k, 6), kernels.repeat_kv(v, 6), mask), *a), (0, 1, 2)))(q, k, v)
    for g, w in zip(got, want):
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-4)


def _bert(kv_heads=None, impl="einsum"):
  cfg = bert.defaults()
  cfg.update(vocab_size=99, hidden_size=48, num_hidden_layers=2, num_attention_heads=6,
             intermediate_size=37, max_position_embeddings=32, heads=("mlm",),
             attention_impl=impl, dtype="float32")
  if kv_heads:
    cfg.num_key_value_heads = kv_heads  # the only change: GQA is a config setting
  return cfg


def test_bert_with_gqa_is_a_config_change_equal_to_repeated_kv_heads():
  cfg = _bert(kv_heads=2)
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  att = params["encoder"]["layer_0"]["attention"]
  assert att["key"]["kernel"].shape == (48, 2, 8) and att["query"]["kernel"].shape == (48, 6, 8)
  # the reference: plain multi-head BERT whose K/V kernels repeat each K/V head 3 times
  mha = encoders.build(_bert())
  rep = jax.tree.map(lambda x: x, params)
  for i in range(2):
    a = rep["encoder"][f"layer_{i}"]["attention"]
    for name in ("key", "value"):
      a[name] = {n: jnp.repeat(p, 3, axis=-2) for n, p in a[name].items()}
  rng = np.random.RandomState(1)
  ids = jnp.asarray(rng.randint(1, 99, (2, 13)))
  mask = jnp.asarray((np.arange(13)[None] < np.array([[13], [8]])).astype(np.int32))
  got = jax.jit(model.apply)({"params": params}, ids, mask)
  want = jax.jit(mha.apply)({"params": rep}, ids, mask)
  real = np.asarray(mask) > 0
  np.testing.assert_allclose(np.asarray(got.mlm_logits)[real],
                             np.asarray(want.mlm_logits)[real], atol=ATOL)
  # fewer FLOPs for the smaller K/V projections: 2 layers x (k, v) x 2TD x (H - G) K
  t, d = 128, 48
  assert (base.forward_flops(_bert(), t) - base.forward_flops(cfg, t)
          == 2 * 2 * 2 * t * d * (48 - 2 * 8))


def test_bert_gqa_config_errors_are_named():
  with pytest.raises(ValueError, match="num_key_value_heads=4"):
    jax.eval_shape(lambda: encoders.init_params(encoders.build(_bert(kv_heads=4)),
                                                jax.random.PRNGKey(0)))


@pytest.mark.parametrize("platform,impl", [("tpu", "splash"), ("gpu", "cudnn"),
                                           ("cpu", "cpu")])
def test_auto_still_picks_the_fast_kernel_with_gqa(platform, impl):
  for family_cfg in (_bert(kv_heads=2), encoders.family_defaults("eurobert")):
    cfg = ml_collections.ConfigDict(family_cfg.to_dict())
    cfg.attention_impl, cfg.attention_probs_dropout_prob, cfg.dtype = "auto", 0.0, "auto"
    base.resolve_auto(cfg, platform, 512)
    assert cfg.attention_impl == impl, (cfg.family, platform, cfg.attention_impl)
  assert attention.choose_impl(platform, 512, head_dim=64)[0] == impl


# Run in a subprocess: libtpu must start with the compile-only environment
# (launch.perf.aot.quiet_libtpu_env) before JAX does.
_SPLASH_GQA_AOT = """
from launch.perf import aot
aot.quiet_libtpu_env()
import flax.linen as nn, jax, jax.numpy as jnp, numpy as np
from jax.experimental import topologies
from encoders.layers import kernels
topo = topologies.get_topology_desc(platform="tpu", topology_name="v5p:2x2x1")
mesh = jax.sharding.Mesh(np.array(topo.devices).reshape(2, 2), ("data", "tensor"))
rules = (("act_batch", "data"), ("act_len", None), ("act_heads", "tensor"), ("act_kv", None))
P = jax.sharding.PartitionSpec
spec = jax.sharding.NamedSharding(mesh, P("data", None, "tensor", None))

def step(q, k, v, seg):
  def f(q, k, v):
    return jnp.sum(kernels.splash_attention(q, k, v, seg).astype(jnp.float32))
  return jax.grad(f, (0, 1, 2))(q, k, v)

args = [jax.ShapeDtypeStruct((4, 512, h, 64), jnp.bfloat16, sharding=spec) for h in (6, 2, 2)]
args.append(jax.ShapeDtypeStruct((4, 512), jnp.int32,
                                 sharding=jax.sharding.NamedSharding(mesh, P("data", None))))
with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
  compiled = jax.jit(step).lower(*args).compile()
calls = [c["name"] for c in aot.kernel_cost.custom_calls(compiled.as_text())]
print("SPLASH_CALLS", sorted(c for c in calls if "splash" in c.lower()))
"""


@pytest.mark.slow
def test_splash_gqa_compiles_for_v5p_sharded_over_heads(libtpu):  # noqa: F811
  """The Splash kernel with 6 query heads over 2 K/V heads, forward and backward, lowered
  and compiled for a v5p:2x2x1 slice (libtpu, no TPU) with batch and heads sharded."""
  env = dict(os.environ, TPU_LIBRARY_PATH=libtpu, XLA_FLAGS="", JAX_PLATFORMS="cpu")
  p = subprocess.run([sys.executable, "-c", _SPLASH_GQA_AOT], cwd=REPO, env=env,
                     capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]
  line = next(x for x in p.stdout.splitlines() if x.startswith("SPLASH_CALLS"))
  assert "fwd" in line and "dkv" in line, line
