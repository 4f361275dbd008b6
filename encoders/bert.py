"""BERT (Devlin et al. 2019) and RoBERTa (Liu et al. 2019) on the generic encoder.

RoBERTa is a configuration: `position_style="roberta"` numbers positions from
pad_token_id + 1, `type_vocab_size=1`, layer_norm_eps=1e-5, no NSP head.
"""
import functools

import jax.numpy as jnp
import ml_collections

from encoders import base, heads, layers, model, tasks


def defaults() -> ml_collections.ConfigDict:
  """The model section of a BERT config; HF's names where they exist. Shared fields of
  every family (dtype, attention_impl, remat_policy, scan_layers, vocab_pad_multiple)
  are documented here once."""
  m = ml_collections.ConfigDict()
  m.family = "bert"
  m.variant = ""
  m.vocab_size = 30522
  m.hidden_size = 768
  m.num_hidden_layers = 12
  m.num_attention_heads = 12
  m.intermediate_size = 3072
  m.hidden_act = "gelu"
  m.hidden_dropout_prob = 0.1
  m.attention_probs_dropout_prob = 0.1
  m.max_position_embeddings = 512
  m.type_vocab_size = 2
  m.layer_norm_eps = 1e-12
  m.pad_token_id = 0
  # RoBERTa numbers positions from pad_token_id + 1 (HF's create_position_ids_from_input_ids).
  m.position_style = "absolute"  # absolute | roberta
  m.initializer_range = 0.02
  # Initial position embeddings: normal (N(0, initializer_range), BERT's) | sinusoidal
  # (the sin/cos table at the same RMS; still a learned parameter, loads in HF as usual)
  m.position_init = "normal"
  m.heads = ("mlm", "nsp")  # subset of: pooler, mlm, nsp
  m.dtype = "auto"  # compute: auto (bf16 on TPU/GPU, f32 on CPU) | float32 | bfloat16
  # auto (layers.choose_impl: cpu on the CPU, splash on TPU when the length allows, cudnn
  # on GPU, else xla) | xla | cudnn (jax.nn.dot_product_attention) |
  # einsum (reference) | cpu (the reference's math laid out for XLA:CPU, ~2x faster there)
  # | splash (Pallas TPU kernel; sequence length a multiple of 128,
  # attention_probs_dropout_prob = 0)
  m.attention_impl = "auto"
  m.remat_policy = "none"  # none | full | dots_saveable | dots_with_no_batch_dims_saveable
  m.scan_layers = False  # nn.scan over layers: params stacked under encoder/layers (L, ...)
  m.vocab_pad_multiple = 1  # >1 pads the embedding table; padded rows are never predicted
  # Shared primitives a BERT switches on by config (no transformers BERT has them, so such a
  # model does not export to a BertModel): grouped-query attention (K/V heads; 0: one per
  # query head), the layers' norm (layernorm | rmsnorm), and a T5-style bucketed relative
  # position bias shared by all layers (buckets, 0: none), as MPNet's.
  m.num_key_value_heads = 0
  m.norm_kind = "layernorm"
  m.relative_attention_num_buckets = 0
  m.relative_attention_max_distance = 128
  return m


def layer_flops(t: int, d: int, f: int, gated: bool = False, kv: int = 0) -> int:
  """One post/pre-LN transformer layer on T tokens: q,k,v,out projections 4 * 2TD^2 (k and
  v 2 * 2TD*kv with grouped-query K/V of width kv = G * K); the full bidirectional T x T
  attention QK^T and probs @ V, 2 * 2T^2D; the MLP 2TDF x 2 (x 3 gated)."""
  kv = kv or d
  return (2 * 2 * t * d * (d + kv) + 2 * 2 * t * t * d
          + 2 * t * d * f * (3 if gated else 2))


def head_flops(cfg, t: int, d: int, e: int, mlm_positions=None) -> int:
  """Pooler 2D^2 (+ the pair classifier 2D*2) once per sequence; the MLM head over the P
  positions it runs on: transform 2PDE + decoder 2PEV (V the real vocabulary)."""
  heads = set(cfg.heads)
  total = 0
  if heads & {"pooler", "nsp", "sop"}:
    total += 2 * d * d + (2 * d * 2 if heads & {"nsp", "sop"} else 0)
  if "mlm" in heads:
    p = t if mlm_positions is None else mlm_positions
    total += p * (2 * d * e + 2 * e * cfg.vocab_size)
  return total


