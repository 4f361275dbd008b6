"""NomicBERT (Nussbaum et al. 2024, nomic-embed-text) on the generic encoder.

What differs from BERT, and where it lives here:
- no learned positions: rotary q/k (half-split layout, theta `rope_theta`, 1,000 in the
  released models) over the whole head dim; positions restart per packed document;
  `rope_type` "linear" divides the positions by `rope_factor` (`layers.kernels.
  rope_positions`), "dynamic" (HF's dynamic NTK) changes nothing up to
  max_position_embeddings, the longest input taken;
- q, k, v, out and the MLP without biases (`attention_bias`, `mlp_out_bias` False); the
  LayerNorms keep theirs; `head_dim` may differ from hidden_size / heads;
- SwiGLU: down(act(x W_gate) * (x W_up)), `Mlp(gated=True, act_second=True)` with one
  fused [up | gate] `wi` kernel (the checkpoints' fc11 and fc12);
- post-LN layers as BERT's, token types, an embedding LayerNorm and no final norm;
- the MLM head as BERT's (dense, `mlm_act`, LayerNorm, decoder tied to the embeddings
  with a bias); sequence classification on BERT's tanh pooler.
"""
import functools

import ml_collections

from encoders import base, heads, layers, model, tasks
from encoders.bert import head_flops
from encoders.layers import kernels

# The released nomic-embed-text-v1 / v1.5 and nomic-bert-2048: layers, hidden, heads, MLP.
VARIANTS = {
    "tiny": (4, 128, 2, 256),
    "base": (12, 768, 12, 3072),
}
ROPE_TYPES = ("default", "linear", "dynamic")


def defaults(variant: str = "base") -> ml_collections.ConfigDict:
  """The model section of a NomicBERT config (HF NomicBertConfig's names)."""
  n_layers, hidden, n_heads, ffn = VARIANTS[variant]
  m = ml_collections.ConfigDict()
  m.family = "nomic_bert"  # HF model_type
  m.variant = variant
  m.vocab_size = 30528
  m.hidden_size = hidden
  m.num_hidden_layers = n_layers
  m.num_attention_heads = n_heads
  m.head_dim = hidden // n_heads
  m.intermediate_size = ffn
  m.hidden_act = "silu"
  m.hidden_dropout_prob = 0.0
  m.attention_probs_dropout_prob = 0.0
  m.classifier_dropout = None
  m.max_position_embeddings = 2048
  m.type_vocab_size = 2
  m.initializer_range = 0.02
  m.layer_norm_eps = 1e-12
  m.pad_token_id = 0
  m.rope_theta = 1000.0
  m.rope_type = "default"  # default | linear | dynamic (module docstring)
  m.rope_factor = 1.0
  m.attention_bias = False
  m.mlp_out_bias = False
  m.mlm_act = "silu"  # the MLM head's activation (HF: hidden_act)
  m.heads = ("mlm",)  # subset of: pooler, mlm
  m.dtype = "auto"
  m.attention_impl = "auto"
  m.remat_policy = "none"
  m.scan_layers = False
  m.vocab_pad_multiple = 1
  return m


def forward_flops(cfg, seq_len: int, mlm_positions=None) -> float:
  """Forward FLOPs of one sequence (2 per multiply-add): per layer q, k, v and out
  projections 4 * 2TDHK, attention QK^T and probs @ V 2 * 2T^2HK, the gated MLP 3 * 2TDF;
  the pooler and the MLM head over its P positions as BERT's (`bert.head_flops`)."""
  t, d, f = seq_len, cfg.hidden_size, cfg.intermediate_size
  hk = cfg.num_attention_heads * cfg.head_dim
  per_layer = 8 * t * d * hk + 4 * t * t * hk + 6 * t * d * f
  return float(cfg.num_hidden_layers * per_layer + head_flops(cfg, t, d, d, mlm_positions))


