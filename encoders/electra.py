"""ELECTRA (Clark et al. 2020): BERT's post-LN layers with an embedding width E that may
differ from the hidden size H, a generator MLM head and a discriminator RTD head.

- Embeddings are V x E, LayerNorm'd, then projected E -> H when E != H (HF's
  `embeddings_project`; absent when E == H, as in ELECTRA-base and -large).
- "mlm" (the generator's head, HF ElectraForMaskedLM): dense H -> E, GELU (always GELU in
  transformers, whatever `hidden_act`), LayerNorm, decoder tied to the E-wide word
  embeddings, plus a bias.
- "rtd" (the discriminator's head, HF ElectraForPreTraining): dense H -> H, `hidden_act`,
  dense H -> 1: one logit per token, > 0 meaning "replaced".
There is no pooler in transformers' ElectraModel, so the default heads are ("rtd",).
The replaced-token-detection objective itself lives in objectives/rtd.py and works with
any family; this file only wires the model.
"""
import functools

import ml_collections

from encoders import base, bert, heads, layers, model, tasks

# Clark et al. 2020, Table 6: layers, hidden, heads, embedding size (discriminators; the
# generators are these scaled by objective.generator_width, see configs/electra.py).
VARIANTS = {
    "tiny": (2, 128, 2, 128),
    "small": (12, 256, 4, 128),
    "base": (12, 768, 12, 768),
    "large": (24, 1024, 16, 1024),
}


def defaults(variant: str = "base") -> ml_collections.ConfigDict:
  """The model section of an ELECTRA discriminator config (HF ElectraConfig's names)."""
  layers_, hidden, n_heads, emb = VARIANTS[variant]
  m = bert.defaults()
  m.family = "electra"
  m.variant = variant
  m.embedding_size = emb
  m.hidden_size = hidden
  m.num_hidden_layers = layers_
  m.num_attention_heads = n_heads
  m.intermediate_size = 4 * hidden
  m.heads = ("rtd",)  # subset of: mlm (generator), rtd (discriminator)
  del m["position_style"]
  return m


def rtd_head_flops(t: int, d: int) -> int:
  """The RTD head on T tokens: dense D -> D, then D -> 1."""
  return 2 * t * d * d + 2 * t * d


def forward_flops(cfg, seq_len: int, mlm_positions=None) -> float:
  """The E -> H projection (when E != H), L BERT layers, the MLM head over its positions
  (transform H -> E, decoder E -> V) and the RTD head on every token."""
  t, d, e = seq_len, cfg.hidden_size, cfg.embedding_size
  total = (2 * t * e * d if e != d else 0)
  total += cfg.num_hidden_layers * bert.layer_flops(t, d, cfg.intermediate_size)
  total += bert.head_flops(cfg, t, d, e, mlm_positions)
  if "rtd" in cfg.heads:
    total += rtd_head_flops(t, d)
  return float(total)


@base.register_family("electra")
class Electra(model.Encoder):
  """BERT's layers with factorized (E != H) embeddings, ELECTRA's MLM and RTD heads."""
  defaults = staticmethod(defaults)
  forward_flops = staticmethod(forward_flops)

  @staticmethod
  def task_heads(cfg):
    """transformers' ELECTRA heads: pooled = classifier.dense + GELU on the first token
    (no pooler), then classifier.out_proj; tokens and spans: one linear layer."""
    return {"pooled": tasks.Head(pooling="cls", act="gelu",
                                 hf={"dense": "classifier.dense",
                                     "out": "classifier.out_proj"}),
            "per_token": tasks.Head(hf={"out": "classifier"}),
            "span": tasks.Head(dropout=0.0, hf={"out": "qa_outputs"})}

  def parts(self) -> model.Parts:
    c = self.config
    dtype = layers.dtype_from_name(c.dtype)
    std = c.initializer_range
    block = bert.post_ln_block(c, dtype)
    project = c.hidden_size if c.embedding_size != c.hidden_size else 0
    return model.Parts(
        embeddings=functools.partial(
            layers.Embeddings, vocab_size=base.padded_vocab_size(c),
            embedding_size=c.embedding_size, max_position_embeddings=c.max_position_embeddings,
            type_vocab_size=c.type_vocab_size, layer_norm_eps=c.layer_norm_eps,
            dropout_rate=c.hidden_dropout_prob, projection_size=project, init_std=std,
            dtype=dtype),
        stack=functools.partial(layers.Stack, c.num_hidden_layers, lambda i: block,
                                scan=c.get("scan_layers", False)),
        heads={"mlm": functools.partial(heads.MlmHead, c.vocab_size, c.embedding_size, "gelu",
                                        c.layer_norm_eps, std, dtype),
               "rtd": functools.partial(heads.RtdHead, c.hidden_size, c.hidden_act, std,
                                        dtype)})
