"""encoder-zoo encoders: BERT-family models as pure Flax functions.

    model = encoders.build(config.model)          # or: model, params = encoders.from_hf(dir)
    out = model.apply({"params": params}, input_ids, attention_mask, token_type_ids)
    out.last_hidden_state, out.mlm_logits, out.nsp_logits
    encoders.to_hf(model, params, out_dir)        # loadable by transformers.from_pretrained
    apply_fn, params = encoders.load(dir)         # a plain function (encoders/pure.py)
"""
import importlib
import pkgutil

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoders.base import (EncoderOutput, build, family_defaults, forward_flops,
                           register_family, validate_inputs)

# Every family module registers itself; importing them all here means a new family is only
# its own file (and its HF mapping under encoders/hf/), with no list to edit.
for _info in pkgutil.iter_modules(__path__):
  if _info.name not in ("base", "layers", "heads", "hf", "model"):
    importlib.import_module(f"encoders.{_info.name}")

from encoders.hf import from_hf, to_hf, hf_config  # noqa: E402
from encoders.pure import as_function, load, place, to_nnx  # noqa: E402

__all__ = ["EncoderOutput", "build", "from_hf", "to_hf", "hf_config", "register_family",
           "validate_inputs", "init_params", "init_boxed", "family_defaults", "forward_flops",
           "load", "as_function", "place", "to_nnx"]


def init_boxed(model, rng, batch_size=1, length=8):
  """Random params for `model`, boxed with their logical axes (for sharding). Jitted: an
  op-by-op init compiles every random draw and reshape as a program of its own."""
  return jax.jit(model.init)(rng, jnp.zeros((batch_size, length), jnp.int32))["params"]


def init_params(model, rng, batch_size=1, length=8):
  """Random float32 params for `model` (unboxed from their logical partitioning)."""
  return nn.unbox(init_boxed(model, rng, batch_size, length))
