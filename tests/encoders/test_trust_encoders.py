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
    "eurobert": dict(pad_token_id=0, num_key_value_heads=2),
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
  cfg.family = family
  cfg.vocab_pad_multiple = 8  # padded rows (99..103) must count as out of range too
  cfg.dtype = "float32"
  for key, value in {**SMALL, **FAMILY_EXTRA.get(family, {}), **extra}.items():
    cfg[key] = value
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


# ---- HF loading refuses bad checkpoints -----------------------------------------------------

@pytest.fixture
def bert_dir(tmp_path):
  H.tiny_hf_model("BertForMaskedLM").save_pretrained(tmp_path / "bert")
  return tmp_path / "bert"


NAN_KEY = "bert.encoder.layer.1.attention.self.key.weight"


def _poke(path, key, value):
  f = path / "model.safetensors"
  tensors = load_file(f)
  tensors[key] = value(tensors[key]) if callable(value) else value
  save_file(tensors, f, metadata={"format": "pt"})


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_weight_is_refused_naming_file_and_tensor(bert_dir, bad):
  def spoil(x):
    x = x.copy()
    x[3, 5] = bad
    return x
  _poke(bert_dir, NAN_KEY, spoil)
  with pytest.raises(ValueError, match=r"model\.safetensors: tensor 'encoder\.layer\.1\."
                                       r"attention\.self\.key\.weight' holds 1 non-finite"):
    encoders.from_hf(str(bert_dir))
  with pytest.raises(ValueError, match="allow_nonfinite"):
    encoders.load(str(bert_dir))
  model, params = encoders.from_hf(str(bert_dir), allow_nonfinite=True)  # the opt-out
  kernel = np.asarray(params["encoder"]["layer_1"]["attention"]["key"]["kernel"])
  assert np.sum(~np.isfinite(kernel)) == 1


def test_nonfinite_weight_is_refused_when_loading_sharded_onto_a_mesh(bert_dir):
  _poke(bert_dir, "bert.embeddings.word_embeddings.weight",
        lambda x: np.where(np.arange(x.size).reshape(x.shape) == 700, np.nan, x))
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:2]).reshape(1, 2, 1),
                           ("data", "fsdp", "tensor"))
  with pytest.raises(ValueError, match=r"word_embeddings\.weight' holds 1 non-finite"):
    encoders.from_hf(str(bert_dir), mesh=mesh, vocab_pad_multiple=8)


def test_nonfinite_weight_in_a_task_model_is_refused(tmp_path):
  import transformers as T
  import torch
  torch.manual_seed(0)
  cfg = T.BertConfig(**H.TINY, num_labels=3)
  model = T.BertForSequenceClassification(cfg).eval()
  with torch.no_grad():
    model.classifier.weight[1, 2] = float("nan")
  model.save_pretrained(tmp_path / "task")
  with pytest.raises(ValueError, match=r"model\.safetensors: tensor 'classifier\.weight' "
                                       r"holds 1 non-finite"):
    tasks_hf.from_hf(str(tmp_path / "task"))
  _, params = tasks_hf.from_hf(str(tmp_path / "task"), allow_nonfinite=True)
  assert np.isnan(np.asarray(params["sequence_head"]["out"]["kernel"])).sum() == 1


def test_integer_tensor_where_a_float_is_declared_is_refused(bert_dir):
  _poke(bert_dir, NAN_KEY, lambda x: np.round(x * 100).astype(np.int32))
  with pytest.raises(ValueError, match=r"model\.safetensors: tensor 'encoder\.layer\.1\."
                                       r"attention\.self\.key\.weight' is stored as int32"):
    encoders.from_hf(str(bert_dir))


def test_integer_buffers_the_mapping_ignores_still_load(bert_dir):
  # older transformers saved embeddings.position_ids (int64) next to the weights
  _poke(bert_dir, "bert.embeddings.position_ids", np.arange(40, dtype=np.int64)[None])
  encoders.from_hf(str(bert_dir))


def _write_raw(path, header, data=b"", length=None):
  raw = json.dumps(header).encode()
  n = len(raw) if length is None else length
  path.write_bytes(struct.pack("<Q", n) + raw + data)


