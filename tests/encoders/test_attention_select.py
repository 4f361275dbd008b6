"""`attention_impl: auto`: which kernel each platform gets and why (the platform is faked:
the choice is pure logic on the config), the TPU recipe configs that let Splash run, the
log line of the choice, and the chosen Splash path lowering for TPU from this CPU."""
import logging
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import encoders
from configs import bert as bert_configs
from encoders import base
from encoders.layers import attention


@pytest.mark.parametrize("platform,kw,impl,why", [
    ("cpu", {}, "cpu", "CPU"),
    ("tpu", dict(seq_len=512), "splash", "multiple of its block size 128"),
    ("tpu", dict(seq_len=384), "splash", "384"),
    ("tpu", dict(seq_len=500), "xla", "500 is not a multiple"),
    ("tpu", dict(seq_len=None), "xla", "not known"),
    ("tpu", dict(seq_len=512, dropout_rate=0.1), "xla", "attention_probs_dropout_prob=0.1"),
    ("tpu", dict(seq_len=512, family="deberta-v2"), "xla", "score bias"),
    ("gpu", dict(seq_len=500), "cudnn", "cuDNN"),
    ("cuda", dict(seq_len=512, dtype="float16"), "cudnn", "cuDNN"),
    ("gpu", dict(dtype="float32"), "xla", "float32"),
    ("gpu", dict(head_dim=160), "xla", "head dim 160"),
    ("gpu", dict(family="modernbert"), "xla", "local window"),
])
def test_choose_impl(platform, kw, impl, why):
  got, reason = attention.choose_impl(platform, **kw)
  assert got == impl and why in reason, (got, reason)


def test_gpu_dropout_is_named_in_the_reason():
  impl, reason = attention.choose_impl("gpu", 128, dropout_rate=0.1)
  assert impl == "cudnn" and "einsum path" in reason


def _model_cfg(variant):
  return ml_collections.ConfigDict(bert_configs.get_config(variant).model.to_dict())


@pytest.mark.parametrize("variant", ["base", "large"])
def test_tpu_recipe_configs_get_splash_at_512(variant):
  cfg = _model_cfg(variant)
  assert cfg.attention_probs_dropout_prob == 0.0 and cfg.attention_impl == "auto"
  line = base.resolve_attention(cfg, "tpu", 512)
  assert cfg.attention_impl == "splash" and "Splash" in line


def test_a_leftover_dropout_key_the_family_lacks_does_not_cost_splash():
  # fine-tuning's init_from lays a ModernBERT directory's settings over BERT's defaults:
  # attention_probs_dropout_prob=0.1 stays in the section, but no ModernBERT layer reads it
  from configs import finetune
  from encoders import modernbert  # noqa: F401 - registers the family
  cfg = ml_collections.ConfigDict(finetune.get_config("embedding").model.to_dict())
  assert cfg.attention_probs_dropout_prob > 0
  for k, v in base.family_defaults("modernbert").items():
    cfg[k] = v
  assert "attention_probs_dropout_prob" not in base.family_defaults("modernbert")
  line = base.resolve_attention(cfg, "tpu", 512)
  assert cfg.attention_impl == "splash" and "Splash" in line
  bert = ml_collections.ConfigDict(finetune.get_config("embedding").model.to_dict())
  bert.attention_impl = "auto"
  base.resolve_attention(bert, "tpu", 512)  # BERT reads it: its dropout still rules
  assert bert.attention_impl == "xla"


def test_bert_large_recipe_scans_its_layers_for_compile_time():
  """BERT-large's TPU step compiles in under 5 minutes on a 2-core CPU only scanned
  (docs/benchmarks.md); base stays unrolled."""
  assert bert_configs.get_config("large").model.scan_layers is True
  assert bert_configs.get_config("base").model.scan_layers is False


def test_dropout_config_says_why_it_misses_splash_and_explicit_choice_is_kept():
  cfg = _model_cfg("tiny")  # the CPU main job keeps BERT's attention dropout
  assert cfg.attention_probs_dropout_prob > 0
  line = base.resolve_attention(cfg, "tpu", 128)
  assert cfg.attention_impl == "xla" and "dropout" in line
  cfg.attention_impl = "einsum"
  assert "set in the config" in base.resolve_attention(cfg, "tpu", 128)
  assert cfg.attention_impl == "einsum"


def test_dtype_auto_counts_as_bf16_on_gpu():
  cfg = _model_cfg("base")
  assert cfg.dtype == "auto"
  base.resolve_auto(cfg, "gpu", 512)
  assert cfg.attention_impl == "cudnn" and cfg.dtype == "bfloat16"


def test_trainer_logs_the_choice_in_its_first_lines(caplog):
  from launch.trainer import state
  fake_mesh = types.SimpleNamespace(devices=np.array([types.SimpleNamespace(platform="tpu")]))
  for variant, level, impl in (("base", logging.INFO, "splash"),
                               ("tiny", logging.WARNING, "xla")):
    config = ml_collections.ConfigDict(bert_configs.get_config(variant).to_dict())
    config.data.seq_len = 256
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="encoder_zoo"):
      state._resolve_attention(config, fake_mesh)
    assert config.model.attention_impl == impl
    rec = [r for r in caplog.records if "attention: auto" in r.getMessage()]
    assert len(rec) == 1 and rec[0].levelno == level, [r.getMessage() for r in rec]


