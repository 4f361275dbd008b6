"""DistilBERT (Sanh et al. 2019) on the generic encoder.

BERT's post-LN layer without token types, without a pooler, with learned positions,
initialised to the sin/cos table with `sinusoidal_pos_embds` (HF's name; transformers v5
also keeps that table a trained parameter, so a fine-tuned checkpoint's stored table is
loaded and run as it is), and one difference inside the layer: the attention output
joins the residual without dropout (only the MLP output is dropped), as in the released
model. Every LayerNorm uses eps 1e-12 (HF hard-codes it).
The MLM head is BERT's (dense, activation, LayerNorm, decoder tied to the word
embeddings). The paper's model is BERT-base halved: 6 layers of width 768 (66M params).
"""
import functools

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
import numpy as np

from encoders import base, bert, heads, layers, model, tasks

# layers, hidden, heads
VARIANTS = {
    "tiny": (2, 128, 2),
    "base": (6, 768, 12),
}


def defaults(variant: str = "base") -> ml_collections.ConfigDict:
  """The model section of a DistilBERT config (our common names; HF's `dim`, `n_layers`,
  `n_heads`, `hidden_dim`, `activation`, `dropout`, `attention_dropout` are mapped in
  encoders/hf/distilbert.py)."""
  n_layers, hidden, n_heads = VARIANTS[variant]
  m = bert.defaults()
  m.family = "distilbert"
  m.variant = variant
  m.num_hidden_layers = n_layers
  m.hidden_size = hidden
  m.num_attention_heads = n_heads
  m.intermediate_size = 4 * hidden
  m.type_vocab_size = 0  # DistilBERT has no token types
  m.sinusoidal_pos_embds = False  # True: positions start as the sin/cos table (trained)
  m.heads = ("mlm",)  # subset of: mlm (DistilBERT has no pooler and no pair head)
  m.seq_classif_dropout = 0.2  # the pooled task head (encoders/tasks/): its dropout
  m.qa_dropout = 0.1  # and extractive QA dropout, HF's names
  del m["position_style"]
  return m


def sinusoidal_table(n_pos: int, dim: int) -> np.ndarray:
  """HF's DistilBERT table, computed in float64 and stored as float32: angle
  pos / 10000^(2 (j // 2) / dim); sin at even j, cos at odd j."""
  pos = np.arange(n_pos, dtype=np.float64)[:, None]
  j = np.arange(dim)
  angles = pos / np.power(10000.0, 2 * (j // 2) / dim)[None, :]
  return np.where(j % 2 == 0, np.sin(angles), np.cos(angles)).astype(np.float32)


class DistilBertEmbeddings(layers.Embeddings):
  """`layers.Embeddings` whose learned position table can start as exactly HF's sin/cos
  table (`position_init="sin_cos"`, unscaled: transformers' sinusoidal init)."""

  def _position_init(self):
    if self.position_init != "sin_cos":
      return super()._position_init()

    def init(key, shape, dtype=jnp.float32):
      del key
      return jnp.asarray(sinusoidal_table(*shape), dtype)
    return nn.with_logical_partitioning(init, (None, "embed"))


def forward_flops(cfg, seq_len: int, mlm_positions=None) -> float:
  """L post-LN layers and the MLM head over its positions (no pooler)."""
  t, d = seq_len, cfg.hidden_size
  total = cfg.num_hidden_layers * bert.layer_flops(t, d, cfg.intermediate_size)
  return float(total + bert.head_flops(cfg, t, d, d, mlm_positions))


class DistilBertBlock(nn.Module):
  """DistilBERT's layer: x = LN(x + attn(x)); x = LN(x + drop(mlp(x))). The same
  submodule names as `layers.EncoderBlock` (attention, attention_norm, mlp, mlp_norm)."""
  attention: object
  mlp: object
  norm: object
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x, inputs: layers.AttentionInputs, deterministic: bool = True):
    h = self.attention(name="attention")(x, inputs, deterministic)
    x = self.norm(name="attention_norm")(x + h)
    h = self.mlp(name="mlp")(x)
    h = layers.Dropout(self.dropout_rate)(h, deterministic)
    x = self.norm(name="mlp_norm")(x + h)
    return layers.constrain(x, ("act_batch", "act_len", "act_embed"))


def block_factory(c, dtype):
  mlp = functools.partial(layers.Mlp, c.intermediate_size, c.hidden_size, c.hidden_act,
                          init_std=c.initializer_range, dtype=dtype)
  norm = functools.partial(layers.LayerNorm, c.layer_norm_eps, dtype=dtype)
  block_cls = layers.remat_block(DistilBertBlock, c.remat_policy)
  return functools.partial(block_cls, bert.attention_factory(c, dtype), mlp, norm,
                           dropout_rate=c.hidden_dropout_prob)


@base.register_family("distilbert")
class DistilBert(model.Encoder):
  """DistilBERT: no token types (token_type_ids are refused), positions 0.. per row (or
  per packed segment), DistilBERT's layers, BERT's MLM head."""
  defaults = staticmethod(defaults)
  forward_flops = staticmethod(forward_flops)

  @staticmethod
  def task_heads(cfg):
    """transformers' DistilBERT heads: pooled = pre_classifier (dense + ReLU) on the
    first token, then the classifier (dropout seq_classif_dropout); tokens: one linear
    layer (dropout `dropout`); spans: one linear layer (dropout qa_dropout)."""
    return {"pooled": tasks.Head(pooling="cls", act="relu",
                                 dropout=cfg.get("seq_classif_dropout", 0.2),
                                 hf={"dense": "pre_classifier", "out": "classifier"}),
            "per_token": tasks.Head(hf={"out": "classifier"}),
            "span": tasks.Head(dropout=cfg.get("qa_dropout", 0.1), hf={"out": "qa_outputs"})}

  def parts(self) -> model.Parts:
    c = self.config
    if c.get("type_vocab_size", 0):
      raise ValueError(f"DistilBERT has no token types; got type_vocab_size="
                       f"{c.type_vocab_size} (set it to 0)")
    if "pooler" in c.heads:
      raise ValueError("DistilBERT has no pooler (transformers' DistilBertModel has none)")
    dtype = layers.dtype_from_name(c.dtype)
    std = c.initializer_range
    block = block_factory(c, dtype)
    return model.Parts(
        embeddings=functools.partial(
            DistilBertEmbeddings, vocab_size=base.padded_vocab_size(c),
            embedding_size=c.hidden_size, max_position_embeddings=c.max_position_embeddings,
            type_vocab_size=0, layer_norm_eps=c.layer_norm_eps,
            dropout_rate=c.hidden_dropout_prob, init_std=std, dtype=dtype,
            position_init=("sin_cos" if c.sinusoidal_pos_embds
                           else c.get("position_init", "normal"))),
        stack=functools.partial(layers.Stack, c.num_hidden_layers, lambda i: block,
                                scan=c.get("scan_layers", False)),
        heads={"mlm": functools.partial(heads.MlmHead, c.vocab_size, c.hidden_size,
                                        c.hidden_act, c.layer_norm_eps, std, dtype)})
