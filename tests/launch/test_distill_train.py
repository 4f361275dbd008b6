"""Distillation through the one trainer: the frozen teacher (sharded like the student, no
optimizer state, bit-identical after steps), and a full run whose teacher is one of our
work directories, with the student exported for transformers."""
import os

import jax
import numpy as np
import pytest

from configs import distilbert as distil_configs
from launch.perf import synthetic
from launch import trainer as train
from launch.trainer import metrics as metrics_lib
from launch.trainer import sharding
from tests.launch.train_helpers import copy_workdir, small_config
from tests.launch.train_helpers import tokenizer_cache  # noqa: F401  (a fixture)


def _small_distill(**objective):
  c = distil_configs.get_config("tiny").unlock()
  for m in (c.model, c.objective.teacher_model):
    m.update(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
             intermediate_size=64, vocab_size=300)
  c.objective.teacher_model.num_hidden_layers = 4
  c.objective.update(objective)
  c.data.seq_len, c.data.global_batch = 16, 8
  c.optimizer.update(warmup_steps=0, schedule="constant", weight_decay=0.5)
  c.mesh.shape = (2, 2, 2)
  return c


def _n(tree):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


@pytest.mark.slow  # default-suite time; the feature keeps a faster test by default
def test_teacher_is_frozen_sharded_and_bit_identical_after_steps():
  c = _small_distill()
  tok = synthetic.SyntheticTokenizer.for_model(c.model)
  setup = train.build(c, tok, jax.devices()[:8])
  state = setup.init_state()
  assert set(state.params) == {"encoder"} and set(state.frozen) == {"teacher"}
  # No optimizer state for the teacher: Adam's moments cover the student only.
  assert 2 * _n(state.params) <= _n(state.opt_state) < 2 * _n(state.params) + 16
  opt_paths = {p for p, _ in jax.tree_util.tree_flatten_with_path(state.opt_state)[0]}
  assert not any("teacher" in jax.tree_util.keystr(p) for p in opt_paths)
  # The teacher is sharded by the same logical rules as the student.
  tq = state.frozen["teacher"]["encoder"]["layer_3"]["attention"]["query"]["kernel"]
  sq = state.params["encoder"]["encoder"]["layer_0"]["attention"]["query"]["kernel"]
  assert tq.sharding.spec == sq.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor",
                                                                            None)
  teacher0, student0 = jax.device_get(state.frozen), jax.device_get(state.params)
  batch = synthetic.full_batch(setup.objective, c.data.global_batch, c.data.seq_len)
  for _ in range(3):
    state, sums = setup.train_step(state, sharding.global_batch(batch, setup.batch_sharding))
  assert int(state.step) == 3 and float(sums["grad_norm"]) > 0
  for a, b in zip(jax.tree.leaves(teacher0), jax.tree.leaves(jax.device_get(state.frozen))):
    np.testing.assert_array_equal(a, b)  # no update, no weight decay
  moved = [not np.array_equal(a, b) for a, b in
           zip(jax.tree.leaves(student0), jax.tree.leaves(jax.device_get(state.params)))]
  assert all(moved)
  # Metrics of every term, the student's MLM accuracy and the agreement.
  for key in ("kd_loss_sum", "mlm_loss_sum", "mlm_correct_sum", "cos_loss_sum",
              "mse_loss_sum", "agreement_top1_sum", "teacher_mlm_correct_sum"):
    assert key in sums, key


@pytest.mark.slow
def test_distills_from_one_of_our_work_directories(tmp_path, tokenizer_cache):  # noqa: F811
  """A BERT teacher trained by the trainer (its workdir, exported under hf/), distilled
  into a DistilBERT student that takes every other teacher layer; the student's export
  loads in transformers."""
  teacher_wd = copy_workdir(tmp_path, "teacher", tokenizer_cache)
  tc = small_config(train__steps=2, train__eval_every=2, checkpoint__every=100)
  tc.model.num_hidden_layers = 4
  train.train_and_evaluate(tc, teacher_wd, jax.devices()[:1])
  c = distil_configs.get_config("tiny").unlock()
  c.model.update(num_hidden_layers=2, hidden_size=64, num_attention_heads=2,
                 intermediate_size=128)
  c.objective.teacher = teacher_wd
  c.data.update(max_documents=80, seq_len=32, global_batch=8, eval_fraction=0.1)
  c.train.update(steps=2, log_every=1, eval_every=2, eval_batches=1)
  c.checkpoint.every = 100
  c.optimizer.warmup_steps = 1
  c.mesh.shape = (1, 1, 1)
  c.logging.plot = False
  wd = str(tmp_path / "student")
  out = train.train_and_evaluate(c, wd, jax.devices()[:1])
  cfg = out["setup"].config
  assert cfg.tokenizer.kind == "sentencepiece"
  assert cfg.objective.teacher == os.path.join(teacher_wd, "hf")
  obj = out["setup"].objective
  assert obj.init_report["teacher_layers"] == [0, 2]
  import encoders
  _, exported = encoders.from_hf(os.path.join(teacher_wd, "hf"))
  np.testing.assert_array_equal(
      np.asarray(jax.device_get(out["state"].frozen["teacher"]["encoder"]["layer_3"]["mlp"]
                                ["wo"]["kernel"])),
      np.asarray(exported["encoder"]["layer_3"]["mlp"]["wo"]["kernel"]))
  ev = out["eval"]
  for key in ("kd_loss", "mlm_accuracy", "cos_loss", "agreement_top1",
              "teacher_mlm_accuracy"):
    assert np.isfinite(ev[key]), key
  run = [r for r in metrics_lib.read(wd) if r.get("split") == "run"][0]
  assert run["frozen_params"] > run["params"] > 0
  import transformers as T
  _, info = T.DistilBertForMaskedLM.from_pretrained(os.path.join(wd, "hf"),
                                                    output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]


@pytest.mark.parametrize("bad", ["vocab"])
def test_a_student_with_another_vocabulary_is_refused(bad):
  c = _small_distill()
  c.model.vocab_size = 301
  with pytest.raises(ValueError, match="differs from the student's"):
    train.build(c, synthetic.SyntheticTokenizer.for_model(c.model), jax.devices()[:8])