def validate(cfg):
  """Config errors named before anything is built."""
  if cfg.head_dim % 2:
    raise ValueError(f"head_dim={cfg.head_dim}: rotary attention needs an even head dim")
  if cfg.rope_type not in ROPE_TYPES:
    raise ValueError(f"rope_type={cfg.rope_type!r} is not implemented; use one of "
                     f"{ROPE_TYPES}")
  if cfg.rope_type != "default" and not cfg.rope_factor > 0:
    raise ValueError(f"rope_factor={cfg.rope_factor} must be > 0")
  if cfg.pad_token_id is not None and not 0 <= cfg.pad_token_id < cfg.vocab_size:
    raise ValueError(f"pad_token_id={cfg.pad_token_id} is outside the vocabulary "
                     f"(vocab_size={cfg.vocab_size})")


class RotaryPostLn(model.Encoder):
  """A BERT-style post-LN encoder with rotary positions and a gated MLP, no position
  table: NomicBERT, and GTE (encoders/gte.py) as its configuration."""

  @staticmethod
  def task_heads(cfg):
    """transformers' ...ForSequenceClassification classifies the tanh pooler output,
    ...ForTokenClassification each hidden state. transformers has no QA class for these
    families: the span head is ours (fine-tuned here, not exported)."""
    return {"pooled": tasks.Head(pooling="pooler", hf={"out": "classifier"}),
            "per_token": tasks.Head(hf={"out": "classifier"}),
            "span": tasks.Head(dropout=0.0, hf={"out": "qa_outputs"})}

  def attention_inputs(self, attention_mask, segment_ids, position_ids):
    inputs = super().attention_inputs(attention_mask, segment_ids, position_ids)
    factor = self.config.rope_factor if self.config.rope_type == "linear" else 1.0
    return inputs.replace(positions=kernels.rope_positions(position_ids, factor))

  def parts(self) -> model.Parts:
    c = self.config
    validate(c)
    dtype = layers.dtype_from_name(c.dtype)
    std = c.initializer_range
    attention = functools.partial(
        layers.MultiHeadAttention, num_heads=c.num_attention_heads, head_dim=c.head_dim,
        hidden_size=c.hidden_size, use_bias=c.attention_bias,
        dropout_rate=c.attention_probs_dropout_prob, rope_theta=c.rope_theta,
        impl=c.attention_impl, init_std=std, dtype=dtype)
    mlp = functools.partial(layers.Mlp, c.intermediate_size, c.hidden_size, c.hidden_act,
                            gated=True, use_bias=False, out_bias=c.mlp_out_bias,
                            act_second=True, init_std=std, dtype=dtype)
    norm = functools.partial(layers.LayerNorm, c.layer_norm_eps, dtype=dtype)
    block = functools.partial(layers.remat_block(layers.EncoderBlock, c.remat_policy),
                              attention, mlp, norm, dropout_rate=c.hidden_dropout_prob)
    return model.Parts(
        embeddings=functools.partial(
            layers.Embeddings, vocab_size=base.padded_vocab_size(c),
            embedding_size=c.hidden_size, type_vocab_size=c.type_vocab_size,
            layer_norm_eps=c.layer_norm_eps, dropout_rate=c.hidden_dropout_prob,
            init_std=std, dtype=dtype),
        stack=functools.partial(layers.Stack, c.num_hidden_layers, lambda i: block,
                                scan=c.get("scan_layers", False)),
        heads={"pooler": functools.partial(heads.Pooler, c.hidden_size, std, dtype),
               "mlm": functools.partial(heads.MlmHead, c.vocab_size, c.hidden_size,
                                        c.mlm_act, c.layer_norm_eps, std, dtype)})


@base.register_family("nomic_bert")
class NomicBert(RotaryPostLn):
  """NomicBERT: rotary, SwiGLU, no projection biases, post-LN, BERT's heads."""
  defaults = staticmethod(defaults)
  forward_flops = staticmethod(forward_flops)
