"""Shared helpers of the trainer tests: a small config, the tokenizer trained once per
module, and work directories that start with it."""
import shutil

import jax
import pytest

from configs import bert as bert_configs
from launch import data as data_lib


def small_config(base=bert_configs, variant="tiny", **overrides):
  c = base.get_config(variant).unlock()
  c.model.num_hidden_layers = 2
  c.model.hidden_size = 64
  c.model.num_attention_heads = 2
  c.model.intermediate_size = 128
  c.tokenizer.vocab_size = 600
  c.tokenizer.model_type = "unigram"  # every run shares the one cached tokenizer
  c.tokenizer.train_sentences = 20_000
  c.data.max_documents = 80
  c.data.seq_len = 32
  c.data.global_batch = 16
  c.data.eval_fraction = 0.1
  c.train.steps = 6
  c.train.log_every = 1
  c.train.eval_every = 3
  c.train.eval_batches = 2
  c.optimizer.warmup_steps = 2
  c.optimizer.learning_rate = 1e-3
  c.checkpoint.every = 3
  c.mesh.shape = (1, 1, 1)
  c.logging.plot = False
  for key, value in overrides.items():
    section, name = key.split("__")
    c[section][name] = value
  return c


@pytest.fixture(scope="module")
def tokenizer_cache(tmp_path_factory):
  """Trains the small sentencepiece model once; runs copy it into their workdirs."""
  d = tmp_path_factory.mktemp("template")
  data_lib.make_pipeline(small_config(), str(d))
  return d


def copy_workdir(tmp_path, name, cache):
  """A work directory `tmp_path/name` that starts with the cached tokenizer."""
  wd = tmp_path / name
  shutil.copytree(cache, wd)
  return str(wd)


def first_devices(n):
  return jax.devices()[:n]
