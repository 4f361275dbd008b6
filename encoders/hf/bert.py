"""BERT / RoBERTa <-> Hugging Face (BertModel, BertForMaskedLM, BertForPreTraining,
RobertaModel, RobertaForMaskedLM)."""
from encoders import bert as bert_family
from encoders.hf import (Mapping, PerLayer, Rule, layer_indices, refuse_unknown,
                         register_mapping)

_CONSUMED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
             "intermediate_size", "hidden_act", "max_position_embeddings", "type_vocab_size",
             "layer_norm_eps", "pad_token_id")
_REQUIRED = {"position_embedding_type": "absolute", "is_decoder": False,
             "add_cross_attention": False, "tie_word_embeddings": True}


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

  def config_from_hf(self, hf, heads):
    refuse_unknown(hf, _CONSUMED, _REQUIRED)
    if hf["hidden_size"] % hf["num_attention_heads"]:
      raise ValueError("hidden_size must be a multiple of num_attention_heads")
    m = bert_family.defaults()
    for key in _CONSUMED:
      if key in hf:
        m[key] = hf[key]
    m.hidden_dropout_prob = hf.get("hidden_dropout_prob", 0.1)
    m.attention_probs_dropout_prob = hf.get("attention_probs_dropout_prob", 0.1)
    m.initializer_range = hf.get("initializer_range", 0.02)
    m.family = "bert"
    m.position_style = "roberta" if hf["model_type"] == "roberta" else "absolute"
    m.heads = tuple(heads)
    return m

  def config_to_hf(self, cfg):
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
    d, h = cfg.hidden_size, cfg.num_attention_heads
    qkv, out = (d, h, d // h), (h, d // h, d)  # our (D,H,K) and (H,K,D) vs HF 2-d
    ours, hf = "encoder/layer_{i}", "encoder.layer.{i}"
    layer = []
    for name in ("query", "key", "value"):
      layer += [Rule(f"{ours}/attention/{name}/kernel", f"{hf}.attention.self.{name}.weight",
                     "linear", shape=qkv),
                Rule(f"{ours}/attention/{name}/bias", f"{hf}.attention.self.{name}.bias",
                     shape=qkv[1:])]
    layer += [
        Rule(f"{ours}/attention/out/kernel", f"{hf}.attention.output.dense.weight", "linear",
             shape=out, n_in=2),
        Rule(f"{ours}/attention/out/bias", f"{hf}.attention.output.dense.bias"),
        Rule(f"{ours}/attention_norm/scale", f"{hf}.attention.output.LayerNorm.weight"),
        Rule(f"{ours}/attention_norm/bias", f"{hf}.attention.output.LayerNorm.bias"),
        Rule(f"{ours}/mlp/wi/kernel", f"{hf}.intermediate.dense.weight", "linear"),
        Rule(f"{ours}/mlp/wi/bias", f"{hf}.intermediate.dense.bias"),
        Rule(f"{ours}/mlp/wo/kernel", f"{hf}.output.dense.weight", "linear"),
        Rule(f"{ours}/mlp/wo/bias", f"{hf}.output.dense.bias"),
        Rule(f"{ours}/mlp_norm/scale", f"{hf}.output.LayerNorm.weight"),
        Rule(f"{ours}/mlp_norm/bias", f"{hf}.output.LayerNorm.bias")]
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
