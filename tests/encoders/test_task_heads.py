"""Task heads for every registered family, against transformers' task models in float32:
parity on padded batches (1e-4), exports that load with no missing or unexpected keys and
with id2label kept, and invariance of every head to extra padding (1e-5).

Parametrized over every HF model type the zoo maps (encoders.hf), so a family that lands
later is tested here without editing this file; a family that has not declared its head
kinds (encoders/tasks/base.py's docstring) FAILS these tests with that message. A family
whose tiny HF config needs more than the common sizes adds an entry to EXTRA
(tests/encoders/task_helpers.py).
"""
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import encoders
from encoders import base, tasks
from encoders import hf as ehf
from encoders.hf import tasks as tasks_hf
from tests.encoders import hf_helpers as H
from tests.encoders.task_helpers import (ATOL, AUTO, LABELS, MODEL_TYPES, TASKS, hf_config,
                                         tiny_task_model)

def _family_of(model_type):
  hf = hf_config(model_type, "qa").to_diff_dict()
  return ehf.mapping_for(model_type).config_from_hf(hf, ()).family


def _hf_class(model_type, task):
  """transformers' class name for the task, or None where the family maps none (its
  declared head kinds: transformers has no EuroBERT, NomicBERT or GTE QA class)."""
  mapping = ehf.mapping_for(model_type)
  cfg = mapping.config_from_hf(hf_config(model_type, task).to_diff_dict(), ())
  return mapping.task_architecture(cfg, tasks.get(task))


PAIRS = [(mt, task) for mt in MODEL_TYPES for task in TASKS if _hf_class(mt, task)]



_SAVED = {}


@pytest.fixture
def saved(tmp_path_factory):
  """(model_type, task) -> (HF model, its saved directory), built once per session."""
  def get(model_type, task):
    key = (model_type, task)
    if key not in _SAVED:
      hf = tiny_task_model(model_type, task, seed=len(_SAVED))
      path = tmp_path_factory.mktemp(f"{model_type}_{task}")
      hf.save_pretrained(path)
      _SAVED[key] = (hf, str(path))
    return _SAVED[key]
  return get


def _hf_outputs(hf, ids, mask, types):
  kw = dict(attention_mask=torch.tensor(mask))
  if getattr(hf.config, "type_vocab_size", 0) and hf.config.type_vocab_size > 1:
    kw["token_type_ids"] = torch.tensor(types)
  with torch.no_grad():
    out = hf(torch.tensor(ids), **kw)
  if getattr(out, "start_logits", None) is not None:
    return {"start_logits": out.start_logits.numpy(), "end_logits": out.end_logits.numpy()}
  return {"logits": out.logits.numpy()}


def _ours(model, params, ids, mask, types, extra_pad=0):
  pad = model.config.pad_token_id
  if extra_pad:
    ids = np.pad(ids, ((0, 0), (0, extra_pad)), constant_values=pad)
    mask = np.pad(mask, ((0, 0), (0, extra_pad)))
    types = np.pad(types, ((0, 0), (0, extra_pad)))
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  t = ids.shape[1] - extra_pad
  res = {"embedding": np.asarray(tasks.mean_pool(out.last_hidden_state, jnp.asarray(mask)))}
  if out.logits is not None:
    logits = np.asarray(out.logits)
    res["logits"] = logits[:, :t] if tasks.get(model.task).per_token else logits
  if out.pooled is not None:
    res["pooled"] = np.asarray(out.pooled)
  for name in ("start_logits", "end_logits"):
    if getattr(out, name) is not None:
      res[name] = np.asarray(getattr(out, name))[:, :t]
  return res


def _assert_parity(ours, ref, mask, task):
  real = mask.astype(bool)
  for name, want in ref.items():
    got = ours[name]
    assert got.shape == want.shape, (name, got.shape, want.shape)
    if task == "sequence":
      np.testing.assert_allclose(got, want, atol=ATOL, rtol=0, err_msg=name)
    else:  # per-token outputs: real positions (HF does not mask padded ones either)
      np.testing.assert_allclose(got[real], want[real], atol=ATOL, rtol=0, err_msg=name)
    assert np.abs(want).max() > 1e-3  # not vacuous


