"""MPNet (Song et al. 2020) on the generic encoder: BERT's post-LN layers with learned
absolute positions numbered past the padding index (as RoBERTa), no token types, and one
bucketed relative position bias (`layers.RelativePositionBias`) shared by every layer.

As transformers' MPNet runs it:
- positions are numbered from 2 past padding tokens of id 1 (transformers' fixed
  padding index, whatever `pad_token_id` says); packed rows number each document from 2;
- the bias buckets offsets j - i into 32 buckets (16 per direction, exact below 8,
  log-spaced to 128) whatever `relative_attention_num_buckets` says: that is only the
  table's row count, which must hold the 32 buckets (transformers fails on fewer);
- the MLM head is dense, exact GELU (whatever `hidden_act`), LayerNorm, then the decoder
  tied to the word embeddings with its own bias; MPNetModel has BERT's tanh pooler.
Parameters: BERT's under `embeddings`, `encoder/layer_<i>`, `pooler`, `mlm`, plus the
bias table `position_bias/embedding` (buckets, H).
"""
import functools

import jax.numpy as jnp
import ml_collections

from encoders import base, bert, heads, layers, model, tasks

# transformers' MPNet: its padding index (positions), the buckets and the longest offset
# its bias tells apart (compute_position_bias's fixed arguments).
PADDING_IDX = 1
BUCKETS = 32
MAX_DISTANCE = 128

# Song et al. 2020 (microsoft/mpnet-base): layers, hidden, heads; tiny is the CPU run.
VARIANTS = {
    "tiny": (2, 128, 2),
    "base": (12, 768, 12),
}


def defaults(variant: str = "base") -> ml_collections.ConfigDict:
  """The model section of an MPNet config (HF MPNetConfig's names; the released values)."""
  n_layers, hidden, n_heads = VARIANTS[variant]
  m = ml_collections.ConfigDict()
  m.family = "mpnet"
  m.variant = variant
  m.vocab_size = 30527
  m.hidden_size = hidden
  m.num_hidden_layers = n_layers
  m.num_attention_heads = n_heads
  m.intermediate_size = 4 * hidden
  m.hidden_act = "gelu"
  m.hidden_dropout_prob = 0.1
  m.attention_probs_dropout_prob = 0.1
  m.max_position_embeddings = 514
  m.relative_attention_num_buckets = BUCKETS  # rows of the bias table (>= 32)
  m.layer_norm_eps = 1e-5
  m.pad_token_id = 1
  m.type_vocab_size = 0  # no token types
  m.initializer_range = 0.02
  m.position_init = "normal"  # normal | sinusoidal (bert.defaults)
  m.heads = ("mlm",)  # subset of: pooler, mlm
  m.dtype = "auto"
  m.attention_impl = "auto"
  m.remat_policy = "none"
  m.scan_layers = False
  m.vocab_pad_multiple = 1
  return m


def validate(cfg):
  """Config errors named before anything is built."""
  if cfg.hidden_size % cfg.num_attention_heads:
    raise ValueError(f"hidden_size={cfg.hidden_size} is not a multiple of "
                     f"num_attention_heads={cfg.num_attention_heads}")
  if cfg.relative_attention_num_buckets < BUCKETS:
    raise ValueError(f"relative_attention_num_buckets={cfg.relative_attention_num_buckets}: "
                     f"MPNet buckets relative positions into {BUCKETS} buckets (as "
                     f"transformers does, whatever this says), so its table needs at least "
                     f"{BUCKETS} rows")
  if cfg.max_position_embeddings <= PADDING_IDX + 1:
    raise ValueError(f"max_position_embeddings={cfg.max_position_embeddings} leaves no "
                     f"position past the padding index {PADDING_IDX}")


def forward_flops(cfg, seq_len: int, mlm_positions=None) -> float:
  """Forward FLOPs of one sequence: BERT's layers (`bert.layer_flops`), plus adding the
  shared (H,T,T) bias to every layer's scores, HT^2 each; the pooler and the MLM head over
  its P positions (`bert.head_flops`). The bias lookup itself is a gather, no FLOPs."""
  t, d = seq_len, cfg.hidden_size
  per_layer = bert.layer_flops(t, d, cfg.intermediate_size) + cfg.num_attention_heads * t * t
  return float(cfg.num_hidden_layers * per_layer + bert.head_flops(cfg, t, d, d, mlm_positions))


@base.register_family("mpnet")
class MPNet(model.Encoder):
  """MPNet: BERT's layers and heads, RoBERTa's position numbering, no token types, and a
  relative position bias computed once per forward and added in every layer."""
  defaults = staticmethod(defaults)
  forward_flops = staticmethod(forward_flops)

  @staticmethod
  def task_heads(cfg):
    """transformers' MPNet heads: the sequence head is dense + tanh on <s> (RoBERTa's);
    tokens and spans: one linear layer on each hidden state."""
    return {"pooled": tasks.Head(pooling="cls", act="tanh",
                                 hf={"dense": "classifier.dense",
                                     "out": "classifier.out_proj"}),
            "per_token": tasks.Head(hf={"out": "classifier"}),
            "span": tasks.Head(dropout=0.0, hf={"out": "qa_outputs"})}

  def max_length(self) -> int:
    return self.config.max_position_embeddings - PADDING_IDX - 1

  def position_ids(self, input_ids, segment_ids):
    if segment_ids is None:
      real = (input_ids != PADDING_IDX).astype(jnp.int32)
      return jnp.cumsum(real, axis=1) * real + PADDING_IDX
    return super().position_ids(input_ids, segment_ids) + PADDING_IDX + 1

  def parts(self) -> model.Parts:
    c = self.config
    validate(c)
    dtype = layers.dtype_from_name(c.dtype)
    std = c.initializer_range
    block = bert.post_ln_block(c, dtype)
    return model.Parts(
        embeddings=functools.partial(
            layers.Embeddings, vocab_size=base.padded_vocab_size(c),
            embedding_size=c.hidden_size, max_position_embeddings=c.max_position_embeddings,
            type_vocab_size=0, layer_norm_eps=c.layer_norm_eps,
            dropout_rate=c.hidden_dropout_prob, init_std=std, dtype=dtype,
            position_init=c.get("position_init", "normal")),
        stack=functools.partial(layers.Stack, c.num_hidden_layers, lambda i: block,
                                scan=c.get("scan_layers", False)),
        heads={"pooler": functools.partial(heads.Pooler, c.hidden_size, std, dtype),
               "mlm": functools.partial(heads.MlmHead, c.vocab_size, c.hidden_size, "gelu",
                                        c.layer_norm_eps, std, dtype)},
        position_bias=functools.partial(
            layers.RelativePositionBias, c.num_attention_heads, BUCKETS, MAX_DISTANCE,
            table_size=c.relative_attention_num_buckets, init_std=std))
