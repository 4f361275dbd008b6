"""ELECTRA <-> Hugging Face (ElectraModel, ElectraForMaskedLM = the generator,
ElectraForPreTraining = the discriminator)."""
from encoders import electra as electra_family
from encoders.hf.bert import BERT_LAYER, post_ln_layer_rules
from encoders.hf.mapping import Mapping, register_mapping
from encoders.hf.rules import PerLayer, Rule, layer_indices

_CONSUMED = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers",
             "num_attention_heads", "intermediate_size", "hidden_act",
             "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "pad_token_id")
# Read by transformers' sequence-summary head (multiple choice) only: they never change the
# encoder's numbers, and export writes transformers' defaults.
_SUMMARY = {"summary_type": "first", "summary_use_proj": True, "summary_activation": "gelu",
            "summary_last_dropout": 0.1}
_REQUIRED = {"position_embedding_type": "absolute", "is_decoder": False,
             "add_cross_attention": False, "tie_word_embeddings": True}


@register_mapping
class ElectraMapping(Mapping):
  model_types = ("electra",)
  architectures = {
      "ElectraModel": ("", ()),
      "ElectraForMaskedLM": ("electra", ("mlm",)),
      "ElectraForPreTraining": ("electra", ("rtd",)),
  }
  tied = {"generator_lm_head.weight": "embeddings.word_embeddings.weight"}
  ignorable = ("embeddings.position_ids", "embeddings.token_type_ids")
  consumed, handled, required = _CONSUMED, tuple(_SUMMARY), _REQUIRED
  task_class_prefix = "Electra"

  def defaults(self):
    return electra_family.defaults()

  def config_from_hf(self, hf, heads):
    m = self.config_start(hf, heads)
    m.hidden_dropout_prob = hf.get("hidden_dropout_prob", 0.1)
    m.attention_probs_dropout_prob = hf.get("attention_probs_dropout_prob", 0.1)
    m.initializer_range = hf.get("initializer_range", 0.02)
    return m

  def config_to_hf(self, cfg):
    hf = {key: cfg[key] for key in _CONSUMED}
    hf.update(_SUMMARY)
    hf.update(model_type="electra", hidden_dropout_prob=cfg.hidden_dropout_prob,
              attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
              initializer_range=cfg.initializer_range, position_embedding_type="absolute",
              tie_word_embeddings=True)
    heads = set(cfg.heads)
    if heads - {"mlm", "rtd"}:
      raise ValueError(f"ELECTRA has no {sorted(heads - {'mlm', 'rtd'})} head in "
                       "transformers (it has mlm: ElectraForMaskedLM, rtd: "
                       "ElectraForPreTraining)")
    if heads == {"mlm", "rtd"}:
      raise ValueError("transformers has no ELECTRA class with both the generator (mlm) and "
                       "discriminator (rtd) heads; export them as two models")
    arch = ("ElectraForPreTraining" if "rtd" in heads else
            "ElectraForMaskedLM" if "mlm" in heads else "ElectraModel")
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
    if cfg.embedding_size != cfg.hidden_size:
      r += [Rule("embeddings/projection/kernel", "embeddings_project.weight", "linear"),
            Rule("embeddings/projection/bias", "embeddings_project.bias")]
    heads = set(cfg.heads)
    if "mlm" in heads:
      r += [Rule("mlm/transform/kernel", "generator_predictions.dense.weight", "linear",
                 base=False),
            Rule("mlm/transform/bias", "generator_predictions.dense.bias", base=False),
            Rule("mlm/norm/scale", "generator_predictions.LayerNorm.weight", base=False),
            Rule("mlm/norm/bias", "generator_predictions.LayerNorm.bias", base=False),
            Rule("mlm/bias", "generator_lm_head.bias", base=False, vocab=True)]
    if "rtd" in heads:
      r += [Rule("rtd/dense/kernel", "discriminator_predictions.dense.weight", "linear",
                 base=False),
            Rule("rtd/dense/bias", "discriminator_predictions.dense.bias", base=False),
            Rule("rtd/prediction/kernel", "discriminator_predictions.dense_prediction.weight",
                 "linear", base=False),
            Rule("rtd/prediction/bias", "discriminator_predictions.dense_prediction.bias",
                 base=False)]
    return r