def test_every_registered_family_has_an_hf_mapping_with_task_heads():
  """Fails, naming what to add, for a registered family without head declarations; every
  head kind a family declares gives each registered task of that kind an HF class."""
  families = {}
  for mt in MODEL_TYPES:
    families.setdefault(_family_of(mt), []).append(mt)
  unmapped = sorted(set(base._FAMILIES) - set(families))
  assert not unmapped, f"registered families without an HF mapping: {unmapped}"
  for name in sorted(base._FAMILIES):
    cfg = encoders.family_defaults(name)
    try:
      kinds = tasks.family_heads(cfg)
    except ValueError as e:
      pytest.fail(str(e))
    assert {"pooled", "per_token"} <= set(kinds) <= set(tasks.HEAD_KINDS), (name, sorted(kinds))
    for task in tasks.registered():
      for mt in families[name]:
        mapping = ehf.mapping_for(mt)
        arch = mapping.task_architecture(cfg, task)
        if task.hf_suffix is None:
          assert arch is None, (name, mt, task.name)
        # a kind the family leaves out (or maps to no class) must be one transformers lacks
        if arch is None and task.hf_suffix is not None:
          prefix = mapping.task_prefix(cfg)
          assert not hasattr(T, f"{prefix}{task.hf_suffix}"), (
              f"{name}: transformers has {prefix}{task.hf_suffix}; declare its head kind")
        else:
          assert arch is None or hasattr(T, arch), (name, arch)


@pytest.mark.parametrize("model_type,task", PAIRS)
def test_parity_with_transformers_task_models(model_type, task, saved):
  hf, path = saved(model_type, task)
  model, params = tasks_hf.from_hf(path)
  assert model.task == task and model.labels == LABELS[task]
  ids, mask, types = H.padded_batch(hf.config, seed=3)
  assert not mask.all()
  _assert_parity(_ours(model, params, ids, mask, types), _hf_outputs(hf, ids, mask, types),
                 mask, task)


