"""BERT / RoBERTa <-> Hugging Face (BertModel, BertForMaskedLM, BertForPreTraining,
RobertaModel, RobertaForMaskedLM)."""
from encoders import bert as bert_family
from encoders.hf.mapping import Mapping, register_mapping
from encoders.hf.rules import PerLayer, Rule, layer_indices

_CONSUMED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "hidden_act", "max_position_embeddings", "type_vocab_size",
             "layer_norm_eps", "pad_token_id")
_REQUIRED = {"position_embedding_type": "absolute", "is_decoder": False,
             "add_cross_attention": False, "tie_word_embeddings": True}


# HF names of a post-LN layer's tensors (the "{}" of the q/k/v entry is query/key/value).
BERT_LAYER = dict(qkv="attention.self.{}", out="attention.output.dense",
                  attention_norm="attention.output.LayerNorm", wi="intermediate.dense",
                  wo="output.dense", mlp_norm="output.LayerNorm")


def post_ln_layer_rules(cfg, ours: str, hf: str, names: dict):
  """The rules of one post-LN layer (`bert.post_ln_block`: BERT, RoBERTa, ALBERT) between
  our `ours/...` params and HF's `hf.<names[...]>` tensors."""
  d, h = cfg.hidden_size, cfg.num_attention_heads
  qkv, out = (d, h, d // h), (h, d // h, d)  # our (D,H,K) and (H,K,D) vs HF 2-d
  rules = []
  for name in ("query", "key", "value"):
    q = names["qkv"].format(name)
    rules += [Rule(f"{ours}/attention/{name}/kernel", f"{hf}.{q}.weight", "linear", shape=qkv),
              Rule(f"{ours}/attention/{name}/bias", f"{hf}.{q}.bias", shape=qkv[1:])]
  rules += [Rule(f"{ours}/attention/out/kernel", f"{hf}.{names['out']}.weight", "linear",
                 shape=out, n_in=2),
            Rule(f"{ours}/attention/out/bias", f"{hf}.{names['out']}.bias")]
  for part, kind in (("attention_norm", "norm"), ("mlp/wi", "linear"), ("mlp/wo", "linear"),
                     ("mlp_norm", "norm")):
    key = f"{hf}.{names[part.split('/')[-1]]}"
    if kind == "norm":
      rules += [Rule(f"{ours}/{part}/scale", f"{key}.weight"),
                Rule(f"{ours}/{part}/bias", f"{key}.bias")]
    else:
      rules += [Rule(f"{ours}/{part}/kernel", f"{key}.weight", "linear"),
                Rule(f"{ours}/{part}/bias", f"{key}.bias")]
  return rules


@register_mapping
class BertMapping(Mapping):
  model_types = ("bert", "roberta")
  architectures = {
      "BertModel": ("", ("pooler",)),
      "BertForMaskedLM": ("bert", ("mlm",)),
      "BertForPreTraining": ("bert", ("mlm", "nsp")),
      "RobertaModel": ("", ("pooler",)),
      "RobertaForMaskedLM": ("roberta", ("mlm",)),
  }
  tied = {"cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias",
          "lm_head.decoder.weight": "embeddings.word_embeddings.weight",
          "lm_head.decoder.bias": "lm_head.bias"}
  # Buffers older transformers versions saved next to the weights.
  ignorable = ("embeddings.position_ids", "embeddings.token_type_ids")
  consumed, required = _CONSUMED, _REQUIRED

  def defaults(self):
    return bert_family.defaults()

  def task_prefix(self, cfg):
    return "Roberta" if cfg.get("position_style") == "roberta" else "Bert"

  def config_from_hf(self, hf, heads):
    m = self.config_start(hf, heads)
    m.hidden_dropout_prob = hf.get("hidden_dropout_prob", 0.1)
    m.attention_probs_dropout_prob = hf.get("attention_probs_dropout_prob", 0.1)
    m.initializer_range = hf.get("initializer_range", 0.02)
    m.family = "bert"
    m.position_style = "roberta" if hf["model_type"] == "roberta" else "absolute"
    return m

  def config_to_hf(self, cfg):
    extras = {}
    if cfg.get("num_key_value_heads") not in (None, 0, cfg.num_attention_heads):
      extras["num_key_value_heads"] = cfg.num_key_value_heads
    if cfg.get("relative_attention_num_buckets"):
      extras["relative_attention_num_buckets"] = cfg.relative_attention_num_buckets
    if cfg.get("norm_kind", "layernorm") != "layernorm":
      extras["norm_kind"] = cfg.norm_kind
    if extras:
      raise ValueError(f"a BERT with {extras} has no transformers class to export to "
                       "(BertModel has one K/V head per query head, LayerNorm and no "
                       "relative bias)")
    roberta = cfg.position_style == "roberta"
    hf = {key: cfg[key] for key in _CONSUMED}
    hf.update(model_type="roberta" if roberta else "bert",
              hidden_dropout_prob=cfg.hidden_dropout_prob,
              attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
              initializer_range=cfg.initializer_range, position_embedding_type="absolute",
              tie_word_embeddings=True)
    if roberta:
      hf.update(bos_token_id=0, eos_token_id=2)
    heads = set(cfg.heads)
    if "nsp" in heads:
      if roberta:
        raise ValueError("RoBERTa has no NSP head in transformers")
      arch = "BertForPreTraining"
    elif "mlm" in heads:
      arch = "RobertaForMaskedLM" if roberta else "BertForMaskedLM"
    else:
      arch = "RobertaModel" if roberta else "BertModel"
    return hf, arch

  def rules(self, cfg):
    layer = post_ln_layer_rules(cfg, "encoder/layer_{i}", "encoder.layer.{i}", BERT_LAYER)
    r = [Rule("embeddings/word_embeddings/embedding", "embeddings.word_embeddings.weight",
              "embedding", vocab=True),
         Rule("embeddings/position_embeddings/embedding",
              "embeddings.position_embeddings.weight", "embedding"),
         Rule("embeddings/token_type_embeddings/embedding",
              "embeddings.token_type_embeddings.weight", "embedding"),
         Rule("embeddings/norm/scale", "embeddings.LayerNorm.weight"),
         Rule("embeddings/norm/bias", "embeddings.LayerNorm.bias"),
         PerLayer(layer, layer_indices(cfg.num_hidden_layers))]
    heads = set(cfg.heads)
    if heads & {"pooler", "nsp"}:
      r += [Rule("pooler/dense/kernel", "pooler.dense.weight", "linear"),
            Rule("pooler/dense/bias", "pooler.dense.bias")]
    if "mlm" in heads:
      p, names = (("lm_head", ("dense", "layer_norm", "")) if cfg.position_style == "roberta"
                  else ("cls.predictions", ("transform.dense", "transform.LayerNorm", "")))
      r += [Rule("mlm/transform/kernel", f"{p}.{names[0]}.weight", "linear", base=False),
            Rule("mlm/transform/bias", f"{p}.{names[0]}.bias", base=False),
            Rule("mlm/norm/scale", f"{p}.{names[1]}.weight", base=False),
            Rule("mlm/norm/bias", f"{p}.{names[1]}.bias", base=False),
            Rule("mlm/bias", f"{p}.bias", base=False, vocab=True)]
    if "nsp" in heads:
      r += [Rule("nsp/dense/kernel", "cls.seq_relationship.weight", "linear", base=False),
            Rule("nsp/dense/bias", "cls.seq_relationship.bias", base=False)]
    return r
