"""Shared helpers of the data tests (tests/launch/test_data.py, tests/objectives/test_pairs.py)."""
import functools

import numpy as np
import pytest

from configs import common
from launch.data import corpus
from launch.data import tokenization

SMALL_DOCS = 120


def make_config(**data_overrides):
  c = common.base_config()
  c.data.max_documents = SMALL_DOCS
  c.data.seq_len = 64
  c.data.global_batch = 8
  for k, v in data_overrides.items():
    if k.startswith("tokenizer_"):
      setattr(c.tokenizer, k[len("tokenizer_"):], v)
    elif k == "nsp_prob":
      c.objective.nsp_prob = v
    else:
      setattr(c.data, k, v)
  return c


@pytest.fixture(scope="module")
def spm_path(tmp_path_factory):
  """A small sentencepiece model trained on the start of the default corpus."""
  c = make_config(tokenizer_vocab_size=1000, tokenizer_train_sentences=20_000)
  workdir = tmp_path_factory.mktemp("spm")
  tokenization.make_tokenizer(c.tokenizer, str(workdir),
                              lambda: corpus.default_documents(SMALL_DOCS))
  return str(workdir / "tokenizer" / "spm.model")


@pytest.fixture(scope="module")
def spm(spm_path):
  return tokenization.load_sentencepiece(spm_path)


def spm_config(spm_path, **overrides):
  return make_config(tokenizer_kind="sentencepiece", tokenizer_path=spm_path, **overrides)


def take(it, n):
  return [next(it) for _ in range(n)]


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def rows_of(batches):
  """The rows of a list of batches, as a list of per-row dicts."""
  return [{k: v[i] for k, v in b.items()} for b in batches
          for i in range(len(b["input_ids"]))]


def epoch_rows(pipeline):
  """All rows of one epoch (num_epochs=1) as a list of per-row dicts."""
  return rows_of(pipeline.train_iter())


@functools.cache
def _tiny_tfds_builder_class():
  """Defined once per process: TFDS refuses to register a dataset name twice."""
  import tensorflow_datasets as tfds

  class EncoderZooTinyText(tfds.core.GeneratorBasedBuilder):
    # A module name without dots: TFDS then does not look for the builder's package
    # resources (which needs the `importlib_resources` backport, absent on Python 3.11).
    __module__ = "encoder_zoo_tiny_text"
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self, features=tfds.features.FeaturesDict({
              "text": tfds.features.Text(), "id": tfds.features.Scalar(np.int32)}))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {"train": self._generate_examples(0, 30),
              "validation": self._generate_examples(100, 4)}

    def _generate_examples(self, start, n):
      for i in range(start, start + n):
        yield i, {"id": i, "text": f"Document {i} of the tiny set.\n"
                                   f"It says that {i} plus one is {i + 1}."}

  return EncoderZooTinyText


def build_tiny_tfds(data_dir):
  """Prepares the tiny TFDS text dataset (ArrayRecord files) in `data_dir`; -> its name."""
  EncoderZooTinyText = _tiny_tfds_builder_class()
  builder = EncoderZooTinyText(data_dir=data_dir, file_format="array_record")
  builder.download_and_prepare()
  return builder.name
