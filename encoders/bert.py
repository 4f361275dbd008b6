"""BERT (Devlin et al. 2019) and RoBERTa (Liu et al. 2019) as one module.

RoBERTa is a configuration: `position_style="roberta"` numbers positions from
pad_token_id + 1, `type_vocab_size=1`, layer_norm_eps=1e-5, no NSP head.
"""
import functools

import flax.linen as nn
import jax.numpy as jnp

from encoders import base, heads, layers


@base.register_family("bert")
class Bert(nn.Module):
  """input_ids (B,T) [+ attention_mask, token_type_ids, segment_ids, position_ids] ->
  EncoderOutput. `masked_positions` (B,M) computes the MLM head only at those positions."""
  config: object

  def position_offset(self) -> int:
    return self.config.pad_token_id + 1 if self.config.position_style == "roberta" else 0

  def max_length(self) -> int:
    return self.config.max_position_embeddings - self.position_offset()

  def setup(self):
    c = self.config
    dtype = layers.dtype_from_name(c.dtype)
    std = c.initializer_range
    self.embeddings = layers.Embeddings(
        vocab_size=base.padded_vocab_size(c),
        embedding_size=c.hidden_size, max_position_embeddings=c.max_position_embeddings,
        type_vocab_size=c.type_vocab_size, layer_norm_eps=c.layer_norm_eps,
        dropout_rate=c.hidden_dropout_prob, init_std=std, dtype=dtype)
    head_dim = c.hidden_size // c.num_attention_heads
    attention = functools.partial(
        layers.MultiHeadAttention, num_heads=c.num_attention_heads, head_dim=head_dim,
        hidden_size=c.hidden_size, dropout_rate=c.attention_probs_dropout_prob,
        impl=c.attention_impl, init_std=std, dtype=dtype)
    mlp = functools.partial(layers.Mlp, c.intermediate_size, c.hidden_size, c.hidden_act,
                            init_std=std, dtype=dtype)
    norm = functools.partial(layers.LayerNorm, c.layer_norm_eps, dtype=dtype)
    block_cls = layers.remat_block(layers.EncoderBlock, c.remat_policy)
    block = lambda i: functools.partial(block_cls, attention, mlp, norm,
                                        dropout_rate=c.hidden_dropout_prob)
    self.encoder = layers.Encoder(c.num_hidden_layers, block,
                                  scan=c.get("scan_layers", False))
    if "pooler" in c.heads or "nsp" in c.heads:
      self.pooler = heads.Pooler(c.hidden_size, std, dtype)
    if "mlm" in c.heads:
      self.mlm = heads.MlmHead(c.vocab_size, c.hidden_size, c.hidden_act, c.layer_norm_eps,
                               std, dtype)
    if "nsp" in c.heads:
      self.nsp = heads.Classifier(2, std, dtype)

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
               segment_ids=None, position_ids=None, masked_positions=None,
               deterministic=True):
    c = self.config
    base.validate_inputs(c, input_ids, attention_mask, token_type_ids, segment_ids,
                         position_ids, max_length=self.max_length())
    input_ids = input_ids.astype(jnp.int32)
    if attention_mask is None:
      attention_mask = (segment_ids > 0) if segment_ids is not None else jnp.ones_like(input_ids)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if position_ids is None:
      if segment_ids is not None:
        position_ids = base.positions_in_segments(segment_ids) + self.position_offset()
      elif c.position_style == "roberta":
        # HF's create_position_ids_from_input_ids: pads sit at pad_token_id.
        real = (input_ids != c.pad_token_id).astype(jnp.int32)
        position_ids = jnp.cumsum(real, axis=1) * real + c.pad_token_id
      else:
        position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
    x = self.embeddings(input_ids, position_ids, token_type_ids, deterministic)
    if c.attention_impl == "splash":  # segment ids straight to the kernel, no (T,T) mask
      mask = layers.segment_mask(attention_mask, segment_ids)
    else:
      mask = layers.make_attention_mask(attention_mask, segment_ids)
    x = self.encoder(x, mask, None, None, None, deterministic)
    out = {"last_hidden_state": x}
    if "pooler" in c.heads or "nsp" in c.heads:
      out["pooler_output"] = self.pooler(x)
    if "nsp" in c.heads:
      out["nsp_logits"] = self.nsp(out["pooler_output"])
    if "mlm" in c.heads:
      h = x if masked_positions is None else jnp.take_along_axis(
          x, masked_positions[..., None].astype(jnp.int32), axis=1)
      logits = self.mlm(h, self.embeddings.attend)
      out["mlm_logits"] = logits[..., :c.vocab_size]
    return base.EncoderOutput(**out)
