"""TFDS input for fine-tuning (`finetune.data_format=tfds`): a tiny dataset prepared
locally into a tmp data_dir (a DatasetBuilder over in-memory rows, array_record files,
no network), read by fd.read_tfds and fine-tuned on by launch.finetune."""
import json

import pytest

tfds = pytest.importorskip("tensorflow_datasets")

from configs import finetune as finetune_configs  # noqa: E402
from launch import finetune  # noqa: E402
from launch.data import finetune_data as fd  # noqa: E402
from tests.launch import finetune_helpers as fh  # noqa: E402

TRAIN, EVAL = fh.sentiment_rows(64, seed=3), fh.sentiment_rows(24, seed=4)


class ZooTinySentiment(tfds.core.GeneratorBasedBuilder):
  """TRAIN / EVAL as TFDS splits `train` / `validation` (label: ClassLabel neg, pos)."""
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
        "sentence": tfds.features.Text(),
        "label": tfds.features.ClassLabel(names=["neg", "pos"])}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(TRAIN),
            "validation": self._generate_examples(EVAL)}

  def _generate_examples(self, rows):
    for i, r in enumerate(rows):
      yield i, {"sentence": r["text"], "label": r["label"]}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  # Defined in a package module, as a user's builder is: TFDS then looks up the module's
  # resources (checksums), which needs importlib_resources (setup.cfg declares it).
  d = str(tmp_path_factory.mktemp("tfds"))
  ZooTinySentiment(data_dir=d, file_format="array_record").download_and_prepare()
  return d


def _pairs(rows):
  return sorted((r["text"], r["label"]) for r in rows)


def test_read_tfds_gives_every_row_of_the_split(data_dir):
  names = ("neg", "pos")
  for split, want in (("train", TRAIN), ("validation", EVAL)):
    rows = fd.read_tfds("zoo_tiny_sentiment", split, data_dir, text="sentence")
    assert len(rows) == len(want)
    assert all(isinstance(r["text"], str) and isinstance(r["label"], int) for r in rows)
    assert _pairs({"text": r["text"], "label": names[r["label"]]} for r in rows) == \
        _pairs(want)
  sub = fd.read_tfds("zoo_tiny_sentiment", "train[:10]", data_dir, text="sentence")
  assert len(sub) == 10


@pytest.mark.slow  # a tiny BERT's compile + 2 epochs: over 15 s on a loaded CPU
def test_finetune_runs_on_a_tfds_dataset(data_dir, tmp_path):
  c = finetune_configs.get_config("sequence").unlock()
  c.init_from = fh.tiny_bert_dir(str(tmp_path / "bert"))
  c.data.seq_len, c.data.global_batch = 24, 16
  c.optimizer.learning_rate = 3e-3
  f = c.finetune
  f.data_format, f.tfds_name, f.tfds_data_dir = "tfds", "zoo_tiny_sentiment", data_dir
  f.tfds_train_split, f.tfds_eval_split, f.text_column = "train", "validation", "sentence"
  f.epochs = 2
  r = finetune.run(c, str(tmp_path / "run"))
  run = json.load(open(tmp_path / "run" / "results.json"))
  assert len(r["history"]) == 2 and run["train_tokens"] > 0
  preds = [json.loads(x) for x in open(tmp_path / "run" / "predictions.jsonl")]
  assert len(preds) == len(EVAL)  # the validation split is the eval set, no holdout
  assert sorted(p["label"] for p in preds) == sorted(str(i) for i in
                                                    [("neg", "pos").index(r["label"])
                                                     for r in EVAL])


def test_read_tfds_names_a_missing_feature_and_an_empty_split(data_dir):
  with pytest.raises(ValueError, match=r"no feature 'text' \(it has \['label', 'sentence'\]\)"):
    fd.read_tfds("zoo_tiny_sentiment", "train", data_dir, text="text")
  with pytest.raises(ValueError, match=r"TFDS zoo_tiny_sentiment split 'train\[:0\]': no "
                     r"usable rows \(the input is empty\)"):
    fd.read_tfds("zoo_tiny_sentiment", "train[:0]", data_dir, text="sentence")


def test_tfds_labels_are_class_ids_in_numeric_order(data_dir):
  rows = fd.read_tfds("zoo_tiny_sentiment", "train", data_dir, text="sentence")
  labels, train, _ = fd.class_labels(rows, rows[:4])
  assert labels == ("0", "1") and {r["label"] for r in train} == {"0", "1"}
  assert train[0].where == "TFDS zoo_tiny_sentiment split 'train' example 0"
