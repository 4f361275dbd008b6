"""DistilBERT <-> Hugging Face (DistilBertModel, DistilBertForMaskedLM).

HF's config names differ from ours (dim, n_layers, n_heads, hidden_dim, activation,
dropout, attention_dropout). With `sinusoidal_pos_embds` the position table is still a
parameter, as in transformers v5 (which initialises it to the sin/cos table and trains
it): the stored table is loaded as it is, fine-tuned or not, and export writes ours.
"""
from encoders import distilbert as distilbert_family
from encoders.hf.mapping import Mapping, register_mapping
from encoders.hf.rules import PerLayer, Rule, layer_indices

# HF name -> ours
_RENAMED = {"vocab_size": "vocab_size", "dim": "hidden_size", "n_layers": "num_hidden_layers",
            "n_heads": "num_attention_heads", "hidden_dim": "intermediate_size",
            "activation": "hidden_act", "max_position_embeddings": "max_position_embeddings",
            "pad_token_id": "pad_token_id", "sinusoidal_pos_embds": "sinusoidal_pos_embds",
            "seq_classif_dropout": "seq_classif_dropout", "qa_dropout": "qa_dropout"}
# Read for the dropout rates; `intermediate_size` is not a DistilBertConfig field (its
# width is `hidden_dim`): transformers stores and ignores it, and so do we.
_OTHER = ("dropout", "attention_dropout", "intermediate_size")
_REQUIRED = {"is_decoder": False, "add_cross_attention": False, "tie_word_embeddings": True}


sinusoidal_table = distilbert_family.sinusoidal_table  # HF's formula (float64 -> float32)


def layer_rules(cfg):
  """One DistilBERT layer: our `encoder/layer_{i}/...` <-> HF `transformer.layer.{i}...`."""
  d, h = cfg.hidden_size, cfg.num_attention_heads
  qkv, out = (d, h, d // h), (h, d // h, d)
  ours, hf = "encoder/layer_{i}", "transformer.layer.{i}"
  r = []
  for name, short in (("query", "q"), ("key", "k"), ("value", "v")):
    r += [Rule(f"{ours}/attention/{name}/kernel", f"{hf}.attention.{short}_lin.weight",
               "linear", shape=qkv),
          Rule(f"{ours}/attention/{name}/bias", f"{hf}.attention.{short}_lin.bias",
               shape=qkv[1:])]
  r += [Rule(f"{ours}/attention/out/kernel", f"{hf}.attention.out_lin.weight", "linear",
             shape=out, n_in=2),
        Rule(f"{ours}/attention/out/bias", f"{hf}.attention.out_lin.bias")]
  for part, key in (("attention_norm", "sa_layer_norm"), ("mlp_norm", "output_layer_norm")):
    r += [Rule(f"{ours}/{part}/scale", f"{hf}.{key}.weight"),
          Rule(f"{ours}/{part}/bias", f"{hf}.{key}.bias")]
  for part, key in (("mlp/wi", "ffn.lin1"), ("mlp/wo", "ffn.lin2")):
    r += [Rule(f"{ours}/{part}/kernel", f"{hf}.{key}.weight", "linear"),
          Rule(f"{ours}/{part}/bias", f"{hf}.{key}.bias")]
  return r


@register_mapping
class DistilBertMapping(Mapping):
  model_types = ("distilbert",)
  architectures = {
      "DistilBertModel": ("", ()),
      "DistilBertForMaskedLM": ("distilbert", ("mlm",)),
  }
  tied = {"vocab_projector.weight": "embeddings.word_embeddings.weight"}
  ignorable = ("embeddings.position_ids",)
  renamed, handled, required = _RENAMED, _OTHER, _REQUIRED
  task_class_prefix = "DistilBert"

  def defaults(self):
    return distilbert_family.defaults()

  def config_from_hf(self, hf, heads):
    m = self.config_start(hf, heads)
    m.sinusoidal_pos_embds = bool(m.sinusoidal_pos_embds)
    m.hidden_dropout_prob = hf.get("dropout", 0.1)
    m.attention_probs_dropout_prob = hf.get("attention_dropout", 0.1)
    m.initializer_range = hf.get("initializer_range", 0.02)
    return m

  def config_to_hf(self, cfg):
    hf = {theirs: cfg[ours] for theirs, ours in _RENAMED.items()}
    hf.update(model_type="distilbert", dropout=cfg.hidden_dropout_prob,
              attention_dropout=cfg.attention_probs_dropout_prob,
              initializer_range=cfg.initializer_range, tie_word_embeddings=True)
    if cfg.layer_norm_eps != 1e-12:
      raise ValueError(f"transformers' DistilBERT fixes LayerNorm eps at 1e-12; this model "
                       f"has layer_norm_eps={cfg.layer_norm_eps}")
    if cfg.get("type_vocab_size", 0):
      raise ValueError("DistilBERT has no token types (type_vocab_size must be 0)")
    arch = "DistilBertForMaskedLM" if "mlm" in cfg.heads else "DistilBertModel"
    return hf, arch

  def rules(self, cfg):
    r = [Rule("embeddings/word_embeddings/embedding", "embeddings.word_embeddings.weight",
              "embedding", vocab=True),
         Rule("embeddings/position_embeddings/embedding",
              "embeddings.position_embeddings.weight", "embedding"),
         Rule("embeddings/norm/scale", "embeddings.LayerNorm.weight"),
         Rule("embeddings/norm/bias", "embeddings.LayerNorm.bias"),
         PerLayer(layer_rules(cfg), layer_indices(cfg.num_hidden_layers))]
    if "mlm" in cfg.heads:
      r += [Rule("mlm/transform/kernel", "vocab_transform.weight", "linear", base=False),
            Rule("mlm/transform/bias", "vocab_transform.bias", base=False),
            Rule("mlm/norm/scale", "vocab_layer_norm.weight", base=False),
            Rule("mlm/norm/bias", "vocab_layer_norm.bias", base=False),
            Rule("mlm/bias", "vocab_projector.bias", base=False, vocab=True)]
    return r
