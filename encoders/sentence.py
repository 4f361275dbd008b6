"""sentence-transformers directories: read, pool, write.

    spec = sentence.read(dir)        # None when `dir` has no modules.json
    spec.transformer_dir, spec.pooling, spec.max_seq_length, spec.dense, spec.normalize
    vecs = sentence.embed_fn(spec)(last_hidden_state, mask)   # jnp: pool -> Dense -> norm
    sentence.write(dir, spec)        # modules.json & co. beside an HF export

A directory is read as sentence-transformers reads it: `modules.json` lists the modules in
order: a Transformer (the HF model, at its `path`), then Pooling (`1_Pooling/config.json`:
cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken, several concatenated in
sentence-transformers' order), any Dense layers (`N_Dense/config.json` + safetensors) and
Normalize. `sentence_bert_config.json` gives `max_seq_length` and `do_lower_case` (directories saved by
sentence-transformers 5+ keep them in tokenizer_config.json's `model_max_length` and the
tokenizer's normalizer instead), `config_sentence_transformers.json` the prompts. Any other module is refused by name:
an embedding that silently skips a module is a wrong result.
"""
import dataclasses
import json
import os
from typing import Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy

# sentence-transformers' order when several modes are concatenated (its legacy flags' order)
MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_LEGACY = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
           "pooling_mode_mean_tokens": "mean",
           "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
           "pooling_mode_weightedmean_tokens": "weightedmean",
           "pooling_mode_lasttoken": "lasttoken"}
# Dense activations sentence-transformers stores by torch class path: name -> (fn, path)
_DENSE_ACTS = {
    "Tanh": (jnp.tanh, "torch.nn.modules.activation.Tanh"),
    "Identity": (lambda x: x, "torch.nn.modules.linear.Identity"),
    "ReLU": (jax.nn.relu, "torch.nn.modules.activation.ReLU"),
    "GELU": (lambda x: jax.nn.gelu(x, approximate=False), "torch.nn.modules.activation.GELU"),
    "Sigmoid": (jax.nn.sigmoid, "torch.nn.modules.activation.Sigmoid"),
    "SiLU": (jax.nn.silu, "torch.nn.modules.activation.SiLU"),
}
KINDS = ("Transformer", "Pooling", "Dense", "Normalize")


@dataclasses.dataclass(frozen=True)
class Dense:
  """One Dense module: y = act(x W^T + b) (W as torch stores it, (out, in))."""
  weight: np.ndarray
  bias: Optional[np.ndarray] = None
  activation: str = "Tanh"


@dataclasses.dataclass(frozen=True)
class Spec:
  """What sentence-transformers does after the transformer, and its input settings."""
  transformer_dir: str = ""
  pooling: Tuple[str, ...] = ("mean",)
  include_prompt: bool = True
  dense: Tuple[Dense, ...] = ()
  normalize: bool = False
  max_seq_length: Optional[int] = None
  do_lower_case: bool = False
  prompts: Dict[str, str] = dataclasses.field(default_factory=dict)
  default_prompt_name: Optional[str] = None
  similarity_fn_name: Optional[str] = None

  def prompt(self, prompt: Optional[str] = None, prompt_name: Optional[str] = None) -> str:
    """The text prepended to every input: `prompt`, else the named prompt, else the
    directory's default prompt, else none (as sentence-transformers resolves it)."""
    if prompt is not None:
      return prompt
    if prompt_name is not None:
      if prompt_name not in self.prompts:
        raise ValueError(f"prompt name {prompt_name!r} is not among the directory's prompts "
                         f"{sorted(self.prompts)}")
      return self.prompts[prompt_name]
    if self.default_prompt_name is not None:
      return self.prompts.get(self.default_prompt_name, "")
    return ""


