"""GTE, the gte-*-v1.5 "new" architecture (Zhang et al. 2024, mGTE), on the generic encoder.

The same layer as NomicBERT (`nomicbert.RotaryPostLn`: post-LN, rotary over the whole head
dim, a gated MLP act(x W_gate) * (x W_up), no position table, BERT's pooler), configured:
- biases on q, k, v and out (`attention_bias`) and on the MLP's down projection alone
  (`mlp_out_bias`; gate and up have none), `hidden_act` gelu;
- rotary theta 160k (500k in gte-base-en-v1.5), RoPE scaling by `rope_type` as NomicBERT;
- token types only when `type_vocab_size` > 0 (gte-base-en-v1.5 has none);
- the MLM head's activation is always GELU (HF's GteLMHead), whatever `hidden_act` is.

Unpadding: the original GTE code drops padding tokens before the layers for speed. Here the
same saving comes from packing (segment ids: rows of several documents, none attending
across), and padded rows give what the unpadded sequences give (tests/encoders/test_gte.py).
Dropout: HF also drops out the gated activation inside the MLP (hidden_dropout_prob); the
shared `Mlp` has no dropout, so with hidden_dropout_prob > 0 training has one dropout site
fewer than transformers' (inference is the same).
"""
import ml_collections

from encoders import base, nomicbert

# The released models: gte-base-en-v1.5, gte-large-en-v1.5, gte-multilingual-base (layers,
# hidden, heads, MLP width).
VARIANTS = {
    "tiny": (4, 128, 2, 256),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
    "multilingual-base": (12, 768, 12, 3072),
}


def defaults(variant: str = "base") -> ml_collections.ConfigDict:
  """The model section of a GTE config (HF GteConfig's names)."""
  n_layers, hidden, n_heads, ffn = VARIANTS[variant]
  m = nomicbert.defaults("base")
  m.family = "gte"
  m.variant = variant
  m.vocab_size = 30528
  m.hidden_size = hidden
  m.num_hidden_layers = n_layers
  m.num_attention_heads = n_heads
  m.head_dim = hidden // n_heads
  m.intermediate_size = ffn
  m.hidden_act = "gelu"
  m.hidden_dropout_prob = 0.1
  m.max_position_embeddings = 8192
  m.type_vocab_size = 0
  m.pad_token_id = 0
  m.rope_theta = 500_000.0 if variant == "base" else 160_000.0
  m.attention_bias = True
  m.mlp_out_bias = True
  m.mlm_act = "gelu"
  if variant == "multilingual-base":
    m.vocab_size, m.pad_token_id, m.type_vocab_size = 250048, 1, 1
  if variant == "large":
    m.type_vocab_size = 2
  return m


@base.register_family("gte")
class Gte(nomicbert.RotaryPostLn):
  """GTE v1.5: rotary, GLU MLP, biased projections, post-LN, BERT's heads."""
  defaults = staticmethod(defaults)
  forward_flops = staticmethod(nomicbert.forward_flops)  # biases are element-wise work
