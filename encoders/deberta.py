"""DeBERTa v1, v2 and v3 (He et al. 2021; He, Gao and Chen 2023) on the generic encoder:
transformers' `DebertaV2*` behaviour (family "deberta-v2") and `Deberta*` (family
"deberta", v1: the end of this docstring).

- Disentangled attention (`layers.DisentangledAttention`): content-to-content plus the
  c2p / p2c relative terms named in `pos_att_type`, scores scaled by
  1/sqrt(K * (1 + number of terms)); relative distances in log buckets
  (`position_buckets`, `max_relative_positions`); one relative-embedding table shared by
  all layers (top-level `rel_embeddings`, LayerNorm-ed when `norm_rel_ebd="layer_norm"`),
  projected by each layer's own key/query (`share_att_key`, v3) or by separate
  `pos_key`/`pos_query` projections (v2). `relative_impl` picks the formulation of the
  relative terms: "auto" (the default: "fused" on TPU when it can, else "shift"), "fused"
  (one Pallas kernel with the terms computed inside a flash-attention loop: TPU),
  "shift" (`relative_block` rows at a time), "headmajor", or "gather" (transformers'
  reference math).
- Embeddings: word (+ absolute positions when `position_biased_input`, v2) (+ token types
  when `type_vocab_size` > 0), projected E -> D without bias when they differ, then
  LayerNorm over D.
- v2's convolution after the first layer (`conv_kernel_size` > 0): conv over the
  embedding output, masked, `conv_act`, added to the first layer's output, LayerNorm.
  Taps never cross padding or (packed rows) a document boundary.
- MLM head: BERT's (transform D -> E, act, LayerNorm, tied decoder + bias): transformers'
  legacy `cls.predictions` names or, with `legacy=False`, `lm_predictions.lm_head`.
- "pooler": DeBERTa's ContextPooler (dense + `pooler_hidden_act` on the first token).
- Enhanced mask decoder (`enhanced_mask_decoder`, the DeBERTa paper's Section 3.3 and
  its released pretraining code; transformers has none, so models loaded from HF start
  with it off): the MLM head decodes, instead of the last layer's output, two more passes
  of the last layer (its parameters) whose keys and values are the input of that layer and
  whose queries start as that input plus absolute position embeddings (a table of its own,
  `emd_positions`; HF files carry it as `embeddings.position_embeddings.weight`), then
  each pass's output. It gives the absolute positions a model without them in its input
  (`position_biased_input=False`) sees nowhere else.

Padding: transformers masks every key of a padding query (its softmax is then uniform);
here a padding query attends the real keys (layers.make_attention_mask). Outputs at real
positions are identical; outputs at padding positions are not meaningful in either.

DeBERTa v1 (microsoft/deberta-base, -large, -xlarge) is the v2 model without its later
additions: no log buckets (distances clip at `max_relative_positions`), no LayerNorm on
the relative table, no shared attention keys, no convolution, a 50k BPE vocabulary. Its
attention differs in two biases: the key projection has none (transformers' fused
`in_proj` has none, and only `q_bias` / `v_bias` are added), and neither does `pos_key`
(its `pos_proj`). Everything else (the c2p / p2c terms, their scaling, the embeddings, the
MLM heads, the ContextPooler) is the same math as v2's, so v1 reuses this family's parts.
"""
import functools
from typing import Callable

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from encoders import base, bert, heads, layers, model, tasks
from encoders.layers import relative

