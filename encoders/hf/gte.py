"""GTE <-> Hugging Face (GteModel, GteForMaskedLM and the task models).

NomicBERT's mapping (encoders/hf/nomicbert.py) with GTE's module names (those
save_pretrained writes and the released checkpoints carry: fused `qkv_proj`, `up_gate_proj`
= [up | gate] as our `wi`, `attn_ln`, `mlp_ln`) and its differences: biases on q, k, v, o
and down_proj, token types only when type_vocab_size > 0, the MLM head `lm_head.{dense,
norm, decoder}` (GELU always) with the decoder's own bias.
"""
from encoders import gte
from encoders.hf.mapping import register_mapping
from encoders.hf.nomicbert import NomicBertMapping, _COMMON


@register_mapping
class GteMapping(NomicBertMapping):
  model_types = ("gte",)
  architectures = {
      "GteModel": ("", ()),
      "GteForMaskedLM": ("gte", ("mlm",)),
  }
  tied = {"lm_head.decoder.weight": "embeddings.word_embeddings.weight"}
  consumed = _COMMON
  task_class_prefix = "Gte"
  family = "gte"
  fixed = {"attention_bias": True, "mlp_out_bias": True}
  default_theta = 160_000.0
  names = dict(layer="encoder.layer.{i}", qkv="attention.qkv_proj", out="attention.o_proj",
               wi="mlp.up_gate_proj", wo="mlp.down_proj", attention_norm="attn_ln",
               mlp_norm="mlp_ln", embedding_norm="embeddings.LayerNorm", mlm="lm_head",
               mlm_dense="dense", mlm_norm="norm", mlm_bias="decoder.bias")

  def defaults(self):
    m = gte.defaults()
    # GteConfig's defaults for keys a config.json may leave out
    m.vocab_size, m.pad_token_id, m.type_vocab_size = 250048, 1, 1
    return m

  def base_prefix(self, hf):
    return "gte"

  def mlm_act(self, cfg) -> str:
    return "gelu"
