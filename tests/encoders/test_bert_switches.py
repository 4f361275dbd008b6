"""A BERT switches on the shared primitives by config alone (encoders/bert.py defaults):
grouped-query attention, RMSNorm and the bucketed relative position bias are settings of
the locked config (`--config.model.<key>=...` works), the model builds and runs with them,
`auto` leaves Splash for a bias, and an HF export, which no BertModel can hold, is refused
by name."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import encoders
from configs import bert as bert_configs
from encoders import base


def _model_config(**switches):
  config = bert_configs.get_config("tiny")
  for key, value in switches.items():
    setattr(config.model, key, value)  # locked: an unknown key would raise here
  m = config.model
  m.dtype, m.heads, m.hidden_dropout_prob, m.attention_probs_dropout_prob = (
      "float32", ("mlm",), 0.0, 0.0)
  return m


def _run(cfg, params=None):
  model = encoders.build(cfg)
  if params is None:
    params = encoders.init_params(model, jax.random.PRNGKey(0))
  ids = jnp.asarray(np.random.RandomState(0).randint(5, 99, (2, 24)), jnp.int32)
  mask = jnp.asarray((np.arange(24)[None] < np.array([[24], [15]])).astype(np.int32))
  return params, np.asarray(jax.jit(model.apply)({"params": params}, ids, mask).mlm_logits)


def test_switches_are_config_keys_and_run():
  heads = bert_configs.get_config("tiny").model.num_attention_heads
  cfg = _model_config(num_key_value_heads=1, norm_kind="rmsnorm",
                      relative_attention_num_buckets=16, relative_attention_max_distance=64)
  params, logits = _run(cfg)
  att = params["encoder"]["layer_0"]["attention"]
  assert att["key"]["kernel"].shape[1] == 1 and att["query"]["kernel"].shape[1] == heads
  assert "bias" not in params["encoder"]["layer_0"]["attention_norm"]  # RMSNorm: scale only
  assert params["position_bias"]["embedding"].shape == (16, heads)
  assert np.isfinite(logits).all()
  # the bias is live: a zero table gives the model without it, another table differs
  zero = jax.tree.map(lambda x: x, params)
  zero["position_bias"]["embedding"] = jnp.zeros_like(params["position_bias"]["embedding"])
  plain_cfg = _model_config(num_key_value_heads=1, norm_kind="rmsnorm")
  plain = {k: v for k, v in zero.items() if k != "position_bias"}
  np.testing.assert_allclose(_run(cfg, zero)[1], _run(plain_cfg, plain)[1], atol=1e-5)
  assert np.abs(_run(cfg, params)[1] - _run(cfg, zero)[1]).max() > 1e-3


def test_auto_leaves_splash_for_a_bias_and_export_is_refused(tmp_path):
  with_bias = _model_config(relative_attention_num_buckets=32)
  with_bias.attention_impl = "auto"
  assert base.resolve_attention(with_bias, "tpu", 512).startswith("attention: auto -> xla")
  plain = _model_config()
  plain.attention_impl = "auto"
  assert base.resolve_attention(plain, "tpu", 512).startswith("attention: auto -> splash")
  for switch in ({"num_key_value_heads": 1}, {"norm_kind": "rmsnorm"},
                 {"relative_attention_num_buckets": 8}):
    cfg = _model_config(**switch)
    model = encoders.build(cfg)
    params = encoders.init_params(model, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match=f"a BERT with .*{list(switch)[0]}"):
      encoders.to_hf(model, params, str(tmp_path / list(switch)[0]))
