"""The DeBERTaV3 recipe (configs/deberta.py:v3-*) through the one trainer: RTD with a
half-depth DeBERTa generator and GDES, held-out metrics, and HF exports that transformers
loads (discriminator: DebertaV2Model + rtd_head.safetensors; generator:
DebertaV2ForMaskedLM) with the GDES delta folded into the discriminator's table."""
import os

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from configs import deberta as deberta_configs
from launch import trainer as train
from tests.launch.train_helpers import copy_workdir, first_devices, small_config
from tests.launch.train_helpers import tokenizer_cache  # noqa: F401  (a fixture)


@pytest.mark.slow  # ~3-4 min on the loaded 2-core machine (compiles two DeBERTas)
def test_deberta_v3_recipe_trains_and_exports(tmp_path, tokenizer_cache):  # noqa: F811
  c = small_config(deberta_configs, "v3-tiny", train__steps=3, train__eval_every=3,
                   checkpoint__every=100)
  c.model.position_buckets = 8
  c.model.max_relative_positions = 32
  assert (c.objective.name, c.objective.sharing) == ("rtd", "gdes")
  wd = copy_workdir(tmp_path, "debv3", tokenizer_cache)
  out = train.train_and_evaluate(c, wd, first_devices(1))
  ev = out["eval"]
  for key in ("mlm_accuracy", "rtd_loss", "rtd_replaced_accuracy", "rtd_flagged_accuracy",
              "rtd_all_original_accuracy"):
    assert np.isfinite(ev[key]), key
  obj = out["setup"].objective
  assert obj.generator_config.num_hidden_layers == 1  # half the discriminator's 2
  assert obj.generator_config.hidden_size == c.model.hidden_size  # full width
  assert list(obj.shared) == [("embeddings", "word_embeddings", "embedding")]
  params = jax.device_get(out["state"].params)
  gen_word = np.asarray(params["generator"]["embeddings"]["word_embeddings"]["embedding"])
  delta = np.asarray(params["discriminator"]["embeddings"]["word_embeddings"]["embedding"])
  assert np.abs(delta).max() > 0  # the discriminator's loss moved its own delta
  import transformers as T
  disc, info = T.DebertaV2Model.from_pretrained(os.path.join(wd, "hf"),
                                                output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert disc.config.num_hidden_layers == 2
  np.testing.assert_allclose(disc.embeddings.word_embeddings.weight.detach().numpy()[
      :gen_word.shape[0]], (gen_word + delta)[:disc.config.vocab_size], atol=1e-6)
  head = load_file(os.path.join(wd, "hf", "rtd_head.safetensors"))
  assert head and all(np.all(np.isfinite(v)) for v in head.values())
  gen, info = T.DebertaV2ForMaskedLM.from_pretrained(os.path.join(wd, "hf", "generator"),
                                                     output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert gen.config.num_hidden_layers == 1
