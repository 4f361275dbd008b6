"""The MLP and the transformer block, composed of injected parts (flaxformer style)."""
from typing import Callable, Optional

import flax.linen as nn
import jax.numpy as jnp

from encoders.layers.core import Dense, Dtype, activation, constrain
from encoders.layers.dropout import Dropout
from encoders.layers.masks import AttentionInputs


class Mlp(nn.Module):
  """(B,T,D) -> (B,T,D): act(x W_in) W_out, or GeGLU act(x W_a) * (x W_g) W_out when gated.
  The fused `wi` kernel is [W_a | W_g]; `act_second` activates its second half instead,
  act(x W_g) * (x W_a): the [up | gate] layout of GTE's up_gate_proj and NomicBERT's
  [fc11 | fc12]. `out_bias` overrides `use_bias` for W_out alone (GTE's down_proj)."""
  intermediate_size: int
  hidden_size: int
  act: str = "gelu"
  gated: bool = False
  use_bias: bool = True
  init_std: float = 0.02
  dtype: Dtype = jnp.float32
  out_bias: Optional[bool] = None
  act_second: bool = False

  @nn.compact
  def __call__(self, x):
    width = self.intermediate_size * (2 if self.gated else 1)
    h = Dense((width,), ("embed", "mlp"), self.use_bias, self.init_std, self.dtype,
              name="wi")(x)
    h = constrain(h, ("act_batch", "act_len", "act_mlp"))
    if self.gated:
      h, gate = jnp.split(h, 2, axis=-1)
      if self.act_second:
        h, gate = gate, h
      h = activation(self.act)(h) * gate
    else:
      h = activation(self.act)(h)
    out_bias = self.use_bias if self.out_bias is None else self.out_bias
    return Dense((self.hidden_size,), ("mlp", "embed"), out_bias, self.init_std,
                 self.dtype, name="wo")(h)


class EncoderBlock(nn.Module):
  """One transformer layer: x (B,T,D), inputs: AttentionInputs -> (B,T,D).

  post-LN (BERT, ALBERT): x = LN(x + drop(attn(x))); x = LN(x + drop(mlp(x))).
  pre-LN (ModernBERT): x = x + attn(LN(x)); x = x + mlp(LN(x)); the first layer's attention
  norm may be absent (`attention_norm=False`).
  `attention`, `mlp` and `norm` are factories (e.g. functools.partial of a module class);
  the attention module is called as attention(h, inputs, deterministic).
  `post`: an optional factory of a module run after the layer as post(x_in, x_out, inputs,
  deterministic) -> x_out (DeBERTa v2's convolution after its first layer), named "post".
  With a query stream (`inputs.query`, post-LN only: DeBERTa's enhanced mask decoder), the
  attention's queries and its residual come from that stream, keys and values from x.
  """
  attention: Callable[..., nn.Module]
  mlp: Callable[..., nn.Module]
  norm: Callable[..., nn.Module]
  pre_norm: bool = False
  attention_norm: bool = True
  dropout_rate: float = 0.0
  post: Optional[Callable[..., nn.Module]] = None

  @nn.compact
  def __call__(self, x, inputs: AttentionInputs, deterministic: bool = True):
    x_in = x
    drop = Dropout(self.dropout_rate)
    attn = self.attention(name="attention")
    if self.pre_norm:
      if inputs.query is not None:
        raise ValueError("a separate query stream (inputs.query) needs a post-LN block")
      h = self.norm(name="attention_norm")(x) if self.attention_norm else x
      x = x + drop(attn(h, inputs, deterministic), deterministic)
      x = x + drop(self.mlp(name="mlp")(self.norm(name="mlp_norm")(x)), deterministic)
    else:
      h = attn(x, inputs, deterministic)
      residual = x if inputs.query is None else inputs.query
      x = self.norm(name="attention_norm")(residual + drop(h, deterministic))
      h = self.mlp(name="mlp")(x)
      x = self.norm(name="mlp_norm")(x + drop(h, deterministic))
    if self.post is not None:
      x = self.post(name="post")(x_in, x, inputs, deterministic)
    return constrain(x, ("act_batch", "act_len", "act_embed"))


class Sequence(nn.Module):
  """Several blocks run in order as one parameter set: `blocks[i]` is named `layer_i`
  (ALBERT's layer group of `inner_group_num` layers; a repeating period of different
  blocks under scan, e.g. ModernBERT's global, local, local)."""
  blocks: tuple

  @nn.compact
  def __call__(self, x, inputs: AttentionInputs, deterministic: bool = True):
    for i, block in enumerate(self.blocks):
      x = block(name=f"layer_{i}")(x, inputs, deterministic)
    return x
