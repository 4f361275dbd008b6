"""ModernBERT <-> Hugging Face (ModernBertModel, ModernBertForMaskedLM).

HF fuses q, k and v into one `Wqkv` (3*H*K, D) weight (q's heads, then k's, then v's): a
"split" rule onto our three (D,H,K) kernels. Layer 0 has no `attn_norm`. Biases and norm
biases exist only when the config turns them on (`attention_bias`, `mlp_bias`,
`norm_bias`, `classifier_bias`, `decoder_bias`), and the rules follow it.
"""
from encoders import modernbert as mb
from encoders.hf.mapping import Mapping, register_mapping
from encoders.hf.rules import PerLayer, Rule

_CONSUMED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "hidden_activation", "max_position_embeddings",
             "initializer_range", "norm_eps", "norm_bias", "pad_token_id", "local_attention",
             "attention_bias", "mlp_bias", "decoder_bias", "classifier_bias",
             "classifier_activation", "embedding_dropout", "attention_dropout",
             "mlp_dropout", "global_attn_every_n_layers", "classifier_pooling",
             "classifier_dropout")
# Keys released configs carry (ModernBERT's, mmBERT's) that transformers'
# ModernBERT never reads: its eps is `norm_eps`, its positions are rotary whatever
# `position_embedding_type` says ("absolute", mmBERT's "sans_pos"), the mask id is the
# tokenizer's.
_IGNORED = ("layer_norm_eps", "position_embedding_type", "mask_token_id")
# Read here (not copied one to one), or settings that never change the encoder's numbers:
# init-only, task-head pooling/dropout, FlashAttention determinism, the loss-side sparse
# prediction (HF's logits at labelled positions only), special token ids.
_HANDLED = ("layer_types", "rope_parameters", "global_rope_theta", "local_rope_theta",
            "initializer_cutoff_factor", "deterministic_flash_attn", "sparse_prediction", "sparse_pred_ignore_index",
            "cls_token_id", "reference_compile", "repad_logits_with_grad",
            "is_encoder_decoder", *_IGNORED)
_REQUIRED = {"tie_word_embeddings": True}


def _every_n(hf: dict) -> int:
  """global_attn_every_n_layers from the config, checked against `layer_types`."""
  n_layers = hf["num_hidden_layers"]
  types = hf.get("layer_types")
  n = hf.get("global_attn_every_n_layers")
  if n is None:
    if types is None:
      n = 3
    else:
      globals_ = [i for i, t in enumerate(types) if t == "full_attention"]
      n = globals_[1] if len(globals_) > 1 else n_layers
  if types is not None:
    want = ["full_attention" if i % n == 0 else "sliding_attention" for i in range(n_layers)]
    if list(types) != want:
      raise ValueError(f"config.json's layer_types {types} is not one global layer every "
                       f"{n} layers from layer 0, the only pattern encoder-zoo implements")
  return n


def _thetas(hf: dict):
  rope = hf.get("rope_parameters") or {}
  out = []
  for kind, old_key, default in (("full_attention", "global_rope_theta", 160_000.0),
                                 ("sliding_attention", "local_rope_theta", 10_000.0)):
    params = rope.get(kind) or {}
    if params.get("rope_type", "default") != "default":
      raise ValueError(f"config.json's rope_parameters[{kind!r}] has rope_type "
                       f"{params['rope_type']!r}; encoder-zoo implements only 'default'")
    extra = set(params) - {"rope_type", "rope_theta"}
    if extra:
      raise ValueError(f"config.json's rope_parameters[{kind!r}] sets {sorted(extra)}, "
                       "which encoder-zoo does not implement")
    out.append(float(params.get("rope_theta", hf.get(old_key, default))))
  return out