def _json(path: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON ({e})") from None


def _kind(type_name: str) -> str:
  name = str(type_name).rsplit(".", 1)[-1]
  if not str(type_name).startswith("sentence_transformers.") or name not in KINDS:
    raise ValueError(f"modules.json names a module encoder-zoo does not implement: "
                     f"{type_name!r} (supported: {', '.join(KINDS)})")
  return name


def pooling_modes(config: dict, where: str = "pooling config") -> Tuple[str, ...]:
  """The pooling modes of a Pooling config, new (`pooling_mode`) or legacy (flags)."""
  if "pooling_mode" in config:
    modes = config["pooling_mode"]
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
  else:
    modes = tuple(mode for key, mode in _LEGACY.items() if config.get(key))
    modes = modes or ("mean",)
  for mode in modes:
    if mode not in MODES:
      raise ValueError(f"{where}: unknown pooling mode {mode!r}; supported: {MODES}")
  return modes


def _read_dense(path: str) -> Dense:
  cfg = _json(os.path.join(path, "config.json"))
  if cfg.get("use_residual"):
    raise ValueError(f"{path}: a Dense module with use_residual is not supported")
  for key in ("module_input_name", "module_output_name"):
    if cfg.get(key, "sentence_embedding") != "sentence_embedding":
      raise ValueError(f"{path}: a Dense module with {key} {cfg[key]!r} is not supported")
  act = str(cfg.get("activation_function", "torch.nn.modules.activation.Tanh"))
  name = act.rsplit(".", 1)[-1]
  if not act.startswith("torch.") or name not in _DENSE_ACTS:
    raise ValueError(f"{path}: Dense activation {act!r} is not supported "
                     f"(supported: {sorted(_DENSE_ACTS)})")
  weights = os.path.join(path, "model.safetensors")
  if not os.path.isfile(weights):
    raise ValueError(f"{path}: no model.safetensors (encoder-zoo never unpickles a "
                     "pytorch_model.bin; convert it to safetensors first)")
  try:
    with safetensors.safe_open(weights, framework="numpy") as f:
      tensors = {k: f.get_tensor(k).astype(np.float32) for k in f.keys()}
  except Exception as e:  # safetensors raises its own error types for a corrupt header
    raise ValueError(f"{weights}: not a readable safetensors file ({e})") from None
  want = {"linear.weight"} | ({"linear.bias"} if cfg.get("bias", True) else set())
  if set(tensors) != want:
    raise ValueError(f"{path}: Dense weights hold {sorted(tensors)}, expected {sorted(want)}")
  weight = tensors["linear.weight"]
  shape = (int(cfg["out_features"]), int(cfg["in_features"]))
  if weight.shape != shape:
    raise ValueError(f"{path}: linear.weight has shape {weight.shape}, config says {shape}")
  for key, x in tensors.items():
    if not np.isfinite(x).all():
      raise ValueError(f"{path}: {key} holds non-finite values (NaN or inf)")
  return Dense(weight, tensors.get("linear.bias"), name)


def read(path: str) -> Optional[Spec]:
  """The sentence-transformers spec of directory `path`, or None without modules.json."""
  modules_file = os.path.join(path, "modules.json")
  if not os.path.isfile(modules_file):
    return None
  modules = _json(modules_file)
  if not isinstance(modules, list) or not modules:
    raise ValueError(f"{modules_file}: expected a non-empty list of modules")
  modules = sorted(modules, key=lambda m: int(m.get("idx", 0)))
  kinds = [_kind(m.get("type", "")) for m in modules]
  if kinds[0] != "Transformer" or kinds.count("Transformer") != 1:
    raise ValueError(f"{modules_file}: the first (and only the first) module must be a "
                     f"Transformer; got {kinds}")
  tdir = os.path.join(path, modules[0].get("path", ""))
  settings = {}
  for name in ("sentence_bert_config.json", "sentence_roberta_config.json",
               "sentence_distilbert_config.json", "sentence_xlm-roberta_config.json",
               "sentence_albert_config.json", "sentence_camembert_config.json"):
    if os.path.isfile(os.path.join(tdir, name)):
      settings = _json(os.path.join(tdir, name))
      break
  task = settings.get("transformer_task", "feature-extraction")
  if task != "feature-extraction":
    raise ValueError(f"{tdir}: a Transformer module with transformer_task {task!r} is not "
                     "supported (only feature-extraction)")
  text = (settings.get("processing_kwargs") or {}).get("text") or {}
  fields = dict(transformer_dir=tdir,
                max_seq_length=settings.get("max_seq_length") or text.get("max_length"),
                do_lower_case=bool(settings.get("do_lower_case", False)))
  dense, pooled, normalize = [], False, False
  for m, kind in zip(modules[1:], kinds[1:]):
    where = os.path.join(path, m.get("path", ""))
    if normalize:
      raise ValueError(f"{modules_file}: {kind} after Normalize is not supported")
    if kind == "Pooling":
      if pooled:
        raise ValueError(f"{modules_file}: two Pooling modules")
      cfg = _json(os.path.join(where, "config.json"))
      fields["pooling"] = pooling_modes(cfg, where)
      fields["include_prompt"] = bool(cfg.get("include_prompt", True))
      pooled = True
    elif kind == "Dense":
      if not pooled:
        raise ValueError(f"{modules_file}: a Dense module before Pooling is not supported")
      dense.append(_read_dense(where))
    else:
      cfg_file = os.path.join(where, "config.json")
      cfg = _json(cfg_file) if os.path.isfile(cfg_file) else {}
      if cfg.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise ValueError(f"{where}: a Normalize module on {cfg['module_input_name']!r} is "
                         "not supported")
      normalize = True
  if not pooled:
    raise ValueError(f"{modules_file}: no Pooling module; token embeddings are not a "
                     "sentence embedding")
  top = os.path.join(path, "config_sentence_transformers.json")
  extra = _json(top) if os.path.isfile(top) else {}
  if extra.get("model_type", "SentenceTransformer") != "SentenceTransformer":
    raise ValueError(f"{top}: a {extra['model_type']} model is not a sentence embedding "
                     "model; encoder-zoo reads SentenceTransformer directories")
  prompts = {str(k): str(v) for k, v in (extra.get("prompts") or {}).items()}
  default = extra.get("default_prompt_name")
  if default is not None and default not in prompts:
    raise ValueError(f"{top}: default_prompt_name {default!r} is not among the prompts "
                     f"{sorted(prompts)}")
  return Spec(dense=tuple(dense), normalize=normalize, prompts=prompts,
              default_prompt_name=default,
              similarity_fn_name=extra.get("similarity_fn_name"), **fields)


def pool(hidden: jax.Array, mask: jax.Array, modes=("mean",), prompt_length=None) -> jax.Array:
  """(B,T,D) token states and a (B,T) mask of real tokens (right padded) -> (B, D*len(modes))
  float32, each mode as sentence-transformers computes it. `prompt_length` (B,) leaves each
  row's first tokens out of the pooling (Pooling's include_prompt=False)."""
  h = hidden.astype(jnp.float32)
  m = mask.astype(jnp.float32)
  if prompt_length is not None:
    pos = jnp.arange(m.shape[1])[None, :]
    m = jnp.where(pos < jnp.asarray(prompt_length)[:, None], 0.0, m)
  n = jnp.maximum(m.sum(1, keepdims=True), 1e-9)
  out = []
  for mode in modes:
    if mode == "cls":
      first = jnp.argmax(m, axis=1)
      out.append(jnp.take_along_axis(h, first[:, None, None], axis=1)[:, 0])
    elif mode == "max":  # finite fill: a row with no token stays finite (and its gradient)
      out.append(jnp.where(m[..., None] > 0, h, jnp.finfo(jnp.float32).min).max(1))
    elif mode == "mean":
      out.append(jnp.einsum("btd,bt->bd", h, m) / n)
    elif mode == "mean_sqrt_len_tokens":
      out.append(jnp.einsum("btd,bt->bd", h, m) / jnp.sqrt(n))
    elif mode == "weightedmean":
      w = m * jnp.arange(1, m.shape[1] + 1, dtype=jnp.float32)[None, :]
      out.append(jnp.einsum("btd,bt->bd", h, w) / jnp.maximum(w.sum(1, keepdims=True), 1e-9))
    elif mode == "lasttoken":
      last = jnp.maximum(m.sum(1).astype(jnp.int32) - 1, 0)
      if prompt_length is not None:
        last = last + jnp.asarray(prompt_length, jnp.int32)
      out.append(jnp.take_along_axis(h, last[:, None, None], axis=1)[:, 0]
                 * (m.sum(1) > 0)[:, None])
    else:
      raise ValueError(f"unknown pooling mode {mode!r}; supported: {MODES}")
  return jnp.concatenate(out, axis=-1)


def head(spec: Spec, pooled: jax.Array) -> jax.Array:
  """The Dense layers and Normalize after pooling."""
  x = pooled
  for d in spec.dense:
    x = x @ jnp.asarray(d.weight).T
    if d.bias is not None:
      x = x + jnp.asarray(d.bias)
    x = _DENSE_ACTS[d.activation][0](x)
  if spec.normalize:
    x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
  return x


def embed_fn(spec: Spec):
  """(last_hidden_state, mask[, prompt_length]) -> the directory's sentence embedding."""
  def fn(hidden, mask, prompt_length=None):
    return head(spec, pool(hidden, mask, spec.pooling,
                           None if spec.include_prompt else prompt_length))
  return fn


def write(path: str, spec: Spec, hidden_size: int) -> None:
  """Writes the sentence-transformers files into `path`, an HF model directory (the
  Transformer module at path ""): modules.json, 1_Pooling/config.json, N_Dense/,
  sentence_bert_config.json and config_sentence_transformers.json."""
  modules = [{"idx": 0, "name": "0", "path": "",
              "type": "sentence_transformers.models.Transformer"}]
  os.makedirs(os.path.join(path, "1_Pooling"), exist_ok=True)
  with open(os.path.join(path, "1_Pooling", "config.json"), "w") as f:
    json.dump({"embedding_dimension": hidden_size,
               "pooling_mode": spec.pooling[0] if len(spec.pooling) == 1 else list(spec.pooling),
               "include_prompt": spec.include_prompt}, f, indent=2)
  modules.append({"idx": 1, "name": "1", "path": "1_Pooling",
                  "type": "sentence_transformers.models.Pooling"})
  for d in spec.dense:
    i = len(modules)
    sub = f"{i}_Dense"
    os.makedirs(os.path.join(path, sub), exist_ok=True)
    with open(os.path.join(path, sub, "config.json"), "w") as f:
      json.dump({"in_features": int(d.weight.shape[1]), "out_features": int(d.weight.shape[0]),
                 "bias": d.bias is not None,
                 "activation_function": _DENSE_ACTS[d.activation][1]}, f, indent=2)
    tensors = {"linear.weight": np.asarray(d.weight, np.float32)}
    if d.bias is not None:
      tensors["linear.bias"] = np.asarray(d.bias, np.float32)
    safetensors.numpy.save_file(tensors, os.path.join(path, sub, "model.safetensors"))
    modules.append({"idx": i, "name": str(i), "path": sub,
                    "type": "sentence_transformers.models.Dense"})
  if spec.normalize:
    i = len(modules)
    modules.append({"idx": i, "name": str(i), "path": f"{i}_Normalize",
                    "type": "sentence_transformers.models.Normalize"})
  with open(os.path.join(path, "modules.json"), "w") as f:
    json.dump(modules, f, indent=2)
  with open(os.path.join(path, "sentence_bert_config.json"), "w") as f:
    json.dump({"max_seq_length": spec.max_seq_length, "do_lower_case": spec.do_lower_case},
              f, indent=2)
  with open(os.path.join(path, "config_sentence_transformers.json"), "w") as f:
    json.dump({"prompts": spec.prompts, "default_prompt_name": spec.default_prompt_name,
               "similarity_fn_name": spec.similarity_fn_name or "cosine"}, f, indent=2)
