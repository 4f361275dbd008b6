"""The trainer end to end on small runs: sharding equivalence on 8 fake CPU devices, exact
resume, restore onto another mesh, metrics, and export."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import roberta as roberta_configs
from launch.perf import synthetic
from launch import trainer as train
from launch.trainer import metrics as metrics_lib
from tests.encoders.minilm_helpers import minilm_dir
from tests.launch.data_helpers import build_tiny_tfds
from tests.launch.train_helpers import copy_workdir, first_devices, small_config
from tests.launch.train_helpers import tokenizer_cache  # noqa: F401  (a fixture)


def _train_losses(workdir, key="mlm_loss"):
  return {r["step"]: r[key] for r in metrics_lib.read(workdir)
          if r.get("split") == "train" and key in r}


@pytest.mark.slow  # default-suite time; the feature keeps a faster test by default
def test_sharding_layouts_match_one_device(tmp_path, tokenizer_cache):
  """A 2x2x2 mesh (data, fsdp and tensor at once) trains exactly as one device does."""
  _check_layouts_match_one_device(tmp_path, tokenizer_cache, {"mixed": ((2, 2, 2), 8)})


@pytest.mark.slow
def test_each_pure_sharding_layout_matches_one_device(tmp_path, tokenizer_cache):
  _check_layouts_match_one_device(tmp_path, tokenizer_cache, {
      "data": ((8, 1, 1), 8), "fsdp": ((1, 8, 1), 8), "tensor": ((4, 1, 2), 8)})


def _check_layouts_match_one_device(tmp_path, tokenizer_cache, layouts):
  runs = {"one": ((1, 1, 1), 1), **layouts}
  losses, gnorms = {}, {}
  for name, (shape, n) in runs.items():
    c = small_config(mesh__shape=shape, train__steps=4, checkpoint__every=100)
    wd = copy_workdir(tmp_path, name, tokenizer_cache)
    train.train_and_evaluate(c, wd, devices=first_devices(n))
    losses[name] = _train_losses(wd)
    nsp = _train_losses(wd, "nsp_loss")
    assert len(nsp) == 4
    gnorms[name] = _train_losses(wd, "grad_norm")
  ref = losses.pop("one")
  assert len(ref) == 4 and ref[4] < ref[1]
  for name, got in losses.items():
    np.testing.assert_allclose([got[s] for s in sorted(got)], [ref[s] for s in sorted(ref)],
                               rtol=1e-4, err_msg=name)
    # Steps 1 and 2 see the initial params (lr is 0 at step 0): the same gradient.
    np.testing.assert_allclose([gnorms[name][s] for s in (1, 2)],
                               [gnorms["one"][s] for s in (1, 2)], rtol=1e-5, err_msg=name)


def test_params_are_really_sharded(tokenizer_cache):
  from launch import data as data_lib
  c = small_config(mesh__shape=(2, 2, 2))
  pipeline = data_lib.make_pipeline(c, str(tokenizer_cache))
  train.adopt_tokenizer(c, pipeline.tokenizer)
  setup = train.build(c, pipeline.tokenizer, first_devices(8))
  state = setup.init_state()
  q = state.params["encoder"]["encoder"]["layer_0"]["attention"]["query"]["kernel"]
  assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
  mu = state.opt_state[1][0].mu["encoder"]["encoder"]["layer_0"]["attention"]["query"]["kernel"]
  assert mu.sharding == q.sharding  # optimizer state follows its parameter
  # The step is traced under the trainer's mesh, so the model's activation constraints
  # are in the program (without a mesh context flax drops them silently).
  batch = synthetic.abstract_batch(setup.objective, c.data.global_batch, c.data.seq_len,
                                   setup.batch_sharding)
  text = setup.train_step.lower(setup.abstract_state, batch).as_text()
  assert '[{"data", "fsdp"}, {}, {"tensor"}, {}]' in text  # (batch, len, heads, kv)
  assert '[{"data", "fsdp"}, {}, {"tensor"}]' in text  # the MLP's hidden activations


def test_resume_is_bitwise_exact(tmp_path, tokenizer_cache):
  full = copy_workdir(tmp_path, "full", tokenizer_cache)
  train.train_and_evaluate(small_config(), full, first_devices(1))
  split = copy_workdir(tmp_path, "split", tokenizer_cache)
  out = train.train_and_evaluate(small_config(), split, first_devices(1), stop_after=3)
  assert out["step"] == 3
  assert not os.path.exists(os.path.join(split, "hf"))  # not finished: nothing exported
  train.train_and_evaluate(small_config(), split, first_devices(1))  # a new call: restores step 3
  a, b = _train_losses(full), _train_losses(split)
  assert sorted(a) == sorted(b) == list(range(1, 7))
  assert [a[s] for s in range(1, 7)] == [b[s] for s in range(1, 7)]  # bitwise
  ea = [r for r in metrics_lib.read(full) if r.get("split") == "eval"]
  eb = [r for r in metrics_lib.read(split) if r.get("split") == "eval"]
  assert [r["mlm_loss"] for r in ea] == [r["mlm_loss"] for r in eb]


@pytest.mark.slow  # ~1 min; test_resume_is_bitwise_exact stays in the default suite
def test_restore_onto_another_mesh(tmp_path, tokenizer_cache):
  ref = copy_workdir(tmp_path, "ref", tokenizer_cache)
  train.train_and_evaluate(small_config(), ref, devices=first_devices(1))
  wd = copy_workdir(tmp_path, "moved", tokenizer_cache)
  train.train_and_evaluate(small_config(mesh__shape=(8, 1, 1)), wd, devices=first_devices(8),
                           stop_after=3)
  out = train.train_and_evaluate(small_config(mesh__shape=(1, 4, 2)), wd, devices=first_devices(8))
  q = out["state"].params["encoder"]["encoder"]["layer_0"]["attention"]["query"]["kernel"]
  assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
  a, b = _train_losses(ref), _train_losses(wd)
  np.testing.assert_allclose([b[s] for s in range(1, 7)], [a[s] for s in range(1, 7)],
                             rtol=1e-4)


def test_outputs_metrics_and_export(tmp_path, tokenizer_cache):
  wd = copy_workdir(tmp_path, "out", tokenizer_cache)
  c = small_config(logging__plot=True)
  out = train.train_and_evaluate(c, wd, first_devices(1))
  records = metrics_lib.read(wd)
  evals = [r for r in records if r.get("split") == "eval"]
  assert [r["step"] for r in evals] == [3, 6]
  for key in ("mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy"):
    assert key in evals[-1]
  trains = [r for r in records if r.get("split") == "train"]
  for key in ("tokens_per_s", "mfu", "eta_s", "learning_rate", "grad_norm"):
    assert key in trains[-1]
  base = [r for r in records if r.get("split") == "baseline"][0]
  # The baselines score exactly the eval's masked positions and counted pairs.
  assert base["mlm_count"] == evals[-1]["mlm_count"] == evals[0]["mlm_count"]
  assert base["nsp_count"] == evals[-1]["nsp_count"]
  assert 0 <= base["mlm_majority_accuracy"] < 1 and 0 < base["nsp_majority_accuracy"] < 1
  assert os.path.getsize(os.path.join(wd, "loss.png")) > 1000
  assert os.listdir(os.path.join(wd, "tensorboard"))
  # The exported model loads in transformers and gives our logits.
  import torch
  import transformers as T
  hf = T.BertForPreTraining.from_pretrained(os.path.join(wd, "hf")).eval()
  import encoders
  model, params = encoders.from_hf(os.path.join(wd, "hf"))
  ids = np.random.RandomState(0).randint(5, c.tokenizer.vocab_size, (2, 12))
  with torch.no_grad():
    ref = hf(torch.tensor(ids)).prediction_logits.numpy()
  np.testing.assert_allclose(model.apply({"params": params}, jnp.asarray(ids)).mlm_logits, ref,
                             atol=1e-4)
  trained = jax.device_get(out["state"].params["encoder"])
  np.testing.assert_array_equal(params["embeddings"]["word_embeddings"]["embedding"],
                                trained["embeddings"]["word_embeddings"]["embedding"])


@pytest.mark.slow  # default-suite time; the feature keeps a faster test by default
def test_roberta_packed_documents_with_grad_accumulation(tmp_path, tokenizer_cache):
  wd = copy_workdir(tmp_path, "acc2", tokenizer_cache)
  c = small_config(roberta_configs, "base", optimizer__grad_accum_steps=2, train__steps=3)
  c.model.num_hidden_layers, c.model.hidden_size = 2, 64
  c.model.num_attention_heads, c.model.intermediate_size = 2, 128
  train.train_and_evaluate(c, wd, first_devices(1))
  losses = _train_losses(wd)
  assert sorted(losses) == [1, 2, 3] and all(np.isfinite(list(losses.values())))
  assert not _train_losses(wd, "nsp_loss")  # RoBERTa: no NSP


def _uneven_batch(objective, rows=16, seq=32, seed=0):
  """Rows of very different lengths (and two all-padding rows, pair label -1), so the
  micro-batches of an accumulation hold different numbers of masked tokens."""
  rng = np.random.RandomState(seed)
  layout = [[int(n)] for n in rng.randint(6, seq + 1, rows - 2)] + [[], []]
  layout[0], layout[1] = [seq], [6]
  return objective.batch_spec().synthesize(layout, seq, seed)


def _flat_grads(tree):
  return np.concatenate([np.ravel(x) for x in jax.tree.leaves(jax.device_get(tree))])


def test_grad_accumulation_gives_the_full_batch_gradient():
  """Correctness: micro-batches return sums and the step divides once by the global
  normalizers, so accumulation 1, 2 and 4 give one gradient (float32, dropout off)."""
  c = small_config(optimizer__clip_norm=0.0, model__hidden_dropout_prob=0.0,
                   model__attention_probs_dropout_prob=0.0)
  c.model.vocab_size = 600
  tok = synthetic.SyntheticTokenizer.for_model(c.model)
  setup = train.build(c, tok, first_devices(1))
  state = setup.init_state()
  objective = setup.objective
  batch = jax.tree.map(jnp.asarray, _uneven_batch(objective))
  transformed = jax.jit(objective.transform)(batch, jax.random.PRNGKey(3))
  counts = np.asarray(transformed["mlm_weights"]).reshape(4, -1).sum(1)
  assert len(set(counts.tolist())) > 1  # the micro-batches really are uneven
  grads = {}
  for accum in (1, 2, 4):
    fn = jax.jit(lambda p, f, b, accum=accum: train.gradients(
        objective, p, f, b, jax.random.PRNGKey(0), accum))
    g, sums = fn(state.params, state.frozen, transformed)
    grads[accum] = _flat_grads(g)
    assert float(sums["nsp_weight_sum"]) == 14  # padding rows (label -1) not counted
    assert float(sums["mlm_weight_sum"]) == counts.sum()
  ref = grads[1]
  for accum in (2, 4):
    rel = np.linalg.norm(grads[accum] - ref) / np.linalg.norm(ref)
    assert rel < 1e-5, (accum, rel)
  # The mean of per-micro-batch means (the old scheme) is measurably different here.
  one = jax.jit(lambda p, f, b: train.gradients(objective, p, f, b, jax.random.PRNGKey(0), 1))
  wrong = 0
  for i in range(4):
    mb = jax.tree.map(lambda x: x.reshape((4, -1) + x.shape[1:])[i], transformed)
    wrong = wrong + _flat_grads(one(state.params, state.frozen, mb)[0]) / 4
  assert np.linalg.norm(wrong - ref) / np.linalg.norm(ref) > 1e-3

  # The real step reports the same gradient norm at accumulation 1 and 4.
  gnorm = {}
  for accum in (1, 4):
    c.optimizer.grad_accum_steps = accum
    s = train.build(c, tok, first_devices(1))
    from launch.trainer import sharding
    _, sums = s.train_step(s.init_state(), sharding.global_batch(
        _uneven_batch(s.objective), s.batch_sharding))
    gnorm[accum] = float(sums["grad_norm"])
  np.testing.assert_allclose(gnorm[4], gnorm[1], rtol=1e-5)


def test_loss_counts_only_masked_real_tokens(tokenizer_cache):
  from launch import data as data_lib
  from objectives import masking
  c = small_config()
  pipeline = data_lib.make_pipeline(c, str(tokenizer_cache))
  train.adopt_tokenizer(c, pipeline.tokenizer)
  setup = train.build(c, pipeline.tokenizer, first_devices(1))
  state = setup.init_state()
  batch = next(pipeline.train_iter())
  assert (batch["segment_ids"] == 0).any()  # the batch has padding
  rng = jax.random.PRNGKey(7)
  transformed = jax.jit(setup.objective.transform)(batch, rng)  # jitted, as the step runs them
  terms, sums = jax.jit(lambda p, b: setup.objective.loss(p, b, rng, False))(state.params,
                                                                             transformed)
  assert set(terms) == {"mlm", "nsp"} and terms["mlm"] == sums["mlm_loss_sum"]
  # Recompute by hand from the same masks and the model's logits at every position.
  m = masking.mask_tokens(rng, batch["input_ids"], batch["special_tokens_mask"],
                          vocab_size=pipeline.tokenizer.vocab_size,
                          mask_id=pipeline.tokenizer.mask_id, mask_rate=0.15)
  w = np.asarray(m["weights"]) > 0
  assert not (w & batch["special_tokens_mask"]).any()  # never padding or specials
  assert not (w & (batch["segment_ids"] == 0)).any()
  assert w.sum() == float(sums["mlm_weight_sum"])
  logits = jax.jit(setup.objective.model.apply)(
      {"params": state.params["encoder"]}, m["input_ids"],
      attention_mask=(batch["segment_ids"] > 0).astype(np.int32),
      token_type_ids=batch["token_type_ids"], segment_ids=batch["segment_ids"]).mlm_logits
  logp = jax.nn.log_softmax(np.asarray(logits, np.float64), -1)
  labels = np.asarray(m["labels"])
  ce = -np.take_along_axis(np.asarray(logp), labels[..., None], -1)[..., 0]
  np.testing.assert_allclose(float(sums["mlm_loss_sum"]), ce[w].sum(), rtol=1e-4)
  nsp = float(sums["nsp_weight_sum"])
  assert nsp == batch["input_ids"].shape[0]


def test_bad_batches_are_refused():
  import objectives
  c = small_config()
  c.model.vocab_size = 600
  objective = objectives.get_objective(c, synthetic.SyntheticTokenizer.for_model(c.model))
  batch = synthetic.full_batch(objective, 2, 8)
  objective.check_batch(batch)
  with pytest.raises(ValueError, match="input_ids contains 600"):
    objective.check_batch(dict(batch, input_ids=np.full((2, 8), 600, np.int32)))
  with pytest.raises(ValueError, match="next_sentence_label"):
    objective.batch_spec().select({k: v for k, v in batch.items()
                                   if k != "next_sentence_label"})
  with pytest.raises(ValueError, match="segment_ids"):
    objective.check_batch(dict(batch, segment_ids=np.ones((2, 9), np.int32)))


def test_cli_refuses_unknown_override(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "launch.pretrain", "--config", "configs/bert.py:tiny",
       "--workdir", str(tmp_path), "--config.model.not_a_field=3"],
      capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(
          os.path.dirname(os.path.abspath(__file__)))))
  assert proc.returncode != 0
  assert "not_a_field" in proc.stderr


@pytest.mark.slow  # default-suite time; the feature keeps a faster test by default
def test_trains_from_a_local_tfds_dataset(tmp_path, tokenizer_cache):
  """A TFDS dataset built here (ArrayRecord) trains through the same path a TFDS name
  from the catalog would take: tfds.data_source(name, data_dir=...)."""
  data_dir = tmp_path / "tfds"
  name = build_tiny_tfds(str(data_dir))
  c = small_config(data__source="tfds", data__tfds_name=name,
                   data__tfds_data_dir=str(data_dir), data__eval_split="validation",
                   data__global_batch=4, data__max_documents=-1, train__steps=3,
                   tokenizer__kind="sentencepiece",
                   tokenizer__path=str(tokenizer_cache / "tokenizer" / "spm.model"))
  wd = str(tmp_path / "run")
  out = train.train_and_evaluate(c, wd, first_devices(1))
  run = [r for r in metrics_lib.read(wd) if r.get("split") == "run"][0]
  assert run["data"]["train_documents"] == 30 and run["data"]["eval_documents"] == 4
  assert sorted(_train_losses(wd)) == [1, 2, 3]
  assert out["eval"]["mlm_count"] > 0


class _WithFrozenTeacher:
  """A test objective: MLM for the student plus a term pulling its MLM logits toward a
  frozen teacher's (a distillation shape), built on the MLM objective."""

  @staticmethod
  def make(config, tokenizer):
    import ml_collections
    import encoders
    from objectives import mlm
    from objectives.base import model_forward_flops
    c = ml_collections.ConfigDict(config.to_dict())
    c.objective.name = "mlm"
    obj = mlm.MaskedLM(c, tokenizer)
    obj.name = "test_frozen_teacher"
    teacher_cfg = ml_collections.ConfigDict(c.model.to_dict())
    teacher_cfg.num_hidden_layers = 1
    teacher = encoders.build(teacher_cfg)
    obj.modules = {"encoder": obj.model, "teacher": teacher}
    obj.trained, obj.frozen = ("encoder",), ("teacher",)
    student_init, student_loss = obj.init, obj.loss
    student_norms, student_flops = obj.normalizers, obj.module_flops

    def init(rng):
      ids = jnp.zeros((1, obj.seq_len), jnp.int32)
      return {**student_init(rng), "teacher": teacher.init(jax.random.fold_in(rng, 1),
                                                           ids)["params"]}

    def loss(params, batch, rng, train):
      terms, metrics = student_loss(params, batch, rng, train)
      out = teacher.apply({"params": params["teacher"]}, batch["input_ids"],
                          attention_mask=(batch["segment_ids"] > 0).astype(jnp.int32),
                          token_type_ids=batch["token_type_ids"],
                          segment_ids=batch["segment_ids"],
                          masked_positions=batch["masked_positions"])
      mine = obj.model.apply({"params": params["encoder"]}, batch["input_ids"],
                             attention_mask=(batch["segment_ids"] > 0).astype(jnp.int32),
                             token_type_ids=batch["token_type_ids"],
                             segment_ids=batch["segment_ids"],
                             masked_positions=batch["masked_positions"])
      d = jnp.mean((mine.mlm_logits - out.mlm_logits) ** 2, -1) * batch["mlm_weights"]
      return {**terms, "distill": jnp.sum(d)}, metrics

    obj.init, obj.loss = init, loss
    obj.normalizers = lambda b: {**student_norms(b), "distill": student_norms(b)["mlm"]}
    obj.module_flops = lambda name, seq, all_positions=False: (
        student_flops(name, seq, all_positions) if name == "encoder" else
        model_forward_flops(teacher.config, seq, obj.max_predictions))
    return obj


