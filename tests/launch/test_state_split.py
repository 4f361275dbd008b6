"""`mesh.shard_state_over_data` (launch/trainer/sharding.py): the float32 master params and
their optimizer state split over the data axis, the model reading a gathered view. The
split must change where the state lives, never a value."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from configs import albert, bert, deberta, distilbert, electra, modernbert, roberta
from launch.perf import synthetic
from launch import trainer as train
from launch.trainer import sharding


def _config(module=bert, variant="tiny", split=True, **model):
  c = module.get_config(variant).unlock()
  c.model.num_hidden_layers = 2
  c.model.hidden_size = 128
  c.model.num_attention_heads = 2
  c.model.intermediate_size = 512
  c.model.vocab_size = 1024  # 1024 x 128 tables: above sharding.MIN_SPLIT_SIZE
  c.tokenizer.vocab_size = 1024
  for k, v in model.items():
    c.model[k] = v
  for i, k in enumerate(sorted(k for k in c.model if k.endswith("_token_id"))):
    if c.model[k] is not None and c.model[k] >= c.model.vocab_size:  # ModernBERT's 50k ids
      c.model[k] = i
  c.data.seq_len = 32
  c.data.global_batch = 8
  c.optimizer.warmup_steps = 1
  c.optimizer.learning_rate = 1e-3
  c.mesh.shape = (4, 1, 2)
  c.mesh.shard_state_over_data = split
  return c


def _setup(c):
  return train.build(c, synthetic.SyntheticTokenizer.for_model(c.model), jax.devices()[:8])


def _batch(setup, rows, seq, seed):
  objective = setup.objective
  rng = np.random.RandomState(seed)
  layout = [[int(n)] for n in rng.randint(8, seq + 1, rows)]
  return objective.batch_spec().synthesize(layout, seq, seed)


def test_large_leaves_and_their_moments_are_split_over_data():
  setup = _setup(_config())
  state = setup.init_state()
  enc = state.params["encoder"]
  table = enc["embeddings"]["word_embeddings"]["embedding"]  # (1024, 128): vocab, embed
  assert table.sharding.spec == P(("tensor", "data"), "fsdp")  # tensor 2 x data 4
  assert table.addressable_shards[0].data.shape == (128, 128)
  wi = enc["encoder"]["layer_0"]["mlp"]["wi"]["kernel"]  # (128, 512): embed, mlp
  assert "data" in jax.tree.leaves(tuple(wi.sharding.spec))
  assert np.prod(wi.addressable_shards[0].data.shape) == 128 * 512 // 8
  norm = enc["embeddings"]["norm"]["scale"]  # 128 elements: below MIN_SPLIT_SIZE
  assert "data" not in jax.tree.leaves(tuple(norm.sharding.spec))
  mu = state.opt_state[1][0].mu["encoder"]["embeddings"]["word_embeddings"]["embedding"]
  assert mu.sharding == table.sharding  # Adam's moments follow their parameter
  # the model's own shardings are what the step reads (the view), split or not
  model = setup.param_shardings["encoder"]["embeddings"]["word_embeddings"]["embedding"]
  assert model.spec == P("tensor", "fsdp")


def test_split_off_keeps_the_model_shardings():
  setup = _setup(_config(split=False))
  table = setup.abstract_state.params["encoder"]["embeddings"]["word_embeddings"]["embedding"]
  assert table.sharding.spec == P("tensor", "fsdp")


def test_split_state_trains_exactly_as_the_replicated_one():
  """Three float32 steps (dropout on, gradient clipping on) from the same init: the same
  losses and, to float32 rounding, the same params, with and without the split."""
  runs = {}
  for split in (False, True):
    setup = _setup(_config(split=split))
    state = setup.init_state()
    losses = []
    for i in range(3):
      batch = sharding.global_batch(_batch(setup, 8, 32, i), setup.batch_sharding)
      state, sums = setup.train_step(state, batch)
      losses.append(float(sums["mlm_loss_sum"]) / float(sums["mlm_weight_sum"]))
    runs[split] = (losses, jax.device_get(state.params), float(sums["grad_norm"]))
  (l0, p0, g0), (l1, p1, g1) = runs[False], runs[True]
  assert l0[2] != l0[0]  # the params moved
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  np.testing.assert_allclose(g1, g0, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(p1)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


FAMILIES = [(bert, "tiny"), (roberta, "base"), (albert, "base"), (distilbert, "tiny_mlm"),
            (electra, "small"), (deberta, "v3-base"), (modernbert, "base")]


@pytest.mark.parametrize("module,variant", FAMILIES, ids=[m.__name__.split(".")[-1]
                                                          for m, _ in FAMILIES])
def test_the_bfloat16_view_changes_no_value(module, variant):
  """The view gathers in bfloat16 the leaves the loss reads only through a cast to
  bfloat16 (`sharding.cast_on_use`, from the loss's jaxpr). Then the bfloat16 loss and its
  gradient must be bitwise what they are without the view, in every family: DeBERTa reads
  its relative-position table in float32, ELECTRA shares its embeddings between two
  models, the tied decoders read the word table twice."""
  c = _config(module, variant)
  c.model.dtype = "bfloat16"
  c.model.hidden_dropout_prob = 0.0
  c.model.attention_probs_dropout_prob = 0.0
  c.mesh.shape = (1, 1, 1)
  setup = train.build(c, synthetic.SyntheticTokenizer.for_model(c.model), jax.devices()[:1])
  state = setup.init_state()
  # no leaf bfloat16-exact (LayerNorm scales start at 1, biases at 0)
  leaves, tree = jax.tree.flatten(state.params)
  keys = jax.random.split(jax.random.PRNGKey(3), len(leaves))
  state = state.replace(params=jax.tree.unflatten(tree, [
      x + 0.01 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)]))
  objective = setup.objective
  batch = jax.tree.map(jnp.asarray, _batch(setup, 4, 32, 0))
  batch = jax.jit(objective.transform)(batch, jax.random.PRNGKey(1))
  model_shardings = {k: setup.param_shardings[k] for k in state.params}
  key = jax.random.PRNGKey(2)
  raw = lambda p: objective.loss({**p, **state.frozen}, batch, key, True)[0]
  flags = sharding.cast_on_use(raw, state.params, jnp.bfloat16)
  named = {jax.tree_util.keystr(k): f for k, f in jax.tree_util.tree_flatten_with_path(flags)[0]}
  assert any(f for n, f in named.items() if n.endswith("['kernel']"))
  assert not any(f for n, f in named.items() if "norm" in n and n.endswith("['scale']"))
  if module is deberta:
    assert not any(f for n, f in named.items() if "rel_embeddings" in n)

  def loss(p, narrow):
    if narrow is not None:
      p = sharding.gathered_view(p, model_shardings, jnp.bfloat16, narrow)
    terms, _ = objective.loss({**p, **state.frozen}, batch, key, True)
    return objective.combine(terms, objective.normalizers(batch))

  grad = lambda narrow: jax.jit(jax.value_and_grad(lambda p: loss(p, narrow)))(state.params)
  plain, viewed = grad(None), grad(flags)
  assert float(plain[0]) == float(viewed[0])
  for a, b in zip(jax.tree.leaves(plain[1]), jax.tree.leaves(viewed[1])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # The comparison can fail: gathering a float32-read leaf (every LayerNorm scale) narrow
  # changes the loss.
  wrong = jax.tree_util.tree_map_with_path(
      lambda k, f: f or jax.tree_util.keystr(k).endswith("norm']['scale']"), flags)
  assert float(grad(wrong)[0]) != float(plain[0])


def test_cast_on_use_follows_scanned_and_rematted_layers():
  """BERT-large's recipe scans its layers (and remat policies wrap them): the layer kernels
  are read inside the scan body, and must still be found cast-only."""
  c = _config(bert, "tiny", scan_layers=True, remat_policy="full", dtype="bfloat16")
  c.mesh.shape = (1, 1, 1)
  setup = train.build(c, synthetic.SyntheticTokenizer.for_model(c.model), jax.devices()[:1])
  params = setup.abstract_state.params
  objective = setup.objective
  batch = jax.tree.map(jnp.asarray, _batch(setup, 4, 32, 0))
  batch = jax.jit(objective.transform)(batch, jax.random.PRNGKey(1))
  flags = sharding.cast_on_use(
      lambda p: objective.loss({**p}, batch, jax.random.PRNGKey(2), True)[0], params,
      jnp.bfloat16)
  named = {jax.tree_util.keystr(k): f for k, f in jax.tree_util.tree_flatten_with_path(flags)[0]}
  layer_kernels = [n for n in named if "['encoder']['encoder']" in n and n.endswith("['kernel']")]
  assert layer_kernels and all(named[n] for n in layer_kernels), named
  assert not any(f for n, f in named.items() if n.endswith("['scale']"))