def _raw_dir(tmp_path, bert_dir, name="raw", **changes):
  """bert_dir's config.json (with `changes`), for a hand-written model.safetensors."""
  d = tmp_path / name
  d.mkdir()
  cfg = json.loads((bert_dir / "config.json").read_text())
  cfg.update(changes)
  (d / "config.json").write_text(json.dumps(cfg))
  return d


W = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}


@pytest.mark.parametrize("case,header,data,length,message", [
    ("huge header length", {"a": W}, bytes(16), 2 ** 62, r"header length \d+ bytes exceeds"),
    ("header past the file", {"a": W}, bytes(16), 5000, r"header length 5000 bytes is larger "
                                                          r"than the file"),
    ("offsets past the end", {"a": dict(W, data_offsets=[0, 16])}, bytes(8), None,
     r"tensor 'a' has data_offsets \[0, 16\] past the end of the file's 8 data bytes"),
    ("negative offsets", {"a": dict(W, data_offsets=[-16, 0])}, bytes(16), None,
     r"tensor 'a' has data_offsets \[-16, 0\]: negative"),
    ("overlapping tensors", {"a": W, "b": dict(W, data_offsets=[8, 24])}, bytes(24), None,
     r"tensors 'a' and 'b' overlap"),
    ("shape vs bytes", {"a": dict(W, shape=[3, 2])}, bytes(16), None,
     r"tensor 'a' header is inconsistent"),
    ("unknown dtype", {"a": dict(W, dtype="F8_E9M9")}, bytes(16), None,
     r"tensor 'a' has dtype F8_E9M9"),
    ("negative shape", {"a": dict(W, shape=[-2, -2])}, bytes(16), None,
     r"tensor 'a' has shape \[-2, -2\]"),
    ("not JSON", None, bytes(16), None, r"header is not valid JSON"),
])
def test_absurd_safetensors_headers_are_refused_before_reading(tmp_path, bert_dir, case,
                                                               header, data, length, message):
  dirs = {encoders.from_hf: _raw_dir(tmp_path, bert_dir),
          tasks_hf.from_hf: _raw_dir(tmp_path, bert_dir, "task", num_labels=2,
                                     architectures=["BertForSequenceClassification"])}
  for load, d in dirs.items():
    f = d / "model.safetensors"
    if header is None:
      f.write_bytes(struct.pack("<Q", 4) + b"{{{{" + data)
    else:
      _write_raw(f, header, data, length)
    with pytest.raises(ValueError, match=str(f).replace(".", r"\.") + ": .*" + message):
      load(str(d))


def test_tiny_file_is_refused(tmp_path, bert_dir):
  d = _raw_dir(tmp_path, bert_dir)
  (d / "model.safetensors").write_bytes(b"\x01\x02")
  with pytest.raises(ValueError, match=r"model\.safetensors: 2 bytes, too short"):
    encoders.from_hf(str(d))


def test_sharded_index_naming_a_missing_file_is_refused(tmp_path):
  H.tiny_hf_model("BertForMaskedLM", seed=7).save_pretrained(tmp_path / "s",
                                                              max_shard_size="20KB")
  index = json.loads((tmp_path / "s" / "model.safetensors.index.json").read_text())
  shard = sorted(set(index["weight_map"].values()))[-1]
  os.remove(tmp_path / "s" / shard)
  with pytest.raises(ValueError, match=rf"index\.json names shard {shard}, which is missing"):
    encoders.from_hf(str(tmp_path / "s"))
  index["weight_map"]["bert.pooler.dense.bias"] = "../elsewhere.safetensors"
  (tmp_path / "s" / "model.safetensors.index.json").write_text(json.dumps(index))
  with pytest.raises(ValueError, match="not a file name in"):
    encoders.from_hf(str(tmp_path / "s"))


