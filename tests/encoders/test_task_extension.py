"""A new fine-tuning task plugs in through the task registry only: tests/encoders/toy_task.py
(its own reader format, head kind, loss, scorer, HF class suffix and pipeline function)
registers itself on import, and `launch.finetune.run` trains it end to end on a tiny
random BERT, scores it, exports it, and `encoders.hf.tasks.from_hf` reloads the export;
no shared file names the toy task."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import encoders
from configs import finetune as finetune_configs
from encoders import pipelines, tasks
from encoders.hf import tasks as tasks_hf
from encoders.tasks import base as tasks_base
from launch import finetune
from launch.trainer import finetuning
from tests.encoders import toy_task
from tests.launch import finetune_helpers as fh

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The files that serve every task: none may name one.
SHARED = ("encoders/tasks/__init__.py", "encoders/tasks/base.py", "encoders/tasks/data.py",
          "encoders/hf/tasks.py", "encoders/hf/mapping.py", "encoders/pipelines.py",
          "objectives/finetune.py", "launch/data/finetune_data.py", "configs/finetune.py",
          "launch/finetune.py", "launch/trainer/loop.py")


@pytest.fixture
def toy():
  tasks.register(toy_task.ToyPlaceDetection)  # (again: an earlier test may have removed it)
  try:
    yield tasks.get(toy_task.NAME)
  finally:
    tasks_base._TASKS.pop(toy_task.NAME, None)


def _rows(n, seed):
  """Five filler words and a place (yes) or a person (no), shuffled."""
  rng = np.random.default_rng(seed)
  lines = []
  for _ in range(n):
    place = bool(rng.random() < 0.5)
    words = list(rng.choice(fh.WORDS[6:15], 5)) + [
        str(rng.choice(["paris", "london"] if place else ["john", "mary"]))]
    rng.shuffle(words)
    lines.append(f"{' '.join(words)} ||| {'yes' if place else 'no'}\n")
  return lines


def test_a_toy_task_from_its_own_file_trains_scores_exports_and_reloads(tmp_path, toy):
  train = tmp_path / "train.txt"
  train.write_text("".join(_rows(192, seed=1)) + "no separator here\n")  # one bad line
  c = finetune_configs.get_config(toy_task.NAME).unlock()
  assert (c.finetune.task, c.finetune.data_format) == (toy_task.NAME, "toy_lines")
  c.init_from = fh.tiny_bert_dir(str(tmp_path / "bert"))
  c.finetune.train_file, c.finetune.epochs = str(train), 6
  c.data.seq_len, c.data.global_batch = 16, 16
  c.optimizer.learning_rate = 3e-3
  r = finetune.run(c, str(tmp_path / "run"))
  assert r["best"]["metrics"]["hit_rate"] >= 0.9, r["history"]
  assert r["history"][0]["hit_rate"] < r["best"]["metrics"]["hit_rate"]  # it learned
  assert r["data"]["bad_data"] == {"corrupt_record": 1}
  run = tmp_path / "run"
  records = [json.loads(x) for x in open(run / "predictions.jsonl")]
  assert len(records) == round(192 * 0.2) and set(records[0]) == {"text", "label",
                                                                  "prediction"}
  hf_dir = str(run / "hf")
  assert json.load(open(os.path.join(hf_dir, "config.json")))["architectures"] == [
      "BertForToyPlaceDetection"]
  model, params = tasks_hf.from_hf(hf_dir)
  assert model.task == toy_task.NAME and model.num_labels == 1
  assert set(params["toy_place_head"]) == {"out"}
  # the reloaded export predicts what the run scored, through the task's pipeline
  p = pipelines.load(hf_dir)
  got = pipelines.predict(p, [rec["text"] for rec in records])
  assert [g["place"] for g in got] == [rec["prediction"] for rec in records]
  assert np.mean([g["place"] == rec["label"] for g, rec in zip(got, records)]) == \
      pytest.approx(r["best"]["metrics"]["hit_rate"])
  tasks_hf.to_hf(model, params, str(tmp_path / "again"))
  model2, params2 = tasks_hf.from_hf(str(tmp_path / "again"))
  ids = jnp.asarray([[2, 10, 20, 3]])
  np.testing.assert_array_equal(model.apply({"params": params}, ids).logits,
                                model2.apply({"params": params2}, ids).logits)


def test_a_selection_metric_the_task_does_not_score_is_one_line(tmp_path, toy):
  c = finetune_configs.get_config(toy_task.NAME).unlock()
  c.init_from = fh.tiny_bert_dir(str(tmp_path / "bert"))
  (tmp_path / "t.txt").write_text("".join(_rows(8, seed=0)))
  c.finetune.train_file, c.finetune.selection_metric = str(tmp_path / "t.txt"), "accuracy"
  with pytest.raises(ValueError, match="selection_metric='accuracy' is not a metric of "
                                       "the 'toy_place' task; choose from .'hit_rate',."):
    finetuning.validate(c)


def test_no_shared_file_names_a_task():
  """The shared files dispatch through the registry: they name neither the toy task nor
  the project's own tasks' names as strings they compare."""
  for path in SHARED:
    text = open(os.path.join(ROOT, path)).read()
    assert toy_task.NAME not in text, path
    for name in ("sequence", "regression", "token", "qa"):
      for spelled in (f'== "{name}"', f'!= "{name}"', f'in ("{name}"'):
        assert spelled not in text, (path, spelled)


def test_a_task_without_a_head_gets_the_masked_mean():
  """The head-less kind (an embedding task's): no head params, `pooled` is the masked
  mean of the last hidden state."""
  @tasks.register
  class Pooled(tasks.Task):
    name = "toy_pooled"
    head_kind = None

  try:
    cfg = encoders.family_defaults("bert")
    cfg.update(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=32, max_position_embeddings=32, heads=())
    headless = tasks.build(cfg, "toy_pooled")
    params = tasks.init_params(headless, jax.random.PRNGKey(0))
    assert not any(k.endswith("_head") for k in params)
    ids, mask = jnp.asarray([[2, 10, 20, 3, 0]]), jnp.asarray([[1, 1, 1, 1, 0]])
    out = headless.apply({"params": params}, ids, mask)
    np.testing.assert_allclose(out.pooled, tasks.mean_pool(out.last_hidden_state, mask),
                               atol=1e-6)
    assert out.logits is None
  finally:
    tasks_base._TASKS.pop("toy_pooled", None)