def test_auto_on_tpu_lowers_the_model_to_the_splash_kernel():
  cfg = ml_collections.ConfigDict(bert_configs.get_config("tiny").model.to_dict())
  cfg.attention_probs_dropout_prob = 0.0
  cfg.vocab_size = 512
  base.resolve_auto(cfg, "tpu", 128)
  assert cfg.attention_impl == "splash" and cfg.dtype == "bfloat16"
  model = encoders.build(cfg)
  ids = jnp.ones((2, 128), jnp.int32)
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), ids, ids)
  text = jax.jit(model.apply).trace(params, ids, ids).lower(
      lowering_platforms=("tpu",)).as_text()
  assert "tpu_custom_call" in text


def test_tpu_without_a_length_leaves_the_choice_to_each_call():
  """A model built for TPU before its inputs are known (encoders.from_hf) keeps `auto`
  where only the length decides; where something else rules the kernel out it is
  decided now, as before."""
  cfg = _model_cfg("base")
  line = base.resolve_attention(cfg, "tpu", None)
  assert cfg.attention_impl == "auto" and "chosen at each call" in line
  cfg = _model_cfg("tiny")  # attention dropout 0.1: not Splash whatever the length
  assert "dropout" in base.resolve_attention(cfg, "tpu", None)
  assert cfg.attention_impl == "xla"
  from configs import deberta as deberta_configs
  cfg = ml_collections.ConfigDict(deberta_configs.get_config("base").model.to_dict())
  line = base.resolve_attention(cfg, "tpu", None)
  assert cfg.relative_impl == "auto" and "relative attention: auto, chosen at each" in line
  assert cfg.attention_impl == "xla"  # DeBERTa's scores carry a bias: never Splash
  cfg = ml_collections.ConfigDict(deberta_configs.get_config("base").model.to_dict())
  base.resolve_attention(cfg, "cpu", None)
  assert cfg.relative_impl == "shift" and cfg.attention_impl == "cpu"


def _tiny_auto(family_config, **overrides):
  cfg = ml_collections.ConfigDict(family_config.get_config("tiny").model.to_dict())
  cfg.update({"attention_probs_dropout_prob": 0.0, "vocab_size": 512, "dtype": "bfloat16",
              **overrides})
  base.resolve_attention(cfg, "tpu", None)
  return cfg


def _lowered_for_tpu(cfg, t):
  model = encoders.build(cfg)
  ids = jnp.ones((2, t), jnp.int32)
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), ids, ids)
  return jax.jit(model.apply).trace(params, ids, ids).lower(
      lowering_platforms=("tpu",)).as_text()


def test_auto_left_to_the_call_picks_splash_by_the_length_on_tpu(monkeypatch, caplog):
  cfg = _tiny_auto(bert_configs)
  assert cfg.attention_impl == "auto"
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")  # the host that traces it
  attention._LOGGED.clear()
  with caplog.at_level(logging.INFO, logger="encoder_zoo"):
    assert "tpu_custom_call" in _lowered_for_tpu(cfg, 128)
    assert "tpu_custom_call" not in _lowered_for_tpu(cfg, 96)  # jax.nn's attention
  said = [r.getMessage() for r in caplog.records]
  assert any("auto at sequence length 128 -> splash" in m for m in said), said
  assert any("auto at sequence length 96 -> xla" in m for m in said), said


def test_auto_left_to_the_call_runs_the_cpu_kernel_on_the_cpu():
  cfg = _tiny_auto(bert_configs, dtype="float32")
  assert cfg.attention_impl == "auto"
  fixed = ml_collections.ConfigDict(cfg.to_dict())
  fixed.attention_impl = "cpu"
  ids = jnp.asarray(np.random.RandomState(0).randint(5, 500, (2, 24)), jnp.int32)
  mask = jnp.ones_like(ids).at[1, 17:].set(0)
  a, b = encoders.build(cfg), encoders.build(fixed)
  params = a.init(jax.random.PRNGKey(0), ids, mask)
  np.testing.assert_array_equal(np.asarray(a.apply(params, ids, mask).last_hidden_state),
                                np.asarray(b.apply(params, ids, mask).last_hidden_state))


def test_deberta_relative_auto_left_to_the_call_takes_the_fused_kernel_on_tpu(monkeypatch):
  from configs import deberta as deberta_configs
  cfg = _tiny_auto(deberta_configs)
  assert cfg.relative_impl == "auto"
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  assert "deberta_rel_fwd" in _lowered_for_tpu(cfg, 128)
  assert "deberta_rel_fwd" not in _lowered_for_tpu(cfg, 96)  # the shift formulation


def test_a_symbolic_length_left_to_the_call_gets_the_length_free_kernel(monkeypatch):
  """jax.export's dynamic length (a symbolic dimension) has no value to choose by: the
  call then takes what an unknown length gets, instead of failing on the symbol."""
  from encoders.layers import relative
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  t, = jax.export.symbolic_shape("t")
  assert attention.concrete_length(t) is None and attention.concrete_length(256) == 256
  assert attention.call_time_impl("auto", t, 0.0, jnp.bfloat16, 64) == "xla"
  assert attention.call_time_impl("auto", 256, 0.0, jnp.bfloat16, 64) == "splash"
  assert relative.choose_impl("tpu", attention.concrete_length(t))[0] == "shift"
