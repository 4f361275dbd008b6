"""MPNet <-> Hugging Face (MPNetModel, MPNetForMaskedLM; task models by prefix "MPNet").

BERT's post-LN layer under other names (`attention.attn.{q,k,v,o}`, `attention.LayerNorm`),
no token types, and the shared bias table `encoder.relative_attention_bias.weight`
(buckets, H), ours `position_bias/embedding`.
"""
from encoders import mpnet
from encoders.hf.mapping import Mapping, register_mapping
from encoders.hf.rules import PerLayer, Rule, layer_indices

_CONSUMED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "hidden_act", "max_position_embeddings", "layer_norm_eps",
             "relative_attention_num_buckets", "pad_token_id")
_REQUIRED = {"tie_word_embeddings": True, "is_decoder": False, "add_cross_attention": False}


def layer_rules(cfg, ours: str = "encoder/layer_{i}", hf: str = "encoder.layer.{i}"):
  """One MPNet layer: our `bert.post_ln_block` params vs HF's MPNetLayer."""
  d, h = cfg.hidden_size, cfg.num_attention_heads
  qkv, out = (d, h, d // h), (h, d // h, d)
  rules = []
  for name, short in (("query", "q"), ("key", "k"), ("value", "v")):
    key = f"{hf}.attention.attn.{short}"
    rules += [Rule(f"{ours}/attention/{name}/kernel", f"{key}.weight", "linear", shape=qkv),
              Rule(f"{ours}/attention/{name}/bias", f"{key}.bias", shape=qkv[1:])]
  rules += [Rule(f"{ours}/attention/out/kernel", f"{hf}.attention.attn.o.weight", "linear",
                 shape=out, n_in=2),
            Rule(f"{ours}/attention/out/bias", f"{hf}.attention.attn.o.bias")]
  for part, key in (("attention_norm", "attention.LayerNorm"), ("mlp_norm", "output.LayerNorm")):
    rules += [Rule(f"{ours}/{part}/scale", f"{hf}.{key}.weight"),
              Rule(f"{ours}/{part}/bias", f"{hf}.{key}.bias")]
  for part, key in (("mlp/wi", "intermediate.dense"), ("mlp/wo", "output.dense")):
    rules += [Rule(f"{ours}/{part}/kernel", f"{hf}.{key}.weight", "linear"),
              Rule(f"{ours}/{part}/bias", f"{hf}.{key}.bias")]
  return rules


@register_mapping
class MPNetMapping(Mapping):
  model_types = ("mpnet",)
  architectures = {
      "MPNetModel": ("", ("pooler",)),
      "MPNetForMaskedLM": ("mpnet", ("mlm",)),
  }
  tied = {"lm_head.decoder.weight": "embeddings.word_embeddings.weight",
          "lm_head.decoder.bias": "lm_head.bias"}
  ignorable = ("embeddings.position_ids",)
  consumed, required = _CONSUMED, _REQUIRED
  task_class_prefix = "MPNet"

  def defaults(self):
    return mpnet.defaults()

  def config_from_hf(self, hf, heads):
    m = self.config_start(hf, heads)
    m.hidden_dropout_prob = hf.get("hidden_dropout_prob", 0.1)
    m.attention_probs_dropout_prob = hf.get("attention_probs_dropout_prob", 0.1)
    m.initializer_range = hf.get("initializer_range", 0.02)
    mpnet.validate(m)
    return m

  def config_to_hf(self, cfg):
    hf = {key: cfg[key] for key in _CONSUMED}
    hf.update(model_type="mpnet", hidden_dropout_prob=cfg.hidden_dropout_prob,
              attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
              initializer_range=cfg.initializer_range, tie_word_embeddings=True)
    hf.update(bos_token_id=0, eos_token_id=2 if cfg.vocab_size > 2 else None)
    return hf, "MPNetForMaskedLM" if "mlm" in cfg.heads else "MPNetModel"

  def rules(self, cfg):
    r = [Rule("embeddings/word_embeddings/embedding", "embeddings.word_embeddings.weight",
              "embedding", vocab=True),
         Rule("embeddings/position_embeddings/embedding",
              "embeddings.position_embeddings.weight", "embedding"),
         Rule("embeddings/norm/scale", "embeddings.LayerNorm.weight"),
         Rule("embeddings/norm/bias", "embeddings.LayerNorm.bias"),
         Rule("position_bias/embedding", "encoder.relative_attention_bias.weight", "embedding"),
         PerLayer(layer_rules(cfg), layer_indices(cfg.num_hidden_layers))]
    if "pooler" in cfg.heads:
      r += [Rule("pooler/dense/kernel", "pooler.dense.weight", "linear"),
            Rule("pooler/dense/bias", "pooler.dense.bias")]
    if "mlm" in cfg.heads:
      r += [Rule("mlm/transform/kernel", "lm_head.dense.weight", "linear", base=False),
            Rule("mlm/transform/bias", "lm_head.dense.bias", base=False),
            Rule("mlm/norm/scale", "lm_head.layer_norm.weight", base=False),
            Rule("mlm/norm/bias", "lm_head.layer_norm.bias", base=False),
            Rule("mlm/bias", "lm_head.bias", base=False, vocab=True)]
    return r
