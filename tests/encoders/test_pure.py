"""The encoder inside other JAX code, for every registered model type: a plain function
(jit, grad, vmap), a Linen field with pretrained weights placed into it, an NNX module;
a small classifier trains on top of it both ways."""
import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import encoders
from tests.encoders import family_dirs as F

TYPES = F.params()  # BERT in the default suite, every other family under slow


def _batch(seed=0, rows=8, length=9):
  rng = np.random.RandomState(seed)
  ids = rng.randint(3, 90, size=(rows, length))
  mask = np.ones_like(ids)
  mask[::2, -3:] = 0
  labels = (ids[:, 1] > 45).astype(np.int32)  # learnable from the first real token
  return jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(labels)


@pytest.mark.parametrize("model_type", TYPES)
def test_apply_fn_is_a_plain_jittable_differentiable_vmappable_function(model_type):
  path = F.tiny_dir(model_type)
  apply_fn, params = encoders.load(path)
  model, ref_params = encoders.from_hf(path)
  sig = inspect.signature(apply_fn)
  assert list(sig.parameters)[:4] == ["params", "input_ids", "attention_mask",
                                      "token_type_ids"]
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(params))
  ids, mask, _ = _batch()
  ref = jax.jit(lambda p: model.apply({"params": p}, ids, mask).last_hidden_state)(
      ref_params)
  out = jax.jit(apply_fn)(params, ids, mask).last_hidden_state
  np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5)

  grads = jax.jit(jax.grad(
      lambda p: jnp.sum(apply_fn(p, ids, mask).last_hidden_state ** 2)))(params)
  norms = [float(jnp.linalg.norm(g)) for g in jax.tree.leaves(grads)]
  assert all(np.isfinite(norms)) and sum(n > 0 for n in norms) > len(norms) // 2

  stacked = jax.jit(jax.vmap(lambda i, m: apply_fn(params, i, m).last_hidden_state))(
      ids.reshape(2, 4, -1), mask.reshape(2, 4, -1))
  np.testing.assert_allclose(np.asarray(stacked).reshape(ref.shape), np.asarray(ref),
                             atol=1e-5)
  # dropout only when asked (BERT/RoBERTa checkpoints have it; ALBERT's and ModernBERT's
  # configs set none): then different from the deterministic output
  drop = jax.jit(lambda p, r: apply_fn(p, ids, mask, dropout_rng=r).last_hidden_state)(
      params, jax.random.PRNGKey(0))
  assert np.all(np.isfinite(np.asarray(drop)))
  if apply_fn.config.family == "bert":
    assert not np.allclose(np.asarray(drop), np.asarray(ref), atol=1e-3)


class LinenClassifier(nn.Module):
  """A user's model: a pretrained encoder as a field, a fresh head."""
  encoder: nn.Module
  classes: int = 2

  @nn.compact
  def __call__(self, ids, mask):
    h = self.encoder(ids, mask).last_hidden_state
    return nn.Dense(self.classes, name="head")(h[:, 0])

  def features(self, ids, mask):
    return self.encoder(ids, mask).last_hidden_state


def _train(loss_and_grad, params, steps=8, lr=3e-3):
  tx = optax.adam(lr)
  opt = tx.init(params)
  losses = []
  for _ in range(steps):
    loss, g = loss_and_grad(params)
    updates, opt = tx.update(g, opt, params)
    params = optax.apply_updates(params, updates)
    losses.append(float(loss))
  return params, losses


@pytest.mark.slow  # default-suite time; the feature keeps a faster test by default
@pytest.mark.parametrize("model_type", TYPES)
def test_linen_submodule_takes_pretrained_weights_and_fine_tunes(model_type):
  model, pretrained = encoders.from_hf(F.tiny_dir(model_type))
  apply_fn = encoders.as_function(model)
  clf = LinenClassifier(encoder=model)
  ids, mask, labels = _batch()
  variables = jax.jit(clf.init)(jax.random.PRNGKey(1), ids, mask)
  params = encoders.place(nn.unbox(variables["params"]), pretrained, "encoder")
  feats = jax.jit(lambda p: clf.apply({"params": p}, ids, mask,
                                      method=LinenClassifier.features))(params)
  ref = jax.jit(lambda p: apply_fn(p, ids, mask).last_hidden_state)(pretrained)
  np.testing.assert_allclose(np.asarray(feats), np.asarray(ref), atol=1e-6)
  assert "head" in params and params["head"]["kernel"].shape == (model.config.hidden_size, 2)

  @jax.jit
  def loss_and_grad(p):
    def loss(p):
      logits = clf.apply({"params": p}, ids, mask)
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return jax.value_and_grad(loss)(p)
  trained, losses = _train(loss_and_grad, params)
  assert losses[-1] < losses[0] * 0.8, losses
  # the encoder itself was fine-tuned, not only the head
  a = jax.tree.leaves(trained["encoder"])
  b = jax.tree.leaves(pretrained)
  assert any(not np.allclose(np.asarray(x), np.asarray(y)) for x, y in zip(a, b))