def forward_flops(cfg, seq_len: int, mlm_positions=None) -> float:
  """Forward FLOPs of one sequence (2 per multiply-add; element-wise work not counted)."""
  t, d = seq_len, cfg.hidden_size
  kv = (cfg.get("num_key_value_heads") or cfg.num_attention_heads) * (
      d // cfg.num_attention_heads)
  total = cfg.num_hidden_layers * layer_flops(t, d, cfg.intermediate_size, kv=kv)
  return float(total + head_flops(cfg, t, d, d, mlm_positions))


def attention_factory(c, dtype):
  return functools.partial(
      layers.MultiHeadAttention, num_heads=c.num_attention_heads,
      head_dim=c.hidden_size // c.num_attention_heads, hidden_size=c.hidden_size,
      dropout_rate=c.attention_probs_dropout_prob, impl=c.attention_impl,
      init_std=c.initializer_range, dtype=dtype,
      num_kv_heads=c.get("num_key_value_heads") or None)  # GQA: a config change


def post_ln_block(c, dtype):
  """BERT's post-LN layer (also ALBERT's): a block factory."""
  mlp = functools.partial(layers.Mlp, c.intermediate_size, c.hidden_size, c.hidden_act,
                          init_std=c.initializer_range, dtype=dtype)
  kind = c.get("norm_kind", "layernorm")
  norm = layers.make_norm(kind, c.layer_norm_eps, use_bias=kind == "layernorm", dtype=dtype)
  block_cls = layers.remat_block(layers.EncoderBlock, c.remat_policy)
  return functools.partial(block_cls, attention_factory(c, dtype), mlp, norm,
                           dropout_rate=c.hidden_dropout_prob)


@base.register_family("bert")
class Bert(model.Encoder):
  """BERT / RoBERTa: learned absolute positions, token types, post-LN GELU layers, MLM
  head tied to the word embeddings, NSP on the tanh pooler."""
  defaults = staticmethod(defaults)
  forward_flops = staticmethod(forward_flops)

  @staticmethod
  def task_heads(cfg):
    """BERT classifies its tanh pooler output; RoBERTa's head is its own dense + tanh on
    <s>. Tokens and spans: one linear layer on each hidden state."""
    pooled = (tasks.Head(pooling="cls", act="tanh", hf={"dense": "classifier.dense",
                                                        "out": "classifier.out_proj"})
              if cfg.get("position_style") == "roberta"
              else tasks.Head(pooling="pooler", hf={"out": "classifier"}))
    return {"pooled": pooled, "per_token": tasks.Head(hf={"out": "classifier"}),
            "span": tasks.Head(dropout=0.0, hf={"out": "qa_outputs"})}

  def position_offset(self) -> int:
    return self.config.pad_token_id + 1 if self.config.position_style == "roberta" else 0

  def max_length(self) -> int:
    return self.config.max_position_embeddings - self.position_offset()

  def position_ids(self, input_ids, segment_ids):
    c = self.config
    if segment_ids is None and c.position_style == "roberta":
      # HF's create_position_ids_from_input_ids: pads sit at pad_token_id.
      real = (input_ids != c.pad_token_id).astype(jnp.int32)
      return jnp.cumsum(real, axis=1) * real + c.pad_token_id
    return super().position_ids(input_ids, segment_ids) + self.position_offset()

  def parts(self) -> model.Parts:
    c = self.config
    dtype = layers.dtype_from_name(c.dtype)
    std = c.initializer_range
    block = post_ln_block(c, dtype)
    return model.Parts(
        embeddings=functools.partial(
            layers.Embeddings, vocab_size=base.padded_vocab_size(c),
            embedding_size=c.hidden_size, max_position_embeddings=c.max_position_embeddings,
            type_vocab_size=c.type_vocab_size, layer_norm_eps=c.layer_norm_eps,
            dropout_rate=c.hidden_dropout_prob, init_std=std, dtype=dtype,
            position_init=c.get("position_init", "normal")),
        stack=functools.partial(layers.Stack, c.num_hidden_layers, lambda i: block,
                                scan=c.get("scan_layers", False)),
        heads={"pooler": functools.partial(heads.Pooler, c.hidden_size, std, dtype),
               "mlm": functools.partial(heads.MlmHead, c.vocab_size, c.hidden_size,
                                        c.hidden_act, c.layer_norm_eps, std, dtype),
               "nsp": functools.partial(heads.Classifier, 2, std, dtype)},
        position_bias=functools.partial(
            layers.RelativePositionBias, c.num_attention_heads,
            c.relative_attention_num_buckets, c.get("relative_attention_max_distance", 128),
            init_std=std) if c.get("relative_attention_num_buckets") else None)
