"""ModernBERT (Warner et al. 2024) on the generic encoder.

What differs from BERT, and where it lives here:
- no learned positions: rotary q/k with theta `global_rope_theta` (160k) in global layers
  and `local_rope_theta` (10k) in local ones; positions restart per packed document;
- pre-LN with no biases (`attention_bias`, `mlp_bias`, `norm_bias` all False in the
  released models), a LayerNorm on the embeddings and a final norm after the stack; the
  first layer has no attention norm (the embedding norm precedes it);
- a GeGLU MLP (`Mlp(gated=True)`: act(x W_a) * (x W_g), one fused `wi` kernel);
- layer i attends globally when i % global_attn_every_n_layers == 0, else within a
  sliding window of `local_attention` tokens (|i - j| <= local_attention // 2);
- the MLM head: dense (bias `classifier_bias`), activation, LayerNorm, then the decoder
  tied to the word embeddings with a bias (`decoder_bias`).

Layer 0 (global, no attention norm) runs on its own as `encoder/layer_0`; with
`scan_layers` the remaining L - 1 layers are one `layers.Stack` scanned over their period
(local, ..., local, global) under `encoder/body` (7 iterations for base's 22 layers), the
per-layer import/export layout converted by `scan_params` / `unscan_params`.
Packed rows (segment ids) never attend across documents, in global or local layers.
"""
import functools
from typing import Callable

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from encoders import base, layers, model, tasks

# Warner et al. 2024, Table 3 (and the released configs): layers, hidden, heads, MLP width.
VARIANTS = {
    "tiny": (4, 128, 2, 192),
    "base": (22, 768, 12, 1152),
    "large": (28, 1024, 16, 2624),
}


def defaults(variant: str = "base") -> ml_collections.ConfigDict:
  """The model section of a ModernBERT config (HF ModernBertConfig's names)."""
  n_layers, hidden, n_heads, ffn = VARIANTS[variant]
  m = ml_collections.ConfigDict()
  m.family = "modernbert"
  m.variant = variant
  m.vocab_size = 50368
  m.hidden_size = hidden
  m.num_hidden_layers = n_layers
  m.num_attention_heads = n_heads
  m.intermediate_size = ffn
  m.hidden_activation = "gelu"
  m.max_position_embeddings = 8192
  m.initializer_range = 0.02
  m.norm_eps = 1e-5
  m.norm_bias = False
  m.pad_token_id = 50283
  m.global_rope_theta = 160_000.0
  m.local_rope_theta = 10_000.0
  m.global_attn_every_n_layers = 3
  m.local_attention = 128  # window width; a query sees keys within local_attention // 2
  m.attention_bias = False
  m.mlp_bias = False
  m.decoder_bias = True
  m.classifier_bias = False
  m.classifier_activation = "gelu"
  m.classifier_pooling = "cls"  # task heads: cls | mean (sequence classification)
  m.classifier_dropout = 0.0
  # Dropout: ModernBERT trains without it. Embedding dropout is implemented; HF's
  # attention_dropout (probabilities and attention output) and mlp_dropout (inside the MLP)
  # must stay 0 here (a ValueError otherwise).
  m.embedding_dropout = 0.0
  m.attention_dropout = 0.0
  m.mlp_dropout = 0.0
  m.type_vocab_size = 0  # no token types
  m.heads = ("mlm",)  # subset of: mlm
  m.dtype = "auto"
  m.attention_impl = "auto"
  m.remat_policy = "none"
  m.scan_layers = False
  m.vocab_pad_multiple = 1
  return m


def is_global(cfg, i: int) -> bool:
  """Whether layer i attends globally (HF's layer_types: i % n == 0)."""
  return i % cfg.global_attn_every_n_layers == 0


def layer_types(cfg):
  """HF's `layer_types` list for this config."""
  return ["full_attention" if is_global(cfg, i) else "sliding_attention"
          for i in range(cfg.num_hidden_layers)]


