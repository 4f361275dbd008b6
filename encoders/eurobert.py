"""EuroBERT (Boizard et al. 2025) on the generic encoder: a Llama-style encoder.

What differs from BERT, and where it lives here:
- token embeddings only (no positions, types or embedding norm); rotary q/k with theta
  `rope_theta` (250k in the released configs) at positions restarting per packed document;
- pre-norm layers with RMSNorm (`norm_kind`, `layers.make_norm`), and a final norm;
- grouped-query attention: `num_key_value_heads` K/V heads (610m and 2.1b: 6 for 18 query
  heads), passed to every kernel as they are (`layers.MultiHeadAttention(num_kv_heads=)`);
- a SwiGLU MLP, silu(x W_gate) * (x W_up) W_down (`Mlp(gated=True)`, one fused `wi`);
- no biases (`attention_bias`, `mlp_bias`);
- the MLM head is one untied linear map (`lm_head`, bias iff `mlp_bias`).
Task heads (transformers' EuroBertFor*): sequence classification is dense + GELU +
classifier after `classifier_pooling` (bos: the first token, mean), or before it (late:
per token, the logits averaged); token classification is one linear layer per token.
"""
import functools

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from encoders import base, layers, model, tasks

# The released configs (EuroBERT-210m, -610m, -2.1B on the Hugging Face hub; Boizard et al.
# 2025, Table 1): layers, hidden, heads, K/V heads, MLP width. tiny: the CPU run.
VARIANTS = {
    "tiny": (4, 128, 4, 2, 344),
    "210m": (12, 768, 12, 12, 3072),
    "610m": (26, 1152, 18, 6, 4096),
    "2.1b": (32, 2304, 18, 6, 6144),
}
POOLINGS = ("bos", "mean", "late")


def defaults(variant: str = "210m") -> ml_collections.ConfigDict:
  """The model section of a EuroBERT config (HF EuroBertConfig's names)."""
  n_layers, hidden, n_heads, kv_heads, ffn = VARIANTS[variant]
  m = ml_collections.ConfigDict()
  m.family = "eurobert"
  m.variant = variant
  m.vocab_size = 128256  # Llama-3's vocabulary
  m.hidden_size = hidden
  m.num_hidden_layers = n_layers
  m.num_attention_heads = n_heads
  m.num_key_value_heads = kv_heads
  m.head_dim = 0  # 0: hidden_size // num_attention_heads
  m.intermediate_size = ffn
  m.hidden_act = "silu"
  m.max_position_embeddings = 8192
  m.initializer_range = 0.02
  m.norm_kind = "rmsnorm"  # layers.NORM_KINDS
  m.rms_norm_eps = 1e-5
  m.pad_token_id = 128001
  m.bos_token_id = 128000
  m.eos_token_id = 128001
  m.mask_token_id = 128002
  m.rope_theta = 250_000.0
  m.attention_bias = False
  m.mlp_bias = False
  m.attention_dropout = 0.0  # must stay 0 (EuroBERT trains without dropout)
  m.classifier_pooling = "late"  # bos | mean | late (sequence classification)
  m.type_vocab_size = 0  # no token types
  m.heads = ("mlm",)  # subset of: mlm
  m.dtype = "auto"
  m.attention_impl = "auto"
  m.remat_policy = "none"
  m.scan_layers = False
  m.vocab_pad_multiple = 1
  return m


def head_dim(cfg) -> int:
  return cfg.get("head_dim") or cfg.hidden_size // cfg.num_attention_heads


def kv_heads(cfg) -> int:
  return cfg.get("num_key_value_heads") or cfg.num_attention_heads


def forward_flops(cfg, seq_len: int, mlm_positions=None) -> float:
  """Forward FLOPs of one sequence (2 per multiply-add): per layer the q and out
  projections 2 * 2TDHK, k and v 2 * 2TDGK (G K/V heads), attention QK^T and probs @ V
  2 * 2T^2HK over the full bidirectional square, the SwiGLU MLP 3 * 2TDF; the MLM head
  over its P positions 2PDV."""
  t, d, f = seq_len, cfg.hidden_size, cfg.intermediate_size
  q_width, kv_width = cfg.num_attention_heads * head_dim(cfg), kv_heads(cfg) * head_dim(cfg)
  layer = 4 * t * d * (q_width + kv_width) + 4 * t * t * q_width + 6 * t * d * f
  total = cfg.num_hidden_layers * layer
  if "mlm" in cfg.heads:
    p = t if mlm_positions is None else mlm_positions
    total += 2 * p * d * cfg.vocab_size
  return float(total)