def test_frozen_collections_get_no_optimizer_state_and_no_update(tmp_path):
  import objectives
  from launch.trainer import checkpoint as ckpt_lib
  from launch.trainer import sharding
  objectives.register_objective("test_frozen_teacher")(_WithFrozenTeacher.make)
  c = small_config(objective__name="test_frozen_teacher", optimizer__weight_decay=0.5,
                   optimizer__warmup_steps=0, optimizer__schedule="constant")
  c.model.heads = ("mlm",)
  c.model.vocab_size = 600
  c.data.packing = "documents"
  c.mesh.shape = (2, 2, 2)  # frozen params are sharded like trained ones
  tok = synthetic.SyntheticTokenizer.for_model(c.model)
  setup = train.build(c, tok, first_devices(8))
  obj = setup.objective
  enc = obj.module_flops("encoder", 32)
  assert obj.flops_per_example(32) == pytest.approx(3 * enc + obj.module_flops("teacher", 32))
  state = setup.init_state()
  assert set(state.params) == {"encoder"} and set(state.frozen) == {"teacher"}
  n = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))
  # Adam's two moments for the student only (plus scalar counters).
  assert 2 * n(state.params) <= n(state.opt_state) < 2 * n(state.params) + 16
  teacher0 = jax.device_get(state.frozen)
  student0 = jax.device_get(state.params)
  batch = synthetic.full_batch(obj, c.data.global_batch, c.data.seq_len)
  for _ in range(2):
    state, sums = setup.train_step(state, sharding.global_batch(batch, setup.batch_sharding))
  for a, b in zip(jax.tree.leaves(teacher0), jax.tree.leaves(jax.device_get(state.frozen))):
    np.testing.assert_array_equal(a, b)  # no update, no decay
  moved = [not np.array_equal(a, b) for a, b in
           zip(jax.tree.leaves(student0), jax.tree.leaves(jax.device_get(state.params)))]
  assert all(moved)
  # The frozen collection is checkpointed with the state and restored onto its shardings.
  manager = ckpt_lib.Manager(str(tmp_path / "ckpt"), c.checkpoint)
  manager.save(2, state, {"note": 1})
  manager.wait()
  restored, data_state = manager.restore_latest(setup.abstract_state)
  manager.close()
  assert data_state == {"note": 1}
  for a, b in zip(jax.tree.leaves(teacher0), jax.tree.leaves(jax.device_get(restored.frozen))):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # ~35 s; the default suite covers init_from in test_finetune.py and test_convert.py