def attended_keys(cfg, i: int, t: int) -> int:
  """Keys a query of layer i attends (away from the edges) in a T-token sequence."""
  return t if is_global(cfg, i) else min(t, 2 * (cfg.local_attention // 2) + 1)


def forward_flops(cfg, seq_len: int, mlm_positions=None) -> float:
  """Forward FLOPs of one sequence (2 per multiply-add): per layer the fused qkv and out
  projections 4 * 2TD^2, attention QK^T and probs @ V 2 * 2TSD with S the attended keys
  (T in global layers, local_attention + 1 in local ones: windowed work is counted as
  windowed), the GeGLU MLP 3 * 2TDF; the MLM head over its P positions: 2PD^2 + 2PDV."""
  t, d, f = seq_len, cfg.hidden_size, cfg.intermediate_size
  total = 0
  for i in range(cfg.num_hidden_layers):
    total += 8 * t * d * d + 4 * t * attended_keys(cfg, i, t) * d + 6 * t * d * f
  if "mlm" in cfg.heads:
    p = t if mlm_positions is None else mlm_positions
    total += p * (2 * d * d + 2 * d * cfg.vocab_size)
  return float(total)


def validate(cfg):
  """Config errors named before anything is built."""
  if cfg.hidden_size % cfg.num_attention_heads:
    raise ValueError(f"hidden_size={cfg.hidden_size} is not a multiple of "
                     f"num_attention_heads={cfg.num_attention_heads}")
  if (cfg.hidden_size // cfg.num_attention_heads) % 2:
    raise ValueError("rotary attention needs an even head dim")
  if cfg.pad_token_id is not None and not 0 <= cfg.pad_token_id < cfg.vocab_size:
    raise ValueError(f"pad_token_id={cfg.pad_token_id} is outside the vocabulary "
                     f"(vocab_size={cfg.vocab_size})")
  if cfg.global_attn_every_n_layers < 1:
    raise ValueError("global_attn_every_n_layers must be >= 1")
  if cfg.local_attention < 2 or cfg.local_attention % 2:
    raise ValueError(f"local_attention={cfg.local_attention} must be an even window >= 2")
  if cfg.get("classifier_pooling", "cls") not in ("cls", "mean"):
    raise ValueError(f"classifier_pooling={cfg.classifier_pooling!r}: cls or mean")
  for name in ("attention_dropout", "mlp_dropout"):
    if cfg.get(name, 0.0):
      raise ValueError(f"{name}={cfg[name]} is not implemented for ModernBERT (it trains "
                       "without dropout); set it to 0")


class MlmHead(nn.Module):
  """ModernBERT's prediction head: (..., D) -> (..., V) = decode(LN(act(dense(x)))) + b."""
  vocab_size: int
  hidden_size: int
  act: str
  dense_bias: bool
  norm_eps: float
  norm_bias: bool
  decoder_bias: bool
  init_std: float = 0.02
  dtype: layers.Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, decode: Callable):
    h = layers.Dense((self.hidden_size,), ("embed", "mlp"), self.dense_bias, self.init_std,
                     self.dtype, name="transform")(x)
    h = layers.constrain(h, ("act_batch", "act_len", "act_embed"))
    h = layers.activation(self.act)(h)
    h = layers.LayerNorm(self.norm_eps, self.norm_bias, self.dtype, name="norm")(h)
    logits = decode(h)
    if self.decoder_bias:
      bias = self.param("bias", layers.zeros_init(("vocab",)), (logits.shape[-1],),
                        jnp.float32)
      logits = logits + bias.astype(logits.dtype)
    # as heads.MlmHead: the float32 logits' cotangent is rounded to the compute dtype once
    return layers.round_cotangent(logits[..., :self.vocab_size], self.dtype)


class LayerStack(nn.Module):
  """Layer 0 (`layer_0`), then layers 1..L-1: unscanned as `layer_<i>`, or with `scan` as
  a `layers.Stack` named `body` scanned over the period of `global_attn_every_n_layers`."""
  num_layers: int
  block: Callable[[int], Callable[..., nn.Module]]
  period: int
  scan: bool = False

  @nn.compact
  def __call__(self, x, inputs: layers.AttentionInputs, deterministic: bool = True):
    x = self.block(0)(name="layer_0")(x, inputs, deterministic)
    if not self.scan:
      for i in range(1, self.num_layers):
        x = self.block(i)(name=f"layer_{i}")(layers.cotangent_barrier(x), inputs,
                                             deterministic)
      return x
    body = layers.Stack(self.num_layers - 1, lambda j: self.block(j + 1), scan=True,
                        period=self.period, name="body")
    return body(x, inputs, deterministic)


@base.register_family("modernbert")
class ModernBert(model.Encoder):
  """ModernBERT: rotary, pre-LN without biases, GeGLU, alternating global and sliding-
  window attention, final norm, MLM head tied to the embeddings."""
  defaults = staticmethod(defaults)
  forward_flops = staticmethod(forward_flops)

  @staticmethod
  def task_heads(cfg):
    """transformers' ModernBertFor*: [cls or mean pooling] -> the prediction head
    (head.dense with `classifier_bias`, `classifier_activation`, head.norm) -> dropout ->
    classifier, for every kind."""
    def head(pooling="cls"):
      return tasks.Head(pooling=pooling, act=cfg.classifier_activation, norm=True,
                        norm_bias=cfg.norm_bias, norm_eps=cfg.norm_eps,
                        dropout=cfg.get("classifier_dropout", 0.0),
                        dense_bias=cfg.classifier_bias, pre_dropout=False,
                        hf={"dense": "head.dense", "norm": "head.norm", "out": "classifier"})
    return {"pooled": head(cfg.get("classifier_pooling", "cls")), "per_token": head(),
            "span": head()}

  @staticmethod
  def scan_params(cfg, params):
    if not cfg.get("scan_layers", False):
      return params
    return _restack(params, cfg, stack=True)

  @staticmethod
  def unscan_params(cfg, params):
    if not cfg.get("scan_layers", False):
      return params
    return _restack(params, cfg, stack=False)

  def attention_inputs(self, attention_mask, segment_ids, position_ids):
    c = self.config
    w = c.local_attention
    if c.attention_impl in ("splash", "xla", "cudnn", "auto"):
      # segment ids: splash never builds a (T,T) mask; dot_product_attention gets the
      # window as local_window_size
      mask = layers.segment_mask(attention_mask, segment_ids)
      local = layers.SegmentMask(mask.segment_ids, local_window=w)
    else:
      mask = layers.make_attention_mask(attention_mask, segment_ids)
      local = layers.make_attention_mask(attention_mask, segment_ids, local_window=w)
    return layers.AttentionInputs(mask=mask, local_mask=local, positions=position_ids)

  def parts(self) -> model.Parts:
    c = self.config
    validate(c)
    dtype = layers.dtype_from_name(c.dtype)
    std = c.initializer_range
    norm = functools.partial(layers.LayerNorm, c.norm_eps, c.norm_bias, dtype=dtype)
    mlp = functools.partial(layers.Mlp, c.intermediate_size, c.hidden_size,
                            c.hidden_activation, gated=True, use_bias=c.mlp_bias,
                            init_std=std, dtype=dtype)
    block_cls = layers.remat_block(layers.EncoderBlock, c.remat_policy)

    def block(i):
      glob = is_global(c, i)
      attention = functools.partial(
          layers.MultiHeadAttention, num_heads=c.num_attention_heads,
          head_dim=c.hidden_size // c.num_attention_heads, hidden_size=c.hidden_size,
          use_bias=c.attention_bias,
          rope_theta=c.global_rope_theta if glob else c.local_rope_theta,
          mask_kind="global" if glob else "local", impl=c.attention_impl, init_std=std,
          dtype=dtype)
      return functools.partial(block_cls, attention, mlp, norm, pre_norm=True,
                               attention_norm=i > 0)

    heads = {"mlm": functools.partial(
        MlmHead, c.vocab_size, c.hidden_size, c.classifier_activation, c.classifier_bias,
        c.norm_eps, c.norm_bias, c.decoder_bias, std, dtype)}
    return model.Parts(
        embeddings=functools.partial(
            layers.Embeddings, vocab_size=base.padded_vocab_size(c),
            embedding_size=c.hidden_size, layer_norm_eps=c.norm_eps, norm_bias=c.norm_bias,
            dropout_rate=c.embedding_dropout, init_std=std, dtype=dtype),
        stack=functools.partial(LayerStack, c.num_hidden_layers, block,
                                c.global_attn_every_n_layers, c.get("scan_layers", False)),
        final_norm=norm,
        heads=heads)


def _restack(params: dict, cfg, stack: bool) -> dict:
  """Per-layer `encoder/layer_<i>` <-> `encoder/layer_0` + `encoder/body/...` (scanned)."""
  n, p = cfg.num_hidden_layers, cfg.global_attn_every_n_layers
  out = dict(params)
  enc = dict(out["encoder"])
  if stack:
    rest = {f"layer_{i - 1}": enc.pop(f"layer_{i}") for i in range(1, n)}
    enc["body"] = layers.stack_layer_params(rest, n - 1, p)
  else:
    body = layers.unstack_layer_params(enc.pop("body"), p)
    enc.update({f"layer_{i + 1}": v for i, v in
                ((int(k.split("_")[1]), v) for k, v in body.items())})
  out["encoder"] = enc
  return out
