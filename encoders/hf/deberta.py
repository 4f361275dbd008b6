"""DeBERTa <-> Hugging Face: v2/v3 (model_type "deberta-v2": DebertaV2Model,
DebertaV2ForMaskedLM) and v1 (model_type "deberta": DebertaModel, DebertaForMaskedLM);
the task models of both through `task_class_prefix` ("DebertaV2", "Deberta").

v1 differs in its attention's tensors: one fused `in_proj` (3D, D) without bias, whose rows
are per head its query, key and value rows side by side (a grouped split rule), the biases
`q_bias` and `v_bias` (the key has none), and `pos_proj` (c2p, no bias) / `pos_q_proj`
(p2c) for v2's `pos_key_proj` / `pos_query_proj`."""
from encoders import deberta as deberta_family
from encoders.hf.bert import post_ln_layer_rules
from encoders.hf.mapping import Mapping, refuse_unknown, register_mapping
from encoders.hf.rules import PerLayer, Rule, layer_indices

DEBERTA_LAYER = dict(qkv="attention.self.{}_proj", out="attention.output.dense",
                     attention_norm="attention.output.LayerNorm", wi="intermediate.dense",
                     wo="output.dense", mlp_norm="output.LayerNorm")

_CONSUMED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "hidden_act", "max_position_embeddings", "type_vocab_size",
             "layer_norm_eps", "pad_token_id", "relative_attention", "max_relative_positions",
             "position_buckets", "pos_att_type", "share_att_key", "norm_rel_ebd",
             "position_biased_input", "conv_kernel_size", "conv_act", "embedding_size",
             "legacy", "pooler_hidden_act", "enhanced_mask_decoder")
# HF defaults of the attributes a DebertaV2Config may lack (getattr fallbacks in
# modeling_deberta_v2.py); ours differ (v3 defaults), so absent means these.
_HF_DEFAULTS = dict(type_vocab_size=0, layer_norm_eps=1e-7, relative_attention=False,
                    max_relative_positions=-1, position_buckets=-1, pos_att_type=(),
                    share_att_key=False, norm_rel_ebd="none", position_biased_input=True,
                    conv_kernel_size=0, conv_act="tanh", legacy=True,
                    pooler_hidden_act="gelu", pad_token_id=0, enhanced_mask_decoder=False)
_REQUIRED = {"is_decoder": False, "add_cross_attention": False, "tie_word_embeddings": True,
             "conv_groups": 1}


def _pos_att_type(value):
  if value is None:
    return ()
  if isinstance(value, str):
    value = [x.strip() for x in value.lower().split("|") if x.strip()]
  return tuple(value)