# v3 sizes (the released microsoft/deberta-v3-* configs): layers, hidden, heads, MLP width.
VARIANTS = {
    "tiny": (2, 128, 2, 512),
    "xsmall": (12, 384, 6, 1536),
    "small": (6, 768, 12, 3072),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


def _size(m, family: str, variant: str, sizes, vocab_size: int):
  """Sets the family, variant, vocabulary and (layers, hidden, heads, MLP width)."""
  m.family, m.variant, m.vocab_size = family, variant, vocab_size
  (m.num_hidden_layers, m.hidden_size, m.num_attention_heads,
   m.intermediate_size) = sizes
  m.embedding_size = m.hidden_size
  return m


def defaults(variant: str = "base") -> ml_collections.ConfigDict:
  """The model section of a DeBERTa-v3 config (HF DebertaV2Config's names)."""
  # family: the HF model_type, as every family
  m = _size(bert.defaults(), "deberta-v2", variant, VARIANTS[variant], 128100)
  m.type_vocab_size = 0
  m.layer_norm_eps = 1e-7
  m.relative_attention = True
  m.max_relative_positions = -1  # < 1: max_position_embeddings
  m.position_buckets = 256  # <= 0: no buckets (span max_relative_positions)
  m.pos_att_type = ("p2c", "c2p")
  m.share_att_key = True
  m.norm_rel_ebd = "layer_norm"  # layer_norm | none
  m.position_biased_input = False
  m.conv_kernel_size = 0  # > 0: v2's convolution after the first layer
  m.conv_act = "tanh"
  m.legacy = True  # MLM head names: cls.predictions (True) | lm_predictions.lm_head
  m.pooler_hidden_act = "gelu"
  m.enhanced_mask_decoder = False  # the MLM recipes (configs/deberta.py) turn it on
  # auto (relative.choose_impl: the fused Pallas kernel on TPU when the length is a
  # multiple of 128 and attention dropout is 0, else shift) | shift | gather (the
  # reference) | headmajor (the shift inside a head-major attention) | fused
  m.relative_impl = "auto"
  # shift: rows in blocks of this many (when it divides T) multiply only the T + C - 1
  # relative rows they use instead of 2T - 1 (0: no blocks)
  # 64: XLA's TPU cost model prices one v3-base layer (batch 32 x 512, v5p) at 10.20 ms
  # with blocks of 64 and 11.25 ms with 128 (docs/deberta.md, formulations table)
  m.relative_block = 64
  m.heads = ("mlm",)  # subset of: pooler, mlm
  del m["position_style"]
  return m


# v1 sizes (the released microsoft/deberta-* configs): layers, hidden, heads, MLP width.
V1_VARIANTS = {
    "tiny": (2, 128, 2, 512),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
    "xlarge": (48, 1024, 16, 4096),
}


def defaults_v1(variant: str = "base") -> ml_collections.ConfigDict:
  """The model section of a DeBERTa v1 config (HF DebertaConfig's names; the values of
  microsoft/deberta-base's config.json at the released sizes)."""
  m = _size(defaults("base"), "deberta", variant, V1_VARIANTS[variant], 50265)
  m.position_buckets = -1
  m.pos_att_type = ("c2p", "p2c")
  m.share_att_key = False
  m.norm_rel_ebd = "none"
  return m


def max_relative(cfg) -> int:
  return cfg.max_relative_positions if cfg.max_relative_positions >= 1 else \
      cfg.max_position_embeddings


def span(cfg) -> int:
  """S: the relative table has 2S rows."""
  return cfg.position_buckets if cfg.position_buckets > 0 else max_relative(cfg)


def validate(cfg):
  unknown = set(cfg.pos_att_type) - set(relative.TERMS)
  if unknown:
    raise ValueError(f"pos_att_type has {sorted(unknown)}; DeBERTa knows {relative.TERMS}")
  if cfg.norm_rel_ebd not in ("layer_norm", "none"):
    raise ValueError(f"norm_rel_ebd={cfg.norm_rel_ebd!r}; use 'layer_norm' or 'none'")
  if cfg.relative_impl not in relative.REL_IMPLS + ("auto",):
    raise ValueError(f"relative_impl={cfg.relative_impl!r}; use one of "
                     f"{relative.REL_IMPLS + ('auto',)}")
  if cfg.hidden_size % cfg.num_attention_heads:
    raise ValueError("hidden_size must be a multiple of num_attention_heads")
  if cfg.conv_kernel_size > 0 and cfg.conv_kernel_size % 2 == 0:
    raise ValueError(f"conv_kernel_size={cfg.conv_kernel_size} must be odd (same padding)")
  if cfg.get("family") == "deberta":
    v2_only = {"position_buckets": cfg.position_buckets > 0,
               "share_att_key": bool(cfg.share_att_key),
               "norm_rel_ebd": cfg.norm_rel_ebd != "none",
               "conv_kernel_size": cfg.conv_kernel_size > 0}
    used = sorted(k for k, on in v2_only.items() if on)
    if used:
      raise ValueError(f"DeBERTa v1 (family 'deberta') has no {used}: those are DeBERTa "
                       "v2/v3 features (family 'deberta-v2')")
  if cfg.get("enhanced_mask_decoder", False):
    needs = {"position_biased_input=False (it adds the absolute positions the input lacks)":
             not cfg.position_biased_input,
             "embedding_size == hidden_size": cfg.embedding_size == cfg.hidden_size,
             "at least 2 layers": cfg.num_hidden_layers >= 2,
             "the mlm head": "mlm" in tuple(cfg.heads),
             "scan_layers=False (it runs the last layer again)":
             not cfg.get("scan_layers", False)}
    unmet = [k for k, ok in needs.items() if not ok]
    if unmet:
      raise ValueError(f"enhanced_mask_decoder=True needs {'; '.join(unmet)}")
  if cfg.conv_kernel_size > 0 and cfg.get("scan_layers", False):
    raise ValueError("scan_layers needs identical layers; DeBERTa v2's convolution makes the "
                     "first layer differ (set conv_kernel_size=0 or scan_layers=False)")


def relative_flops(cfg, t: int) -> int:
  """Per layer and sequence: each relative term multiplies T queries (or keys) by the
  distinct relative rows a sequence uses, min(2S, 2T - 1), over D. The projections of the
  relative table are per batch, not per sequence, and are not counted."""
  if not cfg.relative_attention:
    return 0
  rows = min(2 * span(cfg), 2 * t - 1)
  return len(cfg.pos_att_type) * 2 * t * rows * cfg.hidden_size


def forward_flops(cfg, seq_len: int, mlm_positions=None) -> float:
  """Embedding projection (E != D), L BERT layers plus the relative terms, v2's
  convolution (2 T D^2 per tap), the pooler and the MLM head over its positions; with the
  enhanced mask decoder its two passes, less the last layer's own when only the MLM head
  reads the hidden states."""
  t, d, e = seq_len, cfg.hidden_size, cfg.embedding_size
  total = cfg.num_hidden_layers * (bert.layer_flops(t, d, cfg.intermediate_size)
                                   + relative_flops(cfg, t))
  if e != d:
    total += 2 * t * e * d
  if cfg.conv_kernel_size > 0:
    total += 2 * t * d * d * cfg.conv_kernel_size
  if cfg.get("enhanced_mask_decoder", False) and "mlm" in tuple(cfg.heads):
    # two more passes of the last layer over all T positions; when the MLM head is the only
    # reader of the hidden states, the last layer's own pass feeds nothing (XLA drops it
    # from a training step), so it is not counted
    layer = bert.layer_flops(t, d, cfg.intermediate_size) + relative_flops(cfg, t)
    total += (EMD_STEPS - (set(cfg.heads) == {"mlm"})) * layer
  return float(total + bert.head_flops(cfg, t, d, e, mlm_positions))


EMD_STEPS = 2  # passes of the enhanced mask decoder (the released pretraining code's)


class EmdStack(nn.Module):
  """The layer stack with the enhanced mask decoder: x (B,T,D), inputs -> (last hidden
  state, the decoder's output). The decoder reruns the last layer (`layer_{L-1}`) on the
  stream entering it, with queries `inputs.extra["emd_positions"]` + that stream, then the
  previous pass's output, `steps` times (keys, values and masks unchanged)."""
  num_layers: int
  block: Callable[[int], Callable[..., nn.Module]]
  steps: int = EMD_STEPS

  @nn.compact
  def __call__(self, x, inputs: layers.AttentionInputs, deterministic: bool = True):
    blocks = [self.block(i)(name=f"layer_{i}") for i in range(self.num_layers)]
    for block in blocks[:-1]:
      x = block(layers.cotangent_barrier(x), inputs, deterministic)
    last = blocks[-1]
    out = last(x, inputs, deterministic)
    query = (inputs.extra["emd_positions"] + x).astype(x.dtype)
    for _ in range(self.steps):
      query = last(x, inputs.replace(query=query), deterministic)
    return out, query


class Conv(nn.Module):
  """v2's ConvLayer, as EncoderBlock's `post`: (x_in (B,T,D), x_out (B,T,D)) ->
  LayerNorm(x_out + act(conv(x_in))) at real tokens, 0 at padding. The kernel is in
  transformers' (D_out, D_in, k) layout; each tap reads only tokens of the same segment."""
  kernel_size: int
  act: str = "tanh"
  layer_norm_eps: float = 1e-7
  dropout_rate: float = 0.0
  init_std: float = 0.02
  dtype: layers.Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_in, x_out, inputs: layers.AttentionInputs, deterministic=True):
    d = x_in.shape[-1]
    seg = inputs.extra["segments"]  # (B,T) int, 0 = padding
    kernel = self.param("kernel", layers.normal_init(self.init_std, ("mlp", "embed", None)),
                        (d, d, self.kernel_size), jnp.float32).astype(self.dtype)
    bias = self.param("bias", layers.zeros_init(("embed",)), (d,), jnp.float32)
    real = (seg > 0)[..., None]
    x = jnp.where(real, x_in, 0).astype(self.dtype)
    t, half = x.shape[1], self.kernel_size // 2
    xp = jnp.pad(x, ((0, 0), (half, half), (0, 0)))
    sp = jnp.pad(seg, ((0, 0), (half, half)))
    out = bias.astype(self.dtype)
    for tap in range(self.kernel_size):  # output t reads input t + tap - half
      same = (sp[:, tap:tap + t] == seg)[..., None]
      out = out + jnp.where(same, jnp.einsum("btd,od->bto", xp[:, tap:tap + t],
                                             kernel[:, :, tap]), 0)
    out = jnp.where(real, out, 0)
    out = layers.activation(self.act)(layers.Dropout(self.dropout_rate)(out, deterministic))
    y = layers.LayerNorm(self.layer_norm_eps, dtype=self.dtype, name="norm")(x_out + out)
    return jnp.where(real, y, 0).astype(x_out.dtype)


