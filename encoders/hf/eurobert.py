"""EuroBERT <-> Hugging Face (EuroBertModel, EuroBertForMaskedLM; the task classes through
encoders/hf/tasks.py).

Per layer: q/k/v/o projections (k and v with num_key_value_heads heads), two RMSNorms
(`input_layernorm`, `post_attention_layernorm`), the SwiGLU MLP's `gate_proj` and
`up_proj` concatenated into our fused `wi` (gate first: the activated half) and
`down_proj`. The MLM head `lm_head` is untied (the released configs set
tie_word_embeddings=false, the only value implemented). Older configs (the hub's) give
`rope_theta` / `rope_scaling` instead of `rope_parameters`; both are read, as transformers
reads them.
"""
from encoders import eurobert as eb
from encoders.hf.mapping import Mapping, register_mapping
from encoders.hf.rules import PerLayer, Rule, layer_indices

_CONSUMED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_key_value_heads", "hidden_act",
             "max_position_embeddings", "initializer_range", "rms_norm_eps", "pad_token_id",
             "bos_token_id", "eos_token_id", "mask_token_id", "attention_bias", "mlp_bias",
             "attention_dropout", "classifier_pooling")
# Read here, or settings that never change the encoder's numbers: the head dim (checked),
# rotary settings in either format, the remote-code map of the hub's configs, the special
# tokens' strings, an older checkpoint's dropout that transformers ignores, the legacy
# pooling name (checked against classifier_pooling).
_HANDLED = ("head_dim", "rope_parameters", "rope_theta", "rope_scaling", "auto_map",
            "bos_token", "eos_token", "pad_token", "mask_token", "hidden_dropout",
            "clf_pooling")
_REQUIRED = {"tie_word_embeddings": False, "pretraining_tp": 1, "is_decoder": False}


def _rope_theta(hf: dict) -> float:
  rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind != "default":
    raise ValueError(f"config.json's rotary settings have rope_type {kind!r}; encoder-zoo "
                     "implements only 'default'")
  extra = set(rope) - {"rope_type", "type", "rope_theta"}
  if extra:
    raise ValueError(f"config.json's rotary settings set {sorted(extra)}, which encoder-zoo "
                     "does not implement")
  return float(rope.get("rope_theta", hf.get("rope_theta", 10_000.0)))  # transformers' default


@register_mapping
class EuroBertMapping(Mapping):
  model_types = ("eurobert",)
  architectures = {
      "EuroBertModel": ("", ()),
      "EuroBertForMaskedLM": ("model", ("mlm",)),
  }
  consumed, handled, required = _CONSUMED, _HANDLED, _REQUIRED
  task_class_prefix = "EuroBert"

  def defaults(self):
    return eb.defaults()

  def base_prefix(self, hf):
    return "model"

  def config_from_hf(self, hf, heads):
    m = self.config_start(hf, heads)
    if hf.get("num_key_value_heads") is None:
      m.num_key_value_heads = m.num_attention_heads  # transformers' default
    m.rope_theta = _rope_theta(hf)
    want = m.hidden_size // m.num_attention_heads
    if hf.get("head_dim") not in (None, want):
      raise ValueError(f"config.json sets head_dim={hf['head_dim']}; encoder-zoo implements "
                       f"hidden_size // num_attention_heads = {want}")
    m.head_dim = 0
    legacy = hf.get("clf_pooling")
    if legacy is not None and legacy != m.classifier_pooling:
      raise ValueError(f"config.json sets clf_pooling={legacy!r} but classifier_pooling="
                       f"{m.classifier_pooling!r}, which transformers reads; set "
                       "classifier_pooling to the pooling the model was trained with")
    eb.validate(m)
    return m

  def config_to_hf(self, cfg):
    hf = {key: cfg[key] for key in _CONSUMED}
    hf.update(model_type="eurobert", tie_word_embeddings=False, head_dim=eb.head_dim(cfg),
              rope_parameters={"rope_type": "default", "rope_theta": float(cfg.rope_theta)})
    for key in ("bos_token_id", "eos_token_id", "mask_token_id"):  # keep inside the vocab
      if hf[key] is not None and not 0 <= hf[key] < cfg.vocab_size:
        hf[key] = None
    if hf["mask_token_id"] is None:  # transformers requires an int: its default then
      del hf["mask_token_id"]
    arch = "EuroBertForMaskedLM" if "mlm" in cfg.heads else "EuroBertModel"
    return hf, arch

  def rules(self, cfg):
    d, h, g, k = (cfg.hidden_size, cfg.num_attention_heads, eb.kv_heads(cfg),
                  eb.head_dim(cfg))
    ours, theirs = "encoder/layer_{i}", "layers.{i}"

    def dense(path, key, bias, **kw):
      r = [Rule(f"{path}/kernel", f"{key}.weight", "linear", **kw)]
      if bias:
        shape = kw["shape"][kw.get("n_in", 1):] if "shape" in kw else None
        r.append(Rule(f"{path}/bias", f"{key}.bias", shape=shape))
      return r

    attn, mlp = f"{ours}/attention", f"{ours}/mlp"
    layer = (dense(f"{attn}/query", f"{theirs}.self_attn.q_proj", cfg.attention_bias,
                   shape=(d, h, k))
             + dense(f"{attn}/key", f"{theirs}.self_attn.k_proj", cfg.attention_bias,
                     shape=(d, g, k))
             + dense(f"{attn}/value", f"{theirs}.self_attn.v_proj", cfg.attention_bias,
                     shape=(d, g, k))
             + dense(f"{attn}/out", f"{theirs}.self_attn.o_proj", cfg.attention_bias,
                     shape=(h, k, d), n_in=2)
             + [Rule(f"{ours}/attention_norm/scale", f"{theirs}.input_layernorm.weight"),
                Rule(f"{ours}/mlp_norm/scale", f"{theirs}.post_attention_layernorm.weight"),
                Rule(f"{mlp}/wi/kernel", (f"{theirs}.mlp.gate_proj.weight",
                                          f"{theirs}.mlp.up_proj.weight"), "concat",
                     of="linear")]
             + dense(f"{mlp}/wo", f"{theirs}.mlp.down_proj", cfg.mlp_bias))
    if cfg.mlp_bias:
      layer.append(Rule(f"{mlp}/wi/bias", (f"{theirs}.mlp.gate_proj.bias",
                                           f"{theirs}.mlp.up_proj.bias"), "concat"))
    r = [Rule("embeddings/word_embeddings/embedding", "embed_tokens.weight", "embedding",
              vocab=True),
         PerLayer(layer, layer_indices(cfg.num_hidden_layers)),
         Rule("final_norm/scale", "norm.weight")]
    if "mlm" in cfg.heads:
      r.append(Rule("mlm/kernel", "lm_head.weight", "linear", base=False, vocab=True))
      if cfg.mlp_bias:
        r.append(Rule("mlm/bias", "lm_head.bias", base=False, vocab=True))
    return r
