"""ALBERT (Lan et al. 2020): factorized embeddings and cross-layer parameter sharing.

- Embeddings are V x E (E = `embedding_size`, 128 in the paper), then projected E -> H.
- The `num_hidden_layers` layer applications share `num_hidden_groups` parameter groups:
  application i runs group floor(i * G / L); a group is `inner_group_num` post-LN layers
  (BERT's layer) run in order. Params: `encoder/group_<g>/layer_<j>/...`.
  With `scan_layers`, each run of applications of one group is an `nn.scan` with the
  group's params broadcast (one compiled layer body; the params are not stacked).
- The MLM head transforms H -> E before decoding against the E-wide word embeddings.
- Sentence-order prediction (SOP) is a 2-way classifier on the tanh pooler.
"""
import functools

import ml_collections

from encoders import base, bert, heads, layers, model, tasks

# Lan et al. 2020, Table 1 (and the released v2 models): layers, hidden, heads, E.
VARIANTS = {
    "tiny": (2, 128, 2, 64),
    "base": (12, 768, 12, 128),
    "large": (24, 1024, 16, 128),
    "xlarge": (24, 2048, 16, 128),
    "xxlarge": (12, 4096, 64, 128),
}


def defaults(variant: str = "base") -> ml_collections.ConfigDict:
  """The model section of an ALBERT config (HF AlbertConfig's names)."""
  layers_, hidden, n_heads, emb = VARIANTS[variant]
  m = bert.defaults()
  m.family = "albert"
  m.variant = variant
  m.vocab_size = 30000
  m.embedding_size = emb
  m.hidden_size = hidden
  m.num_hidden_layers = layers_
  m.num_attention_heads = n_heads
  m.intermediate_size = 4 * hidden
  m.num_hidden_groups = 1
  m.inner_group_num = 1
  m.hidden_act = "gelu_new"
  # ALBERT v2 trains without dropout (Lan et al. 2020, Section 4.8).
  m.hidden_dropout_prob = 0.0
  m.attention_probs_dropout_prob = 0.0
  m.classifier_dropout_prob = 0.1
  m.heads = ("mlm", "sop")  # subset of: pooler, mlm, sop
  del m["position_style"]
  return m


def layer_to_group(cfg):
  """Group of each of the `num_hidden_layers` layer applications (HF's int(i / (L / G)))."""
  n, g = cfg.num_hidden_layers, cfg.num_hidden_groups
  if not 1 <= g <= n:
    raise ValueError(f"num_hidden_groups={g} must be in [1, num_hidden_layers={n}]")
  return tuple(int(i / (n / g)) for i in range(n))


def forward_flops(cfg, seq_len: int, mlm_positions=None) -> float:
  """The E -> H projection 2TEH, L x inner_group_num BERT layers, the pooler (+ SOP) and
  the MLM head over its positions (transform H -> E, decoder E -> V)."""
  t, d, e = seq_len, cfg.hidden_size, cfg.embedding_size
  n_layers = cfg.num_hidden_layers * cfg.inner_group_num
  total = 2 * t * e * d + n_layers * bert.layer_flops(t, d, cfg.intermediate_size)
  return float(total + bert.head_flops(cfg, t, d, e, mlm_positions))


@base.register_family("albert")
class Albert(model.Encoder):
  """BERT's layers and heads with factorized embeddings, shared layer groups and SOP."""
  defaults = staticmethod(defaults)
  forward_flops = staticmethod(forward_flops)

  @staticmethod
  def task_heads(cfg):
    """Pooled: the tanh pooler, then the classifier; tokens and spans: one linear layer."""
    return {"pooled": tasks.Head(pooling="pooler", hf={"out": "classifier"}),
            "per_token": tasks.Head(hf={"out": "classifier"}),
            "span": tasks.Head(dropout=0.0, hf={"out": "qa_outputs"})}

  @staticmethod
  def scan_params(cfg, params):
    return params  # a scan over shared groups broadcasts their params: nothing is stacked

  @staticmethod
  def unscan_params(cfg, params):
    return params

  def parts(self) -> model.Parts:
    c = self.config
    dtype = layers.dtype_from_name(c.dtype)
    std = c.initializer_range
    block = bert.post_ln_block(c, dtype)
    group = functools.partial(layers.Sequence, (block,) * c.inner_group_num)
    return model.Parts(
        embeddings=functools.partial(
            layers.Embeddings, vocab_size=base.padded_vocab_size(c),
            embedding_size=c.embedding_size, max_position_embeddings=c.max_position_embeddings,
            type_vocab_size=c.type_vocab_size, layer_norm_eps=c.layer_norm_eps,
            dropout_rate=c.hidden_dropout_prob, projection_size=c.hidden_size, init_std=std,
            dtype=dtype),
        stack=functools.partial(layers.Stack, c.num_hidden_layers, lambda g: group,
                                layer_to_param=layer_to_group(c), param_name="group",
                                scan=c.get("scan_layers", False)),
        heads={"pooler": functools.partial(heads.Pooler, c.hidden_size, std, dtype),
               "mlm": functools.partial(heads.MlmHead, c.vocab_size, c.embedding_size,
                                        c.hidden_act, c.layer_norm_eps, std, dtype),
               "sop": functools.partial(heads.Classifier, 2, std, dtype)})