class ContextPooler(nn.Module):
  """(B,T,D) -> (B,D): act(dense(first token)) (DeBERTa's ContextPooler)."""
  hidden_size: int
  act: str = "gelu"
  init_std: float = 0.02
  dtype: layers.Dtype = jnp.float32

  @nn.compact
  def __call__(self, x):
    return layers.activation(self.act)(layers.Dense(
        (self.hidden_size,), ("embed", "mlp"), init_std=self.init_std, dtype=self.dtype,
        name="dense")(x[:, 0]))


@base.register_family("deberta-v2")
class Deberta(model.Encoder):
  """DeBERTa v2/v3: disentangled attention over a shared relative table, post-LN layers."""
  defaults = staticmethod(defaults)
  forward_flops = staticmethod(forward_flops)

  @staticmethod
  def task_heads(cfg):
    """Pooled: DeBERTa's ContextPooler (pooler.dense + pooler_hidden_act on the first
    token), then the classifier; tokens and spans: one linear layer on each hidden state."""
    return {"pooled": tasks.Head(pooling="cls", act=cfg.pooler_hidden_act,
                                 hf={"dense": "pooler.dense", "out": "classifier"}),
            "per_token": tasks.Head(hf={"out": "classifier"}),
            "span": tasks.Head(dropout=0.0, hf={"out": "qa_outputs"})}

  def max_length(self):
    c = self.config
    positions = c.position_biased_input or c.get("enhanced_mask_decoder", False)
    return c.max_position_embeddings if positions else None

  def setup(self):
    c = self.config
    validate(c)
    super().setup()
    if c.relative_attention:
      self.rel_embeddings = nn.Embed(
          2 * span(c), c.hidden_size, param_dtype=jnp.float32, dtype=jnp.float32,
          embedding_init=layers.normal_init(c.initializer_range, (None, "embed")))
      if c.norm_rel_ebd == "layer_norm":
        self.rel_norm = layers.LayerNorm(c.layer_norm_eps)
    if c.get("enhanced_mask_decoder", False):
      self.emd_positions = nn.Embed(
          c.max_position_embeddings, c.hidden_size, param_dtype=jnp.float32,
          dtype=jnp.float32,
          embedding_init=layers.normal_init(c.initializer_range, (None, "embed")))

  def attention_inputs(self, attention_mask, segment_ids, position_ids):
    inputs = super().attention_inputs(attention_mask, segment_ids, position_ids)
    c = self.config
    seg = attention_mask.astype(jnp.int32) if segment_ids is None else jnp.where(
        attention_mask.astype(bool), segment_ids, 0).astype(jnp.int32)
    rel = None
    if c.relative_attention:
      rel = self.rel_embeddings.embedding
      if c.norm_rel_ebd == "layer_norm":
        rel = self.rel_norm(rel)
    extra = {"segments": seg}
    if c.get("enhanced_mask_decoder", False):
      extra["emd_positions"] = self.emd_positions(position_ids)
    return inputs.replace(rel_embeddings=rel, extra=extra)

  def parts(self) -> model.Parts:
    c = self.config
    v1 = c.family == "deberta"  # v1's attention: no key or pos_key bias
    dtype = layers.dtype_from_name(c.dtype)
    std = c.initializer_range
    attention = functools.partial(
        relative.DisentangledAttention, num_heads=c.num_attention_heads,
        head_dim=c.hidden_size // c.num_attention_heads, hidden_size=c.hidden_size,
        dropout_rate=c.attention_probs_dropout_prob, impl=c.attention_impl, init_std=std,
        dtype=dtype, pos_att_type=tuple(c.pos_att_type), share_att_key=c.share_att_key,
        relative_attention=c.relative_attention, span=span(c),
        position_buckets=c.position_buckets, max_relative_positions=max_relative(c),
        pos_dropout_rate=c.hidden_dropout_prob, rel_impl=c.relative_impl,
        rel_block=c.relative_block, key_bias=not v1, pos_key_bias=not v1)
    mlp = functools.partial(layers.Mlp, c.intermediate_size, c.hidden_size, c.hidden_act,
                            init_std=std, dtype=dtype)
    norm = functools.partial(layers.LayerNorm, c.layer_norm_eps, dtype=dtype)
    block_cls = layers.remat_block(layers.EncoderBlock, c.remat_policy)
    block = functools.partial(block_cls, attention, mlp, norm,
                              dropout_rate=c.hidden_dropout_prob)
    first = block
    if c.conv_kernel_size > 0:
      first = functools.partial(block, post=functools.partial(
          Conv, c.conv_kernel_size, c.conv_act, c.layer_norm_eps, c.hidden_dropout_prob,
          std, dtype))
    return model.Parts(
        embeddings=functools.partial(
            layers.Embeddings, vocab_size=base.padded_vocab_size(c),
            embedding_size=c.embedding_size,
            max_position_embeddings=c.max_position_embeddings if c.position_biased_input
            else 0, type_vocab_size=c.type_vocab_size, layer_norm_eps=c.layer_norm_eps,
            dropout_rate=c.hidden_dropout_prob,
            projection_size=c.hidden_size if c.embedding_size != c.hidden_size else 0,
            projection_bias=False, project_before_norm=True, init_std=std, dtype=dtype),
        stack=(functools.partial(EmdStack, c.num_hidden_layers,
                                 lambda i: first if i == 0 else block)
               if c.get("enhanced_mask_decoder", False) else
               functools.partial(layers.Stack, c.num_hidden_layers,
                                 lambda i: first if i == 0 else block,
                                 scan=c.get("scan_layers", False))),
        heads={"pooler": functools.partial(ContextPooler, c.hidden_size,
                                           c.pooler_hidden_act, std, dtype),
               "mlm": functools.partial(heads.MlmHead, c.vocab_size, c.embedding_size,
                                        c.hidden_act, c.layer_norm_eps, std, dtype)})


@base.register_family("deberta")
class DebertaV1(Deberta):
  """DeBERTa v1 (transformers' `Deberta*`): v2's parts without the key and pos_key biases
  (`parts`, by the config's family), and only v1's options (`validate`)."""
  defaults = staticmethod(defaults_v1)
