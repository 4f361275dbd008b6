"""Task heads shared by the families: MLM, pooler, sentence-pair classifiers (NSP/SOP),
replaced-token detection (RTD)."""
from typing import Callable

import flax.linen as nn
import jax.numpy as jnp

from encoders import layers


class MlmHead(nn.Module):
  """(B,T,D) -> (B,T,V): dense to `transform_size`, activation, LayerNorm, tied decoder
  `decode` (+ bias), cut to the real `vocab_size`.

  `decode` maps (..., E) to vocabulary logits, usually the word embeddings' `attend`, so
  the decoder weight is the embedding table (BERT, RoBERTa, ALBERT, ELECTRA's generator).
  Rows the embedding table pads past `vocab_size` (vocab_pad_multiple) are decoded, with
  their bias, but cut from the logits, so they are never predicted.
  """
  vocab_size: int
  transform_size: int
  act: str = "gelu"
  layer_norm_eps: float = 1e-12
  init_std: float = 0.02
  dtype: layers.Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, decode: Callable):
    h = layers.Dense((self.transform_size,), ("embed", "mlp"), init_std=self.init_std,
                     dtype=self.dtype, name="transform")(x)
    # Pinning the transform's output layout is also a workaround: without it, XLA's SPMD
    # partitioner (jax 0.10.2) silently computes wrong gradients for this dense -> gelu ->
    # tied decoder -> log_softmax chain on a (2,2,2) mesh at a few gathered positions
    # (M = 4..8); tests/launch/test_train.py's layout test compares grad norms to catch it.
    h = layers.constrain(h, ("act_batch", "act_len", "act_embed"))
    h = layers.activation(self.act)(h)
    h = layers.LayerNorm(self.layer_norm_eps, dtype=self.dtype, name="norm")(h)
    logits = decode(h)
    bias = self.param("bias", layers.zeros_init(("vocab",)), (logits.shape[-1],), jnp.float32)
    # float32 logits (f32 accumulation); their cotangent feeds the decoder's backward
    # matmuls in the compute dtype, so it is rounded to it once, where it is made
    return layers.round_cotangent((logits + bias.astype(logits.dtype))[..., :self.vocab_size],
                                  self.dtype)


class Pooler(nn.Module):
  """(B,T,D) -> (B,D): tanh(dense(first token))."""
  hidden_size: int
  init_std: float = 0.02
  dtype: layers.Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    return jnp.tanh(layers.Dense((self.hidden_size,), ("embed", "mlp"), init_std=self.init_std,
                                 dtype=self.dtype, name="dense")(x[:, 0]))


class Classifier(nn.Module):
  """(B,D) -> (B,num_labels): the NSP / SOP / sequence-classification output layer."""
  num_labels: int = 2
  init_std: float = 0.02
  dtype: layers.Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    return layers.Dense((self.num_labels,), ("embed", None), init_std=self.init_std,
                        dtype=self.dtype, name="dense")(x)


class RtdHead(nn.Module):
  """(B,T,D) -> (B,T): ELECTRA's replaced-token-detection scorer, dense D -> D, `act`,
  dense D -> 1 (a logit per token; > 0 means "replaced"). Any family can carry it
  (objectives/rtd.py adds it to a family that does not declare one)."""
  hidden_size: int
  act: str = "gelu"
  init_std: float = 0.02
  dtype: layers.Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    h = layers.Dense((self.hidden_size,), ("embed", "mlp"), init_std=self.init_std,
                     dtype=self.dtype, name="dense")(x)
    h = layers.activation(self.act)(h)
    out = layers.Dense((1,), ("mlp", None), init_std=self.init_std, dtype=self.dtype,
                       name="prediction")(h)
    return out[..., 0]
