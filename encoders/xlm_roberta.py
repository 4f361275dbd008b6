"""XLM-RoBERTa (Conneau et al. 2020) on the generic encoder: RoBERTa's network (bert.py's
post-LN layers, positions numbered from pad_token_id + 1, one token type, the LM head
tied to the word embeddings) over a 250,002-entry SentencePiece vocabulary.

The vocabulary is most of the parameters (192M of base's 278M), so its table is padded
to `vocab_pad_multiple` = 1024 rows (250,880; the padded rows are never predicted): every
power-of-two count of shards up to 1024 divides it, each shard a multiple of the TPU's
128 lanes up to 8 shards, so the `vocab` axis (the embedding, the MLM bias, the logits)
splits evenly over the `tensor` axis and, with `mesh.shard_state_over_data`, over `data`.
"""
import ml_collections

from encoders import base, bert

# Conneau et al. 2020, Table 7 (and the released configs): layers, hidden, heads.
VARIANTS = {
    "tiny": (2, 128, 2),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}
VOCAB_SIZE = 250_002
VOCAB_PAD_MULTIPLE = 1024


def defaults(variant: str = "base") -> ml_collections.ConfigDict:
  """The model section of an XLM-R config: bert.defaults() (HF's names) with RoBERTa's
  settings and XLM-R's vocabulary."""
  n_layers, hidden, n_heads = VARIANTS[variant]
  m = bert.defaults()
  m.family = "xlm-roberta"
  m.variant = variant
  m.vocab_size = VOCAB_SIZE
  m.hidden_size = hidden
  m.num_hidden_layers = n_layers
  m.num_attention_heads = n_heads
  m.intermediate_size = 4 * hidden
  m.max_position_embeddings = 514
  m.type_vocab_size = 1
  m.layer_norm_eps = 1e-5
  m.pad_token_id = 1
  m.position_style = "roberta"
  m.heads = ("mlm",)  # subset of: pooler, mlm (XLM-R has no NSP head)
  m.vocab_pad_multiple = VOCAB_PAD_MULTIPLE
  return m


@base.register_family("xlm-roberta")
class XlmRoberta(bert.Bert):
  """XLM-R: RoBERTa's wiring, FLOPs and task heads (bert.Bert) under its own family name,
  so its HF mapping (model_type "xlm-roberta") and size table are its own."""
  defaults = staticmethod(defaults)

  def parts(self):
    if "nsp" in self.config.heads:
      raise ValueError("XLM-RoBERTa has no NSP head; heads may be pooler and mlm")
    if self.config.position_style != "roberta":
      raise ValueError(f"XLM-RoBERTa numbers positions RoBERTa's way; got position_style="
                       f"{self.config.position_style!r}")
    return super().parts()
