"""NomicBERT <-> Hugging Face (NomicBertModel, NomicBertForMaskedLM and the task models).

The layout transformers' save_pretrained writes, which is the released checkpoints' (its
loader renames it to its modules): a fused `Wqkv` ("split" onto our q, k, v kernels), the
MLP's fc11 (up) and fc12 (gate), one "concat" rule onto our fused [up | gate] `wi`
kernel, `emb_ln`, `norm1` / `norm2` after attention / MLP. `rope_parameters`
(or the older `rope_theta` / `rope_scaling`) is read into rope_theta, rope_type and
rope_factor. GTE's mapping (encoders/hf/gte.py) is this one with other module names.
"""
from encoders import nomicbert
from encoders.hf.mapping import Mapping, register_mapping
from encoders.hf.rules import PerLayer, Rule, layer_indices

_COMMON = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
           "intermediate_size", "hidden_act", "max_position_embeddings", "type_vocab_size",
           "layer_norm_eps", "pad_token_id", "hidden_dropout_prob",
           "attention_probs_dropout_prob", "initializer_range", "classifier_dropout")
_ROPE_KEYS = {"rope_type", "type", "rope_theta", "factor", "partial_rotary_factor"}


def rope_from_hf(hf: dict, default_theta: float):
  """(rope_theta, rope_type, rope_factor) of a config.json; a RoPE variant transformers runs
  differently from ours is refused, naming it."""
  rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  extra = sorted(set(rope) - _ROPE_KEYS)
  if extra:
    raise ValueError(f"config.json's rope_parameters set {extra}, which encoder-zoo does not "
                     "implement")
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind not in nomicbert.ROPE_TYPES:
    raise ValueError(f"config.json's rope_type {kind!r} is not implemented; encoder-zoo "
                     f"implements {nomicbert.ROPE_TYPES}")
  if rope.get("partial_rotary_factor", 1.0) != 1.0:
    raise ValueError("config.json sets partial_rotary_factor="
                     f"{rope['partial_rotary_factor']}; transformers rotates the whole head "
                     "dim in this family, and so does encoder-zoo")
  theta = float(rope.get("rope_theta", hf.get("rope_theta", default_theta)))
  factor = float(rope.get("factor", 1.0)) if kind != "default" else 1.0
  if kind != "default" and "factor" not in rope:
    raise ValueError(f"config.json's rope_type {kind!r} needs a factor")
  return theta, kind, factor


def rope_to_hf(cfg) -> dict:
  rope = {"rope_type": cfg.rope_type, "rope_theta": cfg.rope_theta}
  if cfg.rope_type != "default":
    rope["factor"] = cfg.rope_factor
  return rope


