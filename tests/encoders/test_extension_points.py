"""A new family plugs in through registries only: its module registers with
`register_family`, its HF mapping with `register_mapping`, and nothing else is edited."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import encoders
from encoders import base, hf, layers
from encoders.hf import mapping as hf_mapping


def test_new_family_and_mapping_register_without_editing_shared_files(tmp_path):
  @base.register_family("toy")
  class Toy(nn.Module):
    config: object

    @nn.compact
    def __call__(self, input_ids, attention_mask=None, token_type_ids=None, **kwargs):
      base.validate_inputs(self.config, input_ids, attention_mask, token_type_ids)
      x = layers.Embeddings(self.config.vocab_size, self.config.hidden_size,
                            name="embeddings")(input_ids)
      return base.EncoderOutput(last_hidden_state=x)

  @hf.register_mapping
  class ToyMapping(hf.Mapping):
    model_types = ("toy",)
    architectures = {"ToyModel": ("", ())}

    def config_from_hf(self, cfg, heads):
      hf.refuse_unknown(cfg, ("vocab_size", "hidden_size"), {})
      from configs import common
      m = common.model_defaults()
      m.family, m.vocab_size, m.hidden_size, m.heads = "toy", cfg["vocab_size"], cfg[
          "hidden_size"], ()
      return m

    def config_to_hf(self, cfg):
      return {"model_type": "toy", "vocab_size": cfg.vocab_size,
              "hidden_size": cfg.hidden_size}, "ToyModel"

    def rules(self, cfg):
      return [hf.Rule("embeddings/word_embeddings/embedding", "emb.weight", "embedding"),
              hf.Rule("embeddings/norm/scale", "norm.weight"),
              hf.Rule("embeddings/norm/bias", "norm.bias")]

  try:
    from configs import common
    cfg = common.model_defaults()
    cfg.family, cfg.vocab_size, cfg.hidden_size, cfg.heads = "toy", 11, 4, ()
    model = encoders.build(cfg)
    params = encoders.init_params(model, jax.random.PRNGKey(0))
    encoders.to_hf(model, params, str(tmp_path / "toy"))
    assert json.loads((tmp_path / "toy" / "config.json").read_text())["model_type"] == "toy"
    model2, params2 = encoders.from_hf(str(tmp_path / "toy"))
    ids = jnp.array([[1, 2, 3]])
    np.testing.assert_array_equal(model.apply({"params": params}, ids).last_hidden_state,
                                  model2.apply({"params": params2}, ids).last_hidden_state)
    with pytest.raises(ValueError, match="input_ids contains 11"):
      model.apply({"params": params}, jnp.array([[11]]))
  finally:
    base._FAMILIES.pop("toy", None)
    hf_mapping._MAPPINGS.pop("toy", None)