def test_a_tensor_stored_in_two_shards_is_refused(tmp_path):
  H.tiny_hf_model("BertForMaskedLM", seed=7).save_pretrained(tmp_path / "s",
                                                              max_shard_size="20KB")
  index = json.loads((tmp_path / "s" / "model.safetensors.index.json").read_text())
  first, second = sorted(set(index["weight_map"].values()))[:2]
  a, b = load_file(tmp_path / "s" / first), load_file(tmp_path / "s" / second)
  key = sorted(a)[0]
  b[key] = a[key] + 1
  save_file(b, tmp_path / "s" / second, metadata={"format": "pt"})
  with pytest.raises(ValueError, match=rf"tensor '{key}' is stored twice"):
    encoders.from_hf(str(tmp_path / "s"))


def test_missing_or_malformed_config_json_is_named(tmp_path, bert_dir):
  (bert_dir / "config.json").rename(tmp_path / "moved.json")
  with pytest.raises(ValueError, match="has no config.json"):
    encoders.from_hf(str(bert_dir))
  (bert_dir / "config.json").write_text("{not json")
  with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
    encoders.from_hf(str(bert_dir))


# ---- HF writers never delete what a user owns -----------------------------------------------

@pytest.fixture(scope="module")
def tiny_bert():
  model, _ = small_model("bert", heads=("mlm",), vocab_pad_multiple=1)
  return model, encoders.init_params(model, jax.random.PRNGKey(1))


def _listing(path):
  return sorted(os.path.relpath(os.path.join(r, n), path) for r, ds, fs in os.walk(path)
                for n in ds + fs)


def test_to_hf_refuses_a_user_directory_and_touches_nothing(tmp_path, tiny_bert):
  model, params = tiny_bert
  user = tmp_path / "mine"
  user.mkdir()
  (user / "notes.txt").write_text("my thesis")
  with pytest.raises(outdir.OutputDirError, match=rf"{user} is a non-empty directory"):
    encoders.to_hf(model, params, str(user))
  assert (user / "notes.txt").read_text() == "my thesis"
  assert _listing(user) == ["notes.txt"]
  assert sorted(os.listdir(tmp_path)) == ["mine"]  # no temporary left beside it
  with pytest.raises(ValueError, match="not a directory"):  # a file is not replaced either
    encoders.to_hf(model, params, str(user / "notes.txt"))
  assert (user / "notes.txt").read_text() == "my thesis"


def test_to_hf_refuses_an_unmarked_hf_directory(tmp_path, tiny_bert):
  # an HF directory without the marker (a user's save_pretrained, or an export of an
  # older encoder-zoo) is never replaced: the two cannot be told apart
  model, params = tiny_bert
  H.tiny_hf_model("BertForMaskedLM").save_pretrained(tmp_path / "theirs")
  before = {n: (tmp_path / "theirs" / n).read_bytes() for n in os.listdir(tmp_path / "theirs")}
  with pytest.raises(outdir.OutputDirError, match="non-empty directory"):
    encoders.to_hf(model, params, str(tmp_path / "theirs"))
  assert {n: (tmp_path / "theirs" / n).read_bytes()
          for n in os.listdir(tmp_path / "theirs")} == before


def test_to_hf_refuses_another_writers_directory(tmp_path, tiny_bert):
  model, params = tiny_bert
  work = outdir.claim_dir(str(tmp_path / "run"), "training work directory")
  os.makedirs(os.path.join(work, "checkpoints", "10"))
  with pytest.raises(outdir.OutputDirError, match="'training work directory' output"):
    encoders.to_hf(model, params, work)
  assert os.path.isdir(os.path.join(work, "checkpoints", "10"))


def test_to_hf_replaces_its_own_earlier_export(tmp_path, tiny_bert):
  model, params = tiny_bert
  out = str(tmp_path / "export")
  encoders.to_hf(model, params, out)
  assert outdir.writer_of(out) == "HF export"
  with open(os.path.join(out, "tokenizer.json"), "w") as f:  # a caller's extra file
    f.write("{}")
  params2 = jax.tree.map(lambda x: x + 1.0, params)
  encoders.to_hf(model, params2, out)
  _, got = encoders.from_hf(out)
  np.testing.assert_array_equal(np.asarray(got["mlm"]["bias"]),
                                np.asarray(params2["mlm"]["bias"]))
  assert sorted(os.listdir(tmp_path)) == ["export"]


