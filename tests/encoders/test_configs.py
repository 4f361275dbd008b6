"""Every size variant has exactly the parameter count of the transformers model; "auto"
settings resolve per platform."""
import jax
import ml_collections
import numpy as np
import pytest
import torch
import transformers as T

import encoders
from configs import bert as bert_configs
from configs import roberta as roberta_configs
from encoders.hf import bert as bert_hf


def _our_count(cfg):
  model = encoders.build(cfg)
  shapes = jax.eval_shape(lambda: encoders.init_params(model, jax.random.PRNGKey(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


def _hf_count(cfg):
  hf_dict, arch = bert_hf.BertMapping().config_to_hf(cfg)
  cfg_cls = T.RobertaConfig if hf_dict["model_type"] == "roberta" else T.BertConfig
  with torch.device("meta"):
    model = getattr(T, arch)(cfg_cls(**hf_dict))
  return sum(p.numel() for p in model.parameters())  # tied weights counted once


@pytest.mark.parametrize("module,variant",
                         [(bert_configs, v) for v in bert_configs.VARIANTS] +
                         [(roberta_configs, v) for v in roberta_configs.VARIANTS])
def test_parameter_count_matches_transformers(module, variant):
  cfg = module.get_config(variant).model
  # TPU recipes pad the vocabulary to a multiple of 128 for the MXU; the padded rows are a
  # compute detail (never predicted, sliced off at export), so count the model unpadded.
  padded = _our_count(cfg)
  with cfg.unlocked():
    cfg.vocab_pad_multiple = 1
  ours = _our_count(cfg)
  assert ours == _hf_count(cfg)
  assert ours > 1e6
  assert padded >= ours and (padded - ours) % (-cfg.vocab_size % 128 or 1) == 0


def test_known_sizes():
  # Published sizes: BERT-base 110M (with MLM+NSP heads ~110.1M), RoBERTa-large ~355M.
  assert abs(_our_count(bert_configs.get_config("base").model) - 110.1e6) < 0.2e6
  assert abs(_our_count(roberta_configs.get_config("large").model) - 355.4e6) < 0.5e6


def test_config_arg_errors():
  with pytest.raises(ValueError, match="huge"):
    bert_configs.get_config("huge")
  with pytest.raises(ValueError, match="nonsense"):
    bert_configs.get_config("tiny,nonsense=1")


def test_auto_settings_follow_the_platform():
  from encoders import base
  cfg = bert_configs.get_config("tiny").model
  assert cfg.dtype == "auto" and cfg.attention_impl == "auto"
  built = encoders.build(cfg).config  # this host is a CPU
  assert (built.dtype, built.attention_impl) == ("float32", "cpu")
  # tiny keeps attention dropout: TPU takes xla (no Splash), GPU cuDNN (eval; training
  # einsum), see tests/encoders/test_attention_select.py
  for platform, want in [("tpu", ("bfloat16", "xla")), ("gpu", ("bfloat16", "cudnn")),
                         ("cpu", ("float32", "cpu"))]:
    c = base.resolve_auto(ml_collections.ConfigDict(cfg.to_dict()), platform)
    assert (c.dtype, c.attention_impl) == want, platform
  explicit = ml_collections.ConfigDict(cfg.to_dict())
  explicit.dtype, explicit.attention_impl = "float32", "splash"
  c = base.resolve_auto(explicit, "cpu")
  assert (c.dtype, c.attention_impl) == ("float32", "splash")  # explicit choices stay