@register_mapping
class NomicBertMapping(Mapping):
  model_types = ("nomic_bert",)
  architectures = {
      "NomicBertModel": ("", ()),
      "NomicBertForMaskedLM": ("nomic_bert", ("mlm",)),
  }
  tied = {"cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"}
  consumed = _COMMON + ("head_dim",)
  handled = ("rope_parameters", "rope_theta", "rope_scaling")
  required = {"tie_word_embeddings": True}
  task_class_prefix = "NomicBert"
  family = "nomic_bert"
  # What transformers' class of this family has, which our config must match on export:
  fixed = {"attention_bias": False, "mlp_out_bias": False}
  default_theta = 1000.0
  # The checkpoints' module names (what transformers' save_pretrained writes, and the
  # released files); our fused `wi` is [up | gate] (`Mlp(act_second=True)`).
  names = dict(layer="encoder.layers.{i}", qkv="attn.Wqkv", out="attn.out_proj",
               wi=("mlp.fc11", "mlp.fc12"), wo="mlp.fc2", attention_norm="norm1",
               mlp_norm="norm2", embedding_norm="emb_ln", mlm="cls.predictions",
               mlm_dense="transform.dense", mlm_norm="transform.layer_norm", mlm_bias="bias")

  def defaults(self):
    return nomicbert.defaults()

  def base_prefix(self, hf):
    return "nomic_bert"

  def task_architecture(self, cfg, task):
    if task.head_kind == "span":  # transformers has no ...ForQuestionAnswering here
      return None
    return super().task_architecture(cfg, task)

  def config_from_hf(self, hf, heads):
    m = self.config_start(hf, heads)
    m.family = self.family
    m.head_dim = hf.get("head_dim") or m.hidden_size // m.num_attention_heads
    m.rope_theta, m.rope_type, m.rope_factor = rope_from_hf(hf, self.default_theta)
    m.mlm_act = self.mlm_act(m)
    nomicbert.validate(m)
    return m

  def mlm_act(self, cfg) -> str:
    """The MLM head's activation in transformers' class: NomicBERT's is hidden_act."""
    return cfg.hidden_act

  def config_to_hf(self, cfg):
    wrong = {k: cfg[k] for k, v in self.fixed.items() if cfg[k] != v}
    if cfg.mlm_act != self.mlm_act(cfg):
      wrong["mlm_act"] = cfg.mlm_act
    if wrong:
      raise ValueError(f"transformers' {self.task_class_prefix} has no equivalent of "
                       f"{wrong}; it fixes {self.fixed} and mlm_act={self.mlm_act(cfg)!r}")
    hf = {key: cfg[key] for key in self.consumed}
    hf.update(model_type=self.model_types[0], tie_word_embeddings=True,
              rope_parameters=rope_to_hf(cfg))
    names = list(self.architectures)
    return hf, names[1] if "mlm" in cfg.heads else names[0]

  def rules(self, cfg):
    h, k = cfg.num_attention_heads, cfg.head_dim
    qkv, out = (cfg.hidden_size, h, k), (h, k, cfg.hidden_size)
    n = self.names
    ours, theirs = "encoder/layer_{i}", n["layer"]
    names = ("query", "key", "value")
    layer = [Rule(tuple(f"{ours}/attention/{x}/kernel" for x in names),
                  f"{theirs}.{n['qkv']}.weight", "split", of="linear", shape=qkv),
             Rule(f"{ours}/attention/out/kernel", f"{theirs}.{n['out']}.weight", "linear",
                  shape=out, n_in=2)]
    if cfg.attention_bias:
      layer += [Rule(tuple(f"{ours}/attention/{x}/bias" for x in names),
                     f"{theirs}.{n['qkv']}.bias", "split", of="vector", shape=qkv[1:]),
                Rule(f"{ours}/attention/out/bias", f"{theirs}.{n['out']}.bias")]
    wi = n["wi"]
    layer += [Rule(f"{ours}/mlp/wi/kernel", f"{theirs}.{wi}.weight", "linear")
              if isinstance(wi, str) else
              Rule(f"{ours}/mlp/wi/kernel", tuple(f"{theirs}.{w}.weight" for w in wi),
                   "concat", of="linear"),
              Rule(f"{ours}/mlp/wo/kernel", f"{theirs}.{n['wo']}.weight", "linear")]
    if cfg.mlp_out_bias:
      layer.append(Rule(f"{ours}/mlp/wo/bias", f"{theirs}.{n['wo']}.bias"))
    for part in ("attention_norm", "mlp_norm"):
      layer += [Rule(f"{ours}/{part}/scale", f"{theirs}.{n[part]}.weight"),
                Rule(f"{ours}/{part}/bias", f"{theirs}.{n[part]}.bias")]
    r = [Rule("embeddings/word_embeddings/embedding", "embeddings.word_embeddings.weight",
              "embedding", vocab=True),
         Rule("embeddings/norm/scale", f"{n['embedding_norm']}.weight"),
         Rule("embeddings/norm/bias", f"{n['embedding_norm']}.bias"),
         PerLayer(layer, layer_indices(cfg.num_hidden_layers))]
    if cfg.type_vocab_size:
      r.append(Rule("embeddings/token_type_embeddings/embedding",
                    "embeddings.token_type_embeddings.weight", "embedding"))
    if "pooler" in cfg.heads:
      r += [Rule("pooler/dense/kernel", "pooler.dense.weight", "linear"),
            Rule("pooler/dense/bias", "pooler.dense.bias")]
    if "mlm" in cfg.heads:
      p = n["mlm"]
      r += [Rule("mlm/transform/kernel", f"{p}.{n['mlm_dense']}.weight", "linear", base=False),
            Rule("mlm/transform/bias", f"{p}.{n['mlm_dense']}.bias", base=False),
            Rule("mlm/norm/scale", f"{p}.{n['mlm_norm']}.weight", base=False),
            Rule("mlm/norm/bias", f"{p}.{n['mlm_norm']}.bias", base=False),
            Rule("mlm/bias", f"{p}.{n['mlm_bias']}", base=False, vocab=True)]
    return r