def test_place_names_every_mismatch():
  model, pretrained = encoders.from_hf(F.tiny_dir("bert"))
  ids, mask, _ = _batch()
  params = jax.jit(LinenClassifier(encoder=model).init)(jax.random.PRNGKey(1), ids, mask)
  params = nn.unbox(params["params"])
  with pytest.raises(ValueError, match=r"no subtree 'backbone'.*keys there: \['encoder', "
                                       r"'head'\]"):
    encoders.place(params, pretrained, "backbone")
  bad = jax.tree.map(lambda x: x, pretrained)
  bad["embeddings"]["norm"]["scale"] = bad["embeddings"]["norm"]["scale"][:-1]
  del bad["embeddings"]["norm"]["bias"]
  bad["extra"] = {"w": jnp.zeros(3)}
  with pytest.raises(ValueError) as e:
    encoders.place(params, bad, "encoder")
  msg = str(e.value)
  assert "encoder/embeddings/norm/bias" in msg and "extra/w" in msg
  assert "encoder/embeddings/norm/scale: model (32,) vs pretrained (31,)" in msg
  # the user's tree is untouched by a successful place too
  before = np.asarray(params["encoder"]["embeddings"]["norm"]["scale"]).copy()
  encoders.place(params, pretrained, ["encoder"])
  np.testing.assert_array_equal(np.asarray(params["encoder"]["embeddings"]["norm"]["scale"]),
                                before)


def test_place_keeps_the_logical_axis_boxes_of_the_init():
  """A user who keeps Flax's logical-axis boxes (for sharding) gets them back."""
  model, pretrained = encoders.from_hf(F.tiny_dir("bert"))
  ids, mask, _ = _batch()
  boxed = jax.jit(LinenClassifier(encoder=model).init)(jax.random.PRNGKey(1), ids,
                                                       mask)["params"]
  placed = encoders.place(boxed, pretrained, "encoder")
  leaf = placed["encoder"]["embeddings"]["word_embeddings"]["embedding"]
  assert isinstance(leaf, nn.LogicallyPartitioned)
  np.testing.assert_array_equal(
      np.asarray(leaf.unbox()),
      np.asarray(pretrained["embeddings"]["word_embeddings"]["embedding"]))


class NnxClassifier(nnx.Module):
  def __init__(self, encoder, hidden, rngs):
    self.encoder = encoder
    self.head = nnx.Linear(hidden, 2, rngs=rngs)

  def __call__(self, ids, mask):
    return self.head(self.encoder(ids, mask).last_hidden_state[:, 0])


@pytest.mark.parametrize("model_type", TYPES)
def test_nnx_module_takes_pretrained_weights_and_fine_tunes(model_type):
  model, pretrained = encoders.from_hf(F.tiny_dir(model_type))
  apply_fn = encoders.as_function(model)
  ids, mask, labels = _batch()
  clf = NnxClassifier(encoders.to_nnx(model, pretrained), model.config.hidden_size,
                      nnx.Rngs(1))
  ref = apply_fn(pretrained, ids, mask).last_hidden_state
  np.testing.assert_allclose(np.asarray(clf.encoder(ids, mask).last_hidden_state),
                             np.asarray(ref), atol=1e-6)
  n_enc = len(jax.tree.leaves(nnx.state(clf.encoder, nnx.Param)))
  assert n_enc == len(jax.tree.leaves(pretrained))
  opt = nnx.Optimizer(clf, optax.adam(3e-3), wrt=nnx.Param)

  @nnx.jit
  def step(clf, opt):
    def loss(clf):
      return optax.softmax_cross_entropy_with_integer_labels(clf(ids, mask), labels).mean()
    value, grads = nnx.value_and_grad(loss)(clf)
    opt.update(clf, grads)
    return value
  losses = [float(step(clf, opt)) for _ in range(8)]
  assert losses[-1] < losses[0] * 0.8, losses
  after = nnx.state(clf.encoder, nnx.Param)
  changed = [not np.allclose(np.asarray(a), np.asarray(b))
             for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(pretrained))]
  assert any(changed)