@register_mapping
class DebertaMapping(Mapping):
  model_types = ("deberta-v2",)
  architectures = {
      "DebertaV2Model": ("", ()),
      "DebertaV2ForMaskedLM": ("deberta", ("mlm",)),
  }
  tied = {"cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"}
  # transformers ignores a position table the model does not add to its input (the
  # released checkpoints carry one, for the enhanced mask decoder); so does the import,
  # unless `enhanced_mask_decoder` maps it
  ignorable = ("embeddings.position_ids", "embeddings.position_embeddings.weight")
  consumed, required = _CONSUMED, _REQUIRED
  task_class_prefix = "DebertaV2"

  def defaults(self):
    return deberta_family.defaults()

  def base_prefix(self, hf):
    return "deberta"

  def config_from_hf(self, hf, heads):
    hf = dict(hf)
    for key in ("pooler_hidden_size", "attention_head_size"):
      want = hf["hidden_size"] // hf["num_attention_heads"] if key == "attention_head_size" \
          else hf["hidden_size"]
      if hf.pop(key, want) != want:
        raise ValueError(f"config.json sets {key} != {want}; encoder-zoo supports only "
                         f"{key}={want} for DeBERTa")
    hf.pop("pooler_dropout", None)  # a training-time dropout of the (absent) pooler
    m = self.config_start(hf, heads)
    for key, value in _HF_DEFAULTS.items():  # absent means transformers' default, not ours
      if key not in hf:
        m[key] = value
    m.embedding_size = hf.get("embedding_size", hf["hidden_size"])
    m.pos_att_type = _pos_att_type(m.pos_att_type)
    m.norm_rel_ebd = "layer_norm" if "layer_norm" in str(m.norm_rel_ebd).lower() else "none"
    m.hidden_dropout_prob = hf.get("hidden_dropout_prob", 0.1)
    m.attention_probs_dropout_prob = hf.get("attention_probs_dropout_prob", 0.1)
    m.initializer_range = hf.get("initializer_range", 0.02)
    if "mlm" in heads and not m.legacy and m.embedding_size != m.hidden_size:
      raise ValueError("DeBERTa's non-legacy MLM head needs embedding_size == hidden_size")
    deberta_family.validate(m)
    return m

  def config_to_hf(self, cfg):
    hf = {key: cfg[key] for key in _CONSUMED}
    hf.update(model_type="deberta-v2", pos_att_type=list(cfg.pos_att_type),
              hidden_dropout_prob=cfg.hidden_dropout_prob,
              attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
              initializer_range=cfg.initializer_range, tie_word_embeddings=True,
              pooler_hidden_size=cfg.hidden_size, pooler_dropout=0.0)
    if not hf["enhanced_mask_decoder"]:
      del hf["enhanced_mask_decoder"]  # written only when on (transformers never reads it)
    if "pooler" in set(cfg.heads):
      raise ValueError("DebertaV2Model has no pooler (its ContextPooler belongs to the "
                       "sequence-classification model: encoders.tasks)")
    return hf, ("DebertaV2ForMaskedLM" if "mlm" in set(cfg.heads) else "DebertaV2Model")

  def rules(self, cfg):
    d, h = cfg.hidden_size, cfg.num_attention_heads
    qkv = (d, h, d // h)
    layer = post_ln_layer_rules(cfg, "encoder/layer_{i}", "encoder.layer.{i}", DEBERTA_LAYER)
    if cfg.relative_attention and not cfg.share_att_key:
      for term, name in (("c2p", "pos_key"), ("p2c", "pos_query")):
        if term in cfg.pos_att_type:
          layer += [Rule(f"encoder/layer_{{i}}/attention/{name}/kernel",
                         f"encoder.layer.{{i}}.attention.self.{name}_proj.weight", "linear",
                         shape=qkv),
                    Rule(f"encoder/layer_{{i}}/attention/{name}/bias",
                         f"encoder.layer.{{i}}.attention.self.{name}_proj.bias",
                         shape=qkv[1:])]
    r = [Rule("embeddings/word_embeddings/embedding", "embeddings.word_embeddings.weight",
              "embedding", vocab=True),
         Rule("embeddings/norm/scale", "embeddings.LayerNorm.weight"),
         Rule("embeddings/norm/bias", "embeddings.LayerNorm.bias"),
         PerLayer(layer, layer_indices(cfg.num_hidden_layers))]
    if cfg.position_biased_input:
      r.append(Rule("embeddings/position_embeddings/embedding",
                    "embeddings.position_embeddings.weight", "embedding"))
    if cfg.type_vocab_size > 0:
      r.append(Rule("embeddings/token_type_embeddings/embedding",
                    "embeddings.token_type_embeddings.weight", "embedding"))
    if cfg.embedding_size != cfg.hidden_size:
      r.append(Rule("embeddings/projection/kernel", "embeddings.embed_proj.weight", "linear"))
    if cfg.get("enhanced_mask_decoder", False):
      r.append(Rule("emd_positions/embedding", "embeddings.position_embeddings.weight",
                    "embedding"))
    if cfg.relative_attention:
      r.append(Rule("rel_embeddings/embedding", "encoder.rel_embeddings.weight", "embedding"))
    if cfg.norm_rel_ebd == "layer_norm":
      r += [Rule("rel_norm/scale", "encoder.LayerNorm.weight"),
            Rule("rel_norm/bias", "encoder.LayerNorm.bias")]
    if cfg.conv_kernel_size > 0:
      r += [Rule("encoder/layer_0/post/kernel", "encoder.conv.conv.weight", "embedding"),
            Rule("encoder/layer_0/post/bias", "encoder.conv.conv.bias"),
            Rule("encoder/layer_0/post/norm/scale", "encoder.conv.LayerNorm.weight"),
            Rule("encoder/layer_0/post/norm/bias", "encoder.conv.LayerNorm.bias")]
    if "mlm" in set(cfg.heads):
      p, dense, norm = (("cls.predictions", "transform.dense", "transform.LayerNorm")
                        if cfg.legacy else ("lm_predictions.lm_head", "dense", "LayerNorm"))
      r += [Rule("mlm/transform/kernel", f"{p}.{dense}.weight", "linear", base=False),
            Rule("mlm/transform/bias", f"{p}.{dense}.bias", base=False),
            Rule("mlm/norm/scale", f"{p}.{norm}.weight", base=False),
            Rule("mlm/norm/bias", f"{p}.{norm}.bias", base=False),
            Rule("mlm/bias", f"{p}.bias", base=False, vocab=True)]
    return r


_V1_CONSUMED = tuple(k for k in _CONSUMED if k not in (
    "position_buckets", "share_att_key", "norm_rel_ebd", "conv_kernel_size", "conv_act"))
_V1_REQUIRED = dict(_REQUIRED, talking_head=False)
_V1_REQUIRED.pop("conv_groups")


@register_mapping
class DebertaV1Mapping(DebertaMapping):
  model_types = ("deberta",)
  architectures = {
      "DebertaModel": ("", ()),
      "DebertaForMaskedLM": ("deberta", ("mlm",)),
  }
  task_class_prefix = "Deberta"

  def config_from_hf(self, hf, heads):
    hf = dict(hf)
    refuse_unknown({k: v for k, v in hf.items() if k not in (
        "pooler_hidden_size", "attention_head_size", "pooler_dropout")},
        _V1_CONSUMED, _V1_REQUIRED)
    hf.pop("talking_head", None)
    hf.update(model_type="deberta-v2", position_buckets=-1, share_att_key=False,
              norm_rel_ebd="none", conv_kernel_size=0)
    m = super().config_from_hf(hf, heads)
    m.family = "deberta"
    deberta_family.validate(m)
    return m

  def config_to_hf(self, cfg):
    hf, arch = super().config_to_hf(cfg)
    for key in ("position_buckets", "share_att_key", "norm_rel_ebd", "conv_kernel_size",
                "conv_act"):
      hf.pop(key)
    hf["model_type"] = "deberta"
    return hf, arch.replace("DebertaV2", "Deberta")

  def rules(self, cfg):
    d, h = cfg.hidden_size, cfg.num_attention_heads
    qkv = (d, h, d // h)
    v2 = super().rules(cfg)
    per_layer = next(r for r in v2 if isinstance(r, PerLayer))
    attn = "encoder.layer.{i}.attention.self"
    layer = [r for r in per_layer.rules if ".attention.self." not in r.hf]
    layer += [
        Rule(tuple(f"encoder/layer_{{i}}/attention/{n}/kernel"
                   for n in ("query", "key", "value")),
             f"{attn}.in_proj.weight", "split", of="linear", shape=qkv, groups=h),
        Rule("encoder/layer_{i}/attention/query/bias", f"{attn}.q_bias", shape=qkv[1:]),
        Rule("encoder/layer_{i}/attention/value/bias", f"{attn}.v_bias", shape=qkv[1:])]
    if cfg.relative_attention and "c2p" in cfg.pos_att_type:
      layer.append(Rule("encoder/layer_{i}/attention/pos_key/kernel",
                        f"{attn}.pos_proj.weight", "linear", shape=qkv))
    if cfg.relative_attention and "p2c" in cfg.pos_att_type:
      layer += [Rule("encoder/layer_{i}/attention/pos_query/kernel",
                     f"{attn}.pos_q_proj.weight", "linear", shape=qkv),
                Rule("encoder/layer_{i}/attention/pos_query/bias",
                     f"{attn}.pos_q_proj.bias", shape=qkv[1:])]
    return [PerLayer(layer, per_layer.indices) if r is per_layer else r for r in v2]