def test_continued_pretraining_from_minilm(tmp_path):
  """`init_from`: continued MLM from the real all-MiniLM-L6-v2 checkpoint (a BertModel
  without an MLM head) on the default corpus, with the checkpoint's tokenizer."""
  import encoders
  path = minilm_dir()
  c = small_config(objective__name="mlm", data__packing="documents", train__steps=2,
                   train__eval_every=2, train__eval_batches=1, checkpoint__every=100,
                   data__global_batch=8, data__max_documents=40)
  c.model.heads = ("mlm",)
  c.init_from = path
  wd = str(tmp_path / "continued")
  config, pipeline = train.prepare(c, wd)
  assert (config.model.hidden_size, config.model.num_hidden_layers) == (384, 6)
  assert config.model.heads == ("mlm",) and config.model.vocab_size == 30522
  assert config.tokenizer.kind == "hf" and pipeline.tokenizer.vocab_size == 30522
  setup = train.build(config, pipeline.tokenizer, first_devices(1))
  state = setup.init_state()
  _, ref = encoders.from_hf(path)
  ours = state.params["encoder"]
  flat = jax.tree_util.tree_flatten_with_path(ref)[0]
  compared = 0
  for p, value in flat:
    keys = [k.key for k in p]
    if keys[0] == "pooler":
      continue  # the checkpoint's pooler: not used by an MLM-only model
    node = ours
    for k in keys:
      node = node[k]
    np.testing.assert_array_equal(np.asarray(node), np.asarray(value), err_msg=str(keys))
    compared += 1
  assert compared > 90 and "mlm" in ours  # every encoder tensor; a fresh MLM head

  out = train.train_and_evaluate(c, wd, first_devices(1))
  losses = _train_losses(wd)
  assert sorted(losses) == [1, 2] and all(np.isfinite(list(losses.values())))
  assert np.isfinite(out["eval"]["mlm_loss"])
  import transformers as T
  model, info = T.BertForMaskedLM.from_pretrained(os.path.join(wd, "hf"),
                                                  output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
  assert os.path.exists(os.path.join(wd, "hf", "tokenizer.json"))


@pytest.mark.slow  # default-suite time; the feature keeps a faster test by default
def test_albert_trains_with_sentence_order_prediction(tmp_path, tokenizer_cache):
  """ALBERT + SOP through the one trainer: the pair rows labelled for SOP, held-out MLM
  and SOP metrics with their baselines, an export transformers loads for pretraining."""
  from configs import albert as albert_configs
  wd = copy_workdir(tmp_path, "albert", tokenizer_cache)
  c = small_config(albert_configs, "tiny", train__steps=3, train__eval_every=3)
  c.model.embedding_size = 32  # factorized: E != H
  c.tokenizer.lowercase = False  # share the cached test tokenizer
  out = train.train_and_evaluate(c, wd, first_devices(1))
  for key in ("mlm_loss", "mlm_accuracy", "sop_loss", "sop_accuracy"):
    assert np.isfinite(out["eval"][key]), key
  base = [r for r in metrics_lib.read(wd) if r.get("split") == "baseline"][0]
  assert base["sop_count"] == out["eval"]["sop_count"] > 0
  assert base["mlm_count"] == out["eval"]["mlm_count"]
  assert 0 < base["sop_majority_accuracy"] < 1
  import transformers as T
  _, info = T.AlbertForPreTraining.from_pretrained(os.path.join(wd, "hf"),
                                                   output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