def test_a_crash_mid_write_leaves_the_old_export_intact(tmp_path, tiny_bert, monkeypatch):
  model, params = tiny_bert
  out = str(tmp_path / "export")
  encoders.to_hf(model, params, out)
  before = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}
  import safetensors.numpy as stn

  def crash(tensors, name, metadata=None):
    with open(name, "wb") as f:  # half a file, then the disk fills up
      f.write(b"\0" * 100)
    raise OSError("No space left on device")
  monkeypatch.setattr(stn, "save_file", crash)
  with pytest.raises(OSError, match="No space"):
    encoders.to_hf(model, jax.tree.map(lambda x: x * 2, params), out)
  assert {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)} == before
  assert sorted(os.listdir(tmp_path)) == ["export"]


def test_task_to_hf_refuses_a_user_directory(tmp_path):
  cfg = small_config("bert")
  model = tasks.build(cfg, "sequence", labels=("neg", "pos"))
  params = tasks.init_params(model, jax.random.PRNGKey(0))
  user = tmp_path / "mine"
  user.mkdir()
  (user / "data.csv").write_text("a,b\n")
  with pytest.raises(outdir.OutputDirError, match="non-empty directory"):
    tasks_hf.to_hf(model, params, str(user))
  assert _listing(user) == ["data.csv"]
  tasks_hf.to_hf(model, params, str(tmp_path / "task"))  # then over its own export
  tasks_hf.to_hf(model, params, str(tmp_path / "task"))
  assert tasks_hf.from_hf(str(tmp_path / "task"))[0].labels == ("neg", "pos")


def test_to_hf_replaces_an_export_another_writer_marked_but_not_its_work_directory(
    tmp_path, tiny_bert):
  # the trainer / fine-tuning mark exports of earlier versions as theirs (their writer)
  model, params = tiny_bert
  H.tiny_hf_model("BertForMaskedLM").save_pretrained(tmp_path / "run" / "hf")
  outdir.write_marker(str(tmp_path / "run" / "hf"), "launch.pretrain export")
  encoders.to_hf(model, params, str(tmp_path / "run" / "hf"))
  assert outdir.writer_of(str(tmp_path / "run" / "hf")) == "HF export"
  # a work directory with an export's files at its top is still not replaced
  outdir.write_marker(str(tmp_path / "run"), "launch.finetune")
  for name in ("config.json", "model.safetensors"):
    (tmp_path / "run" / name).write_text("{}")
  (tmp_path / "run" / "checkpoints").mkdir()
  with pytest.raises(outdir.OutputDirError, match="not a model directory"):
    encoders.to_hf(model, params, str(tmp_path / "run"))
  assert (tmp_path / "run" / "checkpoints").is_dir()


# ---- config.json settings that would change the numbers ------------------------------------

def test_pruned_heads_are_refused(bert_dir):
  cfg = json.loads((bert_dir / "config.json").read_text())
  cfg["pruned_heads"] = {"0": [1]}
  (bert_dir / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match="pruned_heads"):
    encoders.from_hf(str(bert_dir))


def test_multi_label_classifier_is_refused(tmp_path):
  import transformers as T
  T.BertForSequenceClassification(T.BertConfig(
      **H.TINY, num_labels=3, problem_type="multi_label_classification")).save_pretrained(
          tmp_path / "ml")
  with pytest.raises(ValueError, match="problem_type='multi_label_classification'"):
    tasks_hf.from_hf(str(tmp_path / "ml"))


@pytest.mark.parametrize("key,value", [("position_embedding_type", "relative_key_query"),
                                       ("is_decoder", True), ("tie_word_embeddings", False),
                                       ("add_cross_attention", True)])
def test_config_settings_that_change_the_computation_are_refused(bert_dir, key, value):
  cfg = json.loads((bert_dir / "config.json").read_text())
  cfg[key] = value
  (bert_dir / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=key):
    encoders.from_hf(str(bert_dir))