def validate(cfg):
  """Config errors named before anything is built."""
  if cfg.hidden_size % cfg.num_attention_heads:
    raise ValueError(f"hidden_size={cfg.hidden_size} is not a multiple of "
                     f"num_attention_heads={cfg.num_attention_heads}")
  if cfg.num_attention_heads % kv_heads(cfg):
    raise ValueError(f"num_attention_heads={cfg.num_attention_heads} is not a multiple of "
                     f"num_key_value_heads={kv_heads(cfg)}")
  if head_dim(cfg) % 2:
    raise ValueError(f"rotary attention needs an even head dim, got {head_dim(cfg)}")
  if cfg.get("classifier_pooling", "late") not in POOLINGS:
    raise ValueError(f"classifier_pooling={cfg.classifier_pooling!r}: one of {POOLINGS}")
  if cfg.get("attention_dropout", 0.0):
    raise ValueError(f"attention_dropout={cfg.attention_dropout} is not implemented for "
                     "EuroBERT (it trains without dropout); set it to 0")
  if cfg.pad_token_id is not None and not 0 <= cfg.pad_token_id < cfg.vocab_size:
    raise ValueError(f"pad_token_id={cfg.pad_token_id} is outside the vocabulary "
                     f"(vocab_size={cfg.vocab_size})")


class LmHead(nn.Module):
  """EuroBERT's MLM head: (..., D) -> (..., V) float32 logits of one untied linear map
  (operands in the compute dtype, float32 accumulation), bias when `use_bias`."""
  vocab_size: int
  padded_vocab: int
  use_bias: bool = False
  init_std: float = 0.02
  dtype: layers.Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, decode=None):
    del decode  # untied: EuroBERT's lm_head is not the embedding table
    kernel = self.param("kernel", layers.normal_init(self.init_std, ("embed", "vocab")),
                        (x.shape[-1], self.padded_vocab), jnp.float32)
    logits = jnp.einsum("...d,dv->...v", x.astype(self.dtype), kernel.astype(self.dtype),
                        preferred_element_type=jnp.float32)
    if self.use_bias:
      logits = logits + self.param("bias", layers.zeros_init(("vocab",)),
                                   (self.padded_vocab,), jnp.float32)
    # as heads.MlmHead: the float32 logits' cotangent is rounded to the compute dtype once
    return layers.round_cotangent(logits[..., :self.vocab_size], self.dtype)


@base.register_family("eurobert")
class EuroBert(model.Encoder):
  """EuroBERT: rotary, pre-norm RMSNorm without biases, grouped-query attention, SwiGLU,
  final norm, an untied MLM head."""
  defaults = staticmethod(defaults)
  forward_flops = staticmethod(forward_flops)

  @staticmethod
  def task_heads(cfg):
    """transformers' EuroBertForSequenceClassification: [bos or mean pooling] -> dense
    (with bias) -> GELU -> classifier, no dropout; with "late" pooling (its default) the
    head runs on every token and its logits are averaged over real tokens.
    EuroBertForTokenClassification: one linear layer per token."""
    pooling = {"bos": "cls"}.get(cfg.get("classifier_pooling", "late"),
                                 cfg.get("classifier_pooling", "late"))
    return {"pooled": tasks.Head(pooling=pooling, act="gelu", dropout=0.0,
                                 hf={"dense": "dense", "out": "classifier"}),
            "per_token": tasks.Head(dropout=0.0, hf={"out": "classifier"})}

  def parts(self) -> model.Parts:
    c = self.config
    validate(c)
    dtype = layers.dtype_from_name(c.dtype)
    std = c.initializer_range
    norm = layers.make_norm(c.get("norm_kind", "rmsnorm"), c.rms_norm_eps, False, dtype)
    mlp = functools.partial(layers.Mlp, c.intermediate_size, c.hidden_size, c.hidden_act,
                            gated=True, use_bias=c.mlp_bias, init_std=std, dtype=dtype)
    attention = functools.partial(
        layers.MultiHeadAttention, num_heads=c.num_attention_heads, head_dim=head_dim(c),
        hidden_size=c.hidden_size, num_kv_heads=kv_heads(c), use_bias=c.attention_bias,
        rope_theta=c.rope_theta, impl=c.attention_impl, init_std=std, dtype=dtype)
    block = functools.partial(layers.remat_block(layers.EncoderBlock, c.remat_policy),
                              attention, mlp, norm, pre_norm=True)
    return model.Parts(
        embeddings=functools.partial(
            layers.Embeddings, vocab_size=base.padded_vocab_size(c),
            embedding_size=c.hidden_size, use_norm=False, init_std=std, dtype=dtype),
        stack=functools.partial(layers.Stack, c.num_hidden_layers, lambda i: block,
                                scan=c.get("scan_layers", False)),
        final_norm=norm,
        heads={"mlm": functools.partial(LmHead, c.vocab_size, base.padded_vocab_size(c),
                                        c.mlp_bias, std, dtype)})
