"""Issue 46, the encoder side: no silently wrong results from bad inputs under jit, from
bad checkpoints, and no user file deleted by an HF export."""
import dataclasses
import json
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import encoders
from encoders import base, outdir, tasks
from encoders.hf import tasks as tasks_hf
from tests.encoders import hf_helpers as H

# ---- bad ids under jax.jit ---------------------------------------------------------------

SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=40, max_position_embeddings=40)
FAMILY_EXTRA = {
    "albert": dict(embedding_size=16, num_hidden_groups=1),
    "electra": dict(embedding_size=16, heads=("mlm", "rtd")),
    "deberta": dict(embedding_size=32, max_relative_positions=16, type_vocab_size=2),
    "deberta-v2": dict(embedding_size=32, position_buckets=8, max_relative_positions=16,
                       position_biased_input=True, type_vocab_size=2),
    "modernbert": dict(num_hidden_layers=3, local_attention=4, global_attn_every_n_layers=2,
                       pad_token_id=0),
}
FAMILIES = sorted(base._FAMILIES)


def small_config(family, **extra):
  from encoders import deberta
  cfg = deberta.defaults_v1("base") if family == "deberta" else encoders.family_defaults(
      family)
  for key, value in {**SMALL, **FAMILY_EXTRA.get(family, {}), **extra}.items():
    cfg[key] = value
  cfg.family = family
  cfg.vocab_pad_multiple = 8  # padded rows (99..103) must count as out of range too
  cfg.dtype = "float32"
  return cfg


def small_model(family, **extra):
  model = encoders.build(small_config(family, **extra))
  return model, encoders.init_params(model, jax.random.PRNGKey(0))


def _outputs(out):
  """An EncoderOutput / TaskOutput -> {field: numpy array} of the fields it has."""
  return {f.name: np.asarray(getattr(out, f.name)) for f in dataclasses.fields(out)
          if getattr(out, f.name) is not None}


def _good_batch(model, batch=4, length=8):
  rng = np.random.RandomState(0)
  ids = rng.randint(3, model.config.vocab_size, size=(batch, length)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[0, 6:] = 0
  return ids, mask


def _check_poisoned(good, bad, bad_rows):
  for name, g in good.items():
    b = bad[name]
    assert g.shape == b.shape, name
    for r in range(g.shape[0]):
      if r in bad_rows:
        assert np.isnan(b[r]).all(), f"{name} row {r} should be all NaN"
      else:
        assert np.isfinite(g[r]).all(), name
        np.testing.assert_array_equal(g[r], b[r], err_msg=f"{name} row {r} changed")


@pytest.mark.parametrize("family", FAMILIES)
def test_ids_outside_the_vocabulary_give_nan_rows_under_jit(family):
  model, params = small_model(family)
  v = model.config.vocab_size
  ids, mask = _good_batch(model)
  bad = ids.copy()
  bad[1, 2] = -1  # jnp.take would wrap this to the last row
  bad[2, 7] = v  # inside the padded table (vocab_pad_multiple=8): a zero row
  bad[3, 0] = np.iinfo(np.int32).max
  f = jax.jit(lambda p, i, m: model.apply({"params": p}, i, m))
  good, got = _outputs(f(params, ids, mask)), _outputs(f(params, bad, mask))
  assert set(good) >= {"last_hidden_state"}
  _check_poisoned(good, got, {1, 2, 3})
  with pytest.raises(ValueError, match="input_ids contains -1"):
    model.apply({"params": params}, bad, mask)  # eagerly: refused


@pytest.mark.parametrize("family", ["bert", "deberta-v2", "modernbert"])
def test_task_models_give_nan_rows_for_bad_ids_under_jit(family):
  cfg = small_config(family)
  for task in ("sequence", "token", "qa"):
    model = tasks.build(cfg, task, num_labels=3)
    params = tasks.init_params(model, jax.random.PRNGKey(0))
    ids, mask = _good_batch(model)
    bad = ids.copy()
    bad[2, 1] = -1
    f = jax.jit(lambda p, i, m, model=model: model.apply({"params": p}, i, m))
    _check_poisoned(_outputs(f(params, ids, mask)), _outputs(f(params, bad, mask)), {2})


def test_bad_token_types_positions_and_mask_values_give_nan_rows_under_jit():
  model, params = small_model("bert")
  ids, mask = _good_batch(model)
  types = np.zeros_like(ids)
  pos = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).astype(np.int32).copy()
  f = jax.jit(lambda p, i, m, t, q: model.apply({"params": p}, i, m, t, position_ids=q))
  good = _outputs(f(params, ids, mask, types, pos))
  bad_types, bad_pos, bad_mask = types.copy(), pos.copy(), mask.copy()
  bad_types[0, 3] = 2  # type_vocab_size=2
  bad_pos[1, 4] = 40  # max_position_embeddings=40
  bad_pos[2, 0] = -1
  bad_mask[3, 5] = 2
  got = _outputs(f(params, ids, bad_mask, bad_types, bad_pos))
  _check_poisoned(good, got, {0, 1, 2, 3})


def test_bad_masked_positions_give_nan_logits_there_under_jit():
  model, params = small_model("bert", heads=("mlm",))
  ids, mask = _good_batch(model)
  positions = np.array([[1, 2], [0, 3], [4, 5], [6, 7]], np.int32)
  f = jax.jit(lambda p, i, q: model.apply({"params": p}, i, masked_positions=q).mlm_logits)
  good = np.asarray(f(params, ids, positions))
  wrong = positions.copy()
  wrong[1, 1] = -1  # would wrap to position T-1
  got = np.asarray(f(params, ids, wrong))
  assert np.isnan(got[1, 1]).all()
  mask = np.ones(got.shape[:2], bool)
  mask[1, 1] = False
  np.testing.assert_array_equal(good[mask], got[mask])
  with pytest.raises(ValueError, match="masked_positions contains -1"):
    model.apply({"params": params}, ids, masked_positions=wrong)


@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_the_poison_changes_nothing_for_good_ids(family, monkeypatch):
  model, params = small_model(family)
  ids, mask = _good_batch(model)

  def run():  # a new function each time: traced afresh
    return _outputs(jax.jit(lambda p, i, m: model.apply({"params": p}, i, m))(params, ids,
                                                                               mask))
  checked = run()
  monkeypatch.setattr(base, "poison", lambda x, bad: x)
  unchecked = run()
  for k in checked:
    np.testing.assert_array_equal(checked[k], unchecked[k], err_msg=k)


def test_pure_apply_fn_poisons_bad_rows_under_jit():
  model, params = small_model("distilbert")
  apply_fn = encoders.as_function(model)
  ids, mask = _good_batch(model)
  ids[0, 0] = -5
  out = jax.jit(apply_fn)(params, ids, mask)
  assert np.isnan(np.asarray(out.last_hidden_state[0])).all()
  assert np.isfinite(np.asarray(out.last_hidden_state[1:])).all()