@pytest.mark.parametrize("model_type,task", PAIRS)
def test_export_loads_in_transformers_with_labels(model_type, task, saved, tmp_path):
  hf, path = saved(model_type, task)
  model, params = tasks_hf.from_hf(path)
  tasks_hf.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = AUTO[task].from_pretrained(str(tmp_path / "out"), output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert type(loaded) is type(hf)
  if LABELS[task]:
    assert loaded.config.id2label == dict(enumerate(LABELS[task]))
  ids, mask, types = H.padded_batch(hf.config, seed=5)
  ref, got = _hf_outputs(hf, ids, mask, types), _hf_outputs(loaded.eval(), ids, mask, types)
  for name in ref:
    np.testing.assert_allclose(got[name], ref[name], atol=1e-6)


@pytest.mark.parametrize("model_type,task", PAIRS)
def test_padding_invariance(model_type, task, saved):
  """0, 10 and 100 extra padding tokens: the same pooled outputs, logits and embeddings."""
  hf, path = saved(model_type, task)
  model, params = tasks_hf.from_hf(path)
  ids, mask, types = H.padded_batch(hf.config, seed=7)
  ref = _ours(model, params, ids, mask, types)
  real = mask.astype(bool)
  for extra in (10, 100):
    got = _ours(model, params, ids, mask, types, extra_pad=extra)
    for name, want in ref.items():
      a, b = (got[name], want) if name in ("embedding", "pooled", "logits") and (
          task == "sequence" or name == "embedding") else (got[name][real], want[real])
      np.testing.assert_allclose(a, b, atol=1e-5, rtol=0, err_msg=f"{name} +{extra} pads")


@pytest.mark.parametrize("task", ("sequence", "token"))
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_packed_rows_give_each_example_its_unpacked_outputs(model_type, task, saved):
  """Fine-tuning's packing (finetune.packing): the padded batch's three examples laid
  end to end in one row, plus a row holding the shortest alone, with segment ids; each
  example's logits (a sequence head's at its first token) and its tokens' hidden states
  equal the unpacked batch's (1e-5)."""
  hf, path = saved(model_type, task)
  model, params = tasks_hf.from_hf(path)
  ids, mask, types = H.padded_batch(hf.config, seed=9)
  lengths = mask.sum(1)
  pad = model.config.pad_token_id
  width = int(lengths.sum()) + 3
  rows = [[0, 1, 2], [2]]
  p_ids = np.full((2, width), pad)
  p_types, p_seg = np.zeros((2, width), np.int64), np.zeros((2, width), np.int64)
  starts = {}
  for r, members in enumerate(rows):
    col = 0
    for s, i in enumerate(members):
      n = int(lengths[i])
      p_ids[r, col:col + n], p_types[r, col:col + n] = ids[i, :n], types[i, :n]
      p_seg[r, col:col + n] = s + 1
      starts[r, i] = col
      col += n
  ref = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  got = model.apply({"params": params}, jnp.asarray(p_ids), jnp.asarray(p_seg > 0),
                    jnp.asarray(p_types), segment_ids=jnp.asarray(p_seg))
  checked = 0
  for (r, i), col in starts.items():
    n = int(lengths[i])
    np.testing.assert_allclose(got.last_hidden_state[r, col:col + n],
                               ref.last_hidden_state[i, :n], atol=1e-5, rtol=0)
    want = ref.logits[i] if task == "sequence" else ref.logits[i, :n]
    have = got.logits[r, col] if task == "sequence" else got.logits[r, col:col + n]
    np.testing.assert_allclose(have, want, atol=1e-5, rtol=0, err_msg=f"row {r} ex {i}")
    checked += 1
  assert checked == 4 and np.abs(np.asarray(ref.logits)).max() > 1e-3
  if task == "sequence":  # a different packing must not leak: examples differ
    assert np.abs(np.asarray(ref.logits[0] - ref.logits[1])).max() > 1e-4


def test_packed_rows_are_refused_for_qa(saved):
  hf, path = saved("bert", "qa")
  model, params = tasks_hf.from_hf(path)
  ids = jnp.ones((1, 8), jnp.int32)
  with pytest.raises(ValueError, match="segment_ids.*qa"):
    model.apply({"params": params}, ids, segment_ids=ids)


def test_sequence_regression_and_scanned_layers_round_trip(tmp_path):
  """num_labels=1 exports as regression; scan_layers imports, runs and exports the same."""
  hf = tiny_task_model("bert", "sequence", seed=11, num_labels=1, id2label={0: "score"},
                       label2id={"score": 0})
  hf.save_pretrained(tmp_path / "src")
  ids, mask, types = H.padded_batch(hf.config, seed=1)
  ref = _hf_outputs(hf, ids, mask, types)
  for scan in (False, True):
    model, params = tasks_hf.from_hf(str(tmp_path / "src"), scan_layers=scan)
    assert model.task == "regression" and model.num_labels == 1
    assert ("layers" in params["encoder"]) == scan
    _assert_parity(_ours(model, params, ids, mask, types), ref, mask, "sequence")
    tasks_hf.to_hf(model, params, str(tmp_path / f"out{scan}"))
    loaded = T.AutoModelForSequenceClassification.from_pretrained(str(tmp_path / f"out{scan}"))
    assert loaded.config.problem_type == "regression"
    np.testing.assert_allclose(_hf_outputs(loaded.eval(), ids, mask, types)["logits"],
                               ref["logits"], atol=1e-6)


def test_build_errors_name_the_problem():
  cfg = encoders.family_defaults("bert")
  with pytest.raises(ValueError, match="unknown task"):
    tasks.build(cfg, "summarize")
  with pytest.raises(ValueError, match="num_labels"):
    tasks.build(cfg, "sequence", num_labels=0)


def test_undeclared_family_fails_with_a_pointer_to_the_docs():
  @base.register_family("_undeclared_test")
  class Undeclared(base.family("bert")):
    task_heads = None
  try:
    cfg = encoders.family_defaults("bert")
    cfg.family = "_undeclared_test"
    with pytest.raises(ValueError, match="has not declared task heads.*encoders/tasks/base.py"):
      tasks.build(cfg, "sequence")
  finally:
    del base._FAMILIES["_undeclared_test"]


def test_mean_pool_ignores_padded_values():
  """The issue's example: real values 2 and 4 with a padded 100 pool to 3, not 35.3."""
  h = jnp.asarray([[[2.0], [4.0], [100.0]]])
  assert float(tasks.mean_pool(h, jnp.asarray([[1, 1, 0]]))[0, 0]) == pytest.approx(3.0)


def test_embed_is_unit_masked_mean_of_the_last_hidden_state(saved):
  _, path = saved("bert", "token")
  model, params = tasks_hf.from_hf(path)
  ids, mask, types = H.padded_batch(model.config, seed=2)
  args = (jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  hidden = np.asarray(model.apply({"params": params}, *args).last_hidden_state)
  m = mask[..., None]
  want = (hidden * m).sum(1) / m.sum(1)
  np.testing.assert_allclose(tasks.embed(model, params, *args, normalize=False), want,
                             atol=1e-6)
  unit = np.asarray(tasks.embed(model, params, *args))
  np.testing.assert_allclose(unit, want / np.linalg.norm(want, axis=1, keepdims=True),
                             atol=1e-6)


def test_encoder_loader_points_task_dirs_at_the_task_loader(saved):
  """encoders.hf.from_hf on a fine-tuned (task) directory names the loader that reads
  it; encoders.hf.tasks.from_hf loads the same directory."""
  _, path = saved("bert", "sequence")
  with pytest.raises(ValueError, match="BertForSequenceClassification.*is a task model.*"
                                       "encoders.hf.tasks.from_hf"):
    ehf.from_hf(path)
  model, params = tasks_hf.from_hf(path)
  assert "sequence_head" in params
