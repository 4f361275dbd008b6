"""ALBERT <-> Hugging Face (AlbertModel, AlbertForMaskedLM, AlbertForPreTraining)."""
from encoders import albert as albert_family
from encoders.hf.bert import post_ln_layer_rules
from encoders.hf.mapping import Mapping, register_mapping
from encoders.hf.rules import PerLayer, Rule

ALBERT_LAYER = dict(qkv="attention.{}", out="attention.dense",
                    attention_norm="attention.LayerNorm", wi="ffn", wo="ffn_output",
                    mlp_norm="full_layer_layer_norm")

_CONSUMED = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers",
             "num_hidden_groups", "num_attention_heads", "intermediate_size",
             "inner_group_num", "hidden_act", "max_position_embeddings", "type_vocab_size",
             "layer_norm_eps", "pad_token_id", "classifier_dropout_prob")
_REQUIRED = {"position_embedding_type": "absolute", "is_decoder": False,
             "add_cross_attention": False, "tie_word_embeddings": True}


@register_mapping
class AlbertMapping(Mapping):
  model_types = ("albert",)
  architectures = {
      "AlbertModel": ("", ("pooler",)),
      "AlbertForMaskedLM": ("albert", ("mlm",)),
      "AlbertForPreTraining": ("albert", ("mlm", "sop")),
  }
  tied = {"predictions.decoder.weight": "embeddings.word_embeddings.weight",
          "predictions.decoder.bias": "predictions.bias"}
  ignorable = ("embeddings.position_ids", "embeddings.token_type_ids")
  consumed, required = _CONSUMED, _REQUIRED
  task_class_prefix = "Albert"

  def defaults(self):
    return albert_family.defaults()

  def config_from_hf(self, hf, heads):
    m = self.config_start(hf, heads)
    m.hidden_dropout_prob = hf.get("hidden_dropout_prob", 0.0)
    m.attention_probs_dropout_prob = hf.get("attention_probs_dropout_prob", 0.0)
    m.initializer_range = hf.get("initializer_range", 0.02)
    albert_family.layer_to_group(m)  # validates num_hidden_groups
    return m

  def config_to_hf(self, cfg):
    hf = {key: cfg[key] for key in _CONSUMED}
    hf.update(model_type="albert", hidden_dropout_prob=cfg.hidden_dropout_prob,
              attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
              initializer_range=cfg.initializer_range, position_embedding_type="absolute",
              tie_word_embeddings=True, bos_token_id=2, eos_token_id=3)
    heads = set(cfg.heads)
    if "nsp" in heads:
      raise ValueError("ALBERT has no NSP head in transformers (it has SOP)")
    if "sop" in heads:
      arch = "AlbertForPreTraining"
    elif "mlm" in heads:
      arch = "AlbertForMaskedLM"
    else:
      arch = "AlbertModel"
    return hf, arch

  def rules(self, cfg):
    layer = post_ln_layer_rules(cfg, "encoder/group_{g}/layer_{j}",
                                "encoder.albert_layer_groups.{g}.albert_layers.{j}",
                                ALBERT_LAYER)
    groups = [{"g": g, "j": j} for g in range(cfg.num_hidden_groups)
              for j in range(cfg.inner_group_num)]
    r = [Rule("embeddings/word_embeddings/embedding", "embeddings.word_embeddings.weight",
              "embedding", vocab=True),
         Rule("embeddings/position_embeddings/embedding",
              "embeddings.position_embeddings.weight", "embedding"),
         Rule("embeddings/token_type_embeddings/embedding",
              "embeddings.token_type_embeddings.weight", "embedding"),
         Rule("embeddings/norm/scale", "embeddings.LayerNorm.weight"),
         Rule("embeddings/norm/bias", "embeddings.LayerNorm.bias"),
         Rule("embeddings/projection/kernel", "encoder.embedding_hidden_mapping_in.weight",
              "linear"),
         Rule("embeddings/projection/bias", "encoder.embedding_hidden_mapping_in.bias"),
         PerLayer(layer, groups)]
    heads = set(cfg.heads)
    if heads & {"pooler", "sop"}:
      r += [Rule("pooler/dense/kernel", "pooler.weight", "linear"),
            Rule("pooler/dense/bias", "pooler.bias")]
    if "mlm" in heads:
      r += [Rule("mlm/transform/kernel", "predictions.dense.weight", "linear", base=False),
            Rule("mlm/transform/bias", "predictions.dense.bias", base=False),
            Rule("mlm/norm/scale", "predictions.LayerNorm.weight", base=False),
            Rule("mlm/norm/bias", "predictions.LayerNorm.bias", base=False),
            Rule("mlm/bias", "predictions.bias", base=False, vocab=True)]
    if "sop" in heads:
      r += [Rule("sop/dense/kernel", "sop_classifier.classifier.weight", "linear",
                 base=False),
            Rule("sop/dense/bias", "sop_classifier.classifier.bias", base=False)]
    return r