@register_mapping
class ModernBertMapping(Mapping):
  model_types = ("modernbert",)
  architectures = {
      "ModernBertModel": ("", ()),
      "ModernBertForMaskedLM": ("model", ("mlm",)),
  }
  tied = {"decoder.weight": "embeddings.tok_embeddings.weight"}
  consumed, handled, required = _CONSUMED, _HANDLED, _REQUIRED
  task_class_prefix = "ModernBert"

  def defaults(self):
    return mb.defaults()

  def base_prefix(self, hf):
    return "model"

  def config_from_hf(self, hf, heads):
    m = self.config_start(hf, heads)
    if hf.get("is_encoder_decoder"):
      raise ValueError("config.json sets is_encoder_decoder=True; ModernBERT is an encoder")
    m.global_attn_every_n_layers = _every_n(hf)
    m.global_rope_theta, m.local_rope_theta = _thetas(hf)
    mb.validate(m)
    return m

  def config_to_hf(self, cfg):
    hf = {key: cfg[key] for key in _CONSUMED}
    hf.update(model_type="modernbert", tie_word_embeddings=True,
              layer_types=mb.layer_types(cfg),
              rope_parameters={
                  "full_attention": {"rope_type": "default",
                                     "rope_theta": cfg.global_rope_theta},
                  "sliding_attention": {"rope_type": "default",
                                        "rope_theta": cfg.local_rope_theta}})
    # HF's special ids default to the released 50k vocabulary; keep them inside ours.
    for key, default in (("bos_token_id", 50281), ("eos_token_id", 50282),
                         ("cls_token_id", 50281), ("sep_token_id", 50282)):
      hf[key] = default if default < cfg.vocab_size else None
    arch = "ModernBertForMaskedLM" if "mlm" in cfg.heads else "ModernBertModel"
    return hf, arch

  def rules(self, cfg):
    d, h = cfg.hidden_size, cfg.num_attention_heads
    qkv, out = (d, h, d // h), (h, d // h, d)
    ours, theirs = "encoder/layer_{i}", "layers.{i}"

    def norm(path, key):
      return [Rule(f"{path}/scale", f"{key}.weight")] + (
          [Rule(f"{path}/bias", f"{key}.bias")] if cfg.norm_bias else [])

    def dense(path, key, base=True, bias=False, **kw):
      return [Rule(f"{path}/kernel", f"{key}.weight", "linear", base=base, **kw)] + (
          [Rule(f"{path}/bias", f"{key}.bias", base=base,
                **({"shape": kw["shape"][kw.get("n_in", 1):]} if "shape" in kw else {}))]
          if bias else [])

    names = ("query", "key", "value")
    layer = [Rule(tuple(f"{ours}/attention/{n}/kernel" for n in names),
                  f"{theirs}.attn.Wqkv.weight", "split", of="linear", shape=qkv)]
    if cfg.attention_bias:
      layer.append(Rule(tuple(f"{ours}/attention/{n}/bias" for n in names),
                        f"{theirs}.attn.Wqkv.bias", "split", of="vector", shape=qkv[1:]))
    layer += dense(f"{ours}/attention/out", f"{theirs}.attn.Wo", bias=cfg.attention_bias,
                   shape=out, n_in=2)
    layer += norm(f"{ours}/mlp_norm", f"{theirs}.mlp_norm")
    layer += dense(f"{ours}/mlp/wi", f"{theirs}.mlp.Wi", bias=cfg.mlp_bias)
    layer += dense(f"{ours}/mlp/wo", f"{theirs}.mlp.Wo", bias=cfg.mlp_bias)
    n = cfg.num_hidden_layers
    r = [Rule("embeddings/word_embeddings/embedding", "embeddings.tok_embeddings.weight",
              "embedding", vocab=True)]
    r += norm("embeddings/norm", "embeddings.norm")
    r += [PerLayer(layer, [{"i": i} for i in range(n)]),
          PerLayer(norm(f"{ours}/attention_norm", f"{theirs}.attn_norm"),
                   [{"i": i} for i in range(1, n)])]
    r += norm("final_norm", "final_norm")
    if "mlm" in cfg.heads:
      r += dense("mlm/transform", "head.dense", base=False, bias=cfg.classifier_bias)
      r += [Rule("mlm/norm/scale", "head.norm.weight", base=False)]
      if cfg.norm_bias:
        r += [Rule("mlm/norm/bias", "head.norm.bias", base=False)]
      if cfg.decoder_bias:
        r += [Rule("mlm/bias", "decoder.bias", base=False, vocab=True)]
    return r
