"""Task heads on the generic encoder: sequence classification / regression, token
classification, extractive QA, and masked mean-pooled embeddings, for every family.

    model = tasks.build(config.model, "sequence", num_labels=3)   # or tasks.from_hf(dir)
    out = model.apply({"params": params}, input_ids, attention_mask, token_type_ids)
    out.logits            # sequence (B,N) | token (B,T,N)
    # packed rows: segment_ids=(B,T) (1, 2, ... per example, 0 = padding); a sequence
    # head's logits are then (B,T,N), each example's at its first token
    out.start_logits, out.end_logits                              # qa (B,T)
    tasks.embed(model_or_encoder, params, ids, mask)              # (B,D) masked mean

The task model shares the family encoder's scope (`nn.share_scope`), so its params are the
encoder's own tree (`embeddings`, `encoder`, `pooler`, ...) plus one head,
`<task>_head/{dense,norm,out}`: a pretrained checkpoint's params load as they are, and
the HF rules of the base model apply unchanged.

Tasks (TASKS): "sequence" (classification; num_labels=1 is regression), "token"
(a label per token; the data pipeline labels the first sub-token of each word and sets the
rest to -100), "qa" (start and end logits; num_labels is 2).

WHAT A FAMILY MUST DECLARE (a family that has not fails `tasks.build`, `from_hf` and
tests/encoders/test_task_heads.py with a message pointing here):

1. In encoders/<family>.py, a static method on the registered class:

       @staticmethod
       def task_heads(cfg) -> tasks.TaskHeads

   one `tasks.Head` per task, the family's own convention in transformers:
     pooling   (sequence only) "pooler": the family's "pooler" head output (BERT, ALBERT:
               tanh(dense([CLS]))); "cls": the first token's hidden state; "mean": the
               mean over real (attention_mask=1) tokens.
     act       None, or the activation of a dense D->D transform before the output layer
               (RoBERTa "tanh", ELECTRA "gelu", DistilBERT "relu", ModernBERT its act).
     norm      a LayerNorm after that transform (ModernBERT's prediction head);
               norm_bias whether that norm has a bias; norm_eps its epsilon (None: the
               model's layer_norm_eps).
     dropout   the classifier dropout rate (None: classifier_dropout,
               classifier_dropout_prob or hidden_dropout_prob of the config, in that order).
   Every task a family declares is built from these same three parts.

2. In encoders/hf/<family>.py, a method on the family's `Mapping`:

       def task_hf(self, cfg, task) -> tasks.TaskHF   # None: transformers has no such model

   `TaskHF(architecture, modules)`: the transformers class name
   ("BertForSequenceClassification") and where our head's parts live in its files
   (modules={"dense": "classifier.dense", "out": "classifier.out_proj"}); the base model's
   tensors are under the mapping's `base_prefix`, as in the family's other architectures.
   A family whose head does not fit dense/norm/out gives `rules` (a list of
   `encoders.hf.Rule`, paths under `<task>_head/`) instead of `modules`.

Everything else (building, parity with transformers' task models, import/export with
`id2label`, padding invariance, fine-tuning, pipelines) is generic.
"""
import dataclasses
from typing import Dict, Optional, Sequence, Tuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections

from encoders import base, layers

TASKS = ("sequence", "token", "qa")
POOLINGS = ("pooler", "cls", "mean")


@dataclasses.dataclass(frozen=True)
class Head:
  """One task head of a family: [pool] -> [dropout, dense, act, norm] -> dropout -> out."""
  pooling: str = "cls"
  act: Optional[str] = None
  norm: bool = False
  norm_bias: bool = True
  norm_eps: Optional[float] = None
  dropout: Optional[float] = None
  dense_bias: bool = True  # False: the D->D transform has no bias (ModernBERT's default)
  pre_dropout: bool = True  # dropout before the transform (False: ModernBERT's head)


@dataclasses.dataclass(frozen=True)
class TaskHeads:
  """A family's heads; a task left None is not available for that family."""
  sequence: Optional[Head] = None
  token: Optional[Head] = None
  qa: Optional[Head] = None


@dataclasses.dataclass(frozen=True)
class TaskHF:
  """A family's transformers task model: the class name, and the HF module name of each
  of our head parts ("dense", "norm", "out") — or explicit `rules`."""
  architecture: str
  modules: Optional[Dict[str, str]] = None
  rules: Optional[Sequence] = None


@flax.struct.dataclass
class TaskOutput:
  """logits: sequence (B,N), token (B,T,N); start/end_logits: qa (B,T); pooled (B,D):
  what the sequence head classified (before its transform), else None."""
  last_hidden_state: jax.Array
  logits: Optional[jax.Array] = None
  start_logits: Optional[jax.Array] = None
  end_logits: Optional[jax.Array] = None
  pooled: Optional[jax.Array] = None


def _undeclared(family: str, what: str) -> ValueError:
  return ValueError(
      f"family {family!r} has not declared task heads ({what}); add a static "
      f"`task_heads(cfg) -> tasks.TaskHeads` to its class in encoders/{family}.py and "
      f"`task_hf(self, cfg, task) -> tasks.TaskHF` to its Mapping in "
      f"encoders/hf/{family}.py — see the docstring of encoders/tasks.py")


def family_heads(cfg) -> TaskHeads:
  """The family's declared TaskHeads for model config `cfg` (ValueError if none)."""
  name = cfg.get("family", "bert")
  declare = getattr(base.family(name), "task_heads", None)
  if declare is None:
    raise _undeclared(name, "no task_heads on the family class")
  heads = declare(cfg)
  if not isinstance(heads, TaskHeads):
    raise ValueError(f"family {name!r}: task_heads must return tasks.TaskHeads, got "
                     f"{type(heads).__name__}")
  return heads


def head_spec(cfg, task: str) -> Head:
  if task not in TASKS:
    raise ValueError(f"unknown task {task!r}; choose from {TASKS}")
  spec = getattr(family_heads(cfg), task)
  if spec is None:
    raise ValueError(f"family {cfg.get('family', 'bert')!r} declares no {task!r} head")
  if spec.pooling not in POOLINGS:
    raise ValueError(f"pooling {spec.pooling!r} is not one of {POOLINGS}")
  return spec


def encoder_heads(cfg, task: str) -> Tuple[str, ...]:
  """The encoder heads a task model needs: ("pooler",) when its sequence head classifies
  the family's pooler output, else none (no MLM/NSP work while fine-tuning)."""
  if task == "sequence" and head_spec(cfg, task).pooling == "pooler":
    return ("pooler",)
  return ()


def dropout_rate(cfg, spec: Head) -> float:
  if spec.dropout is not None:
    return spec.dropout
  for key in ("classifier_dropout", "classifier_dropout_prob", "hidden_dropout_prob"):
    if cfg.get(key) is not None:
      return float(cfg.get(key))
  return 0.0


def mean_pool(hidden, attention_mask):
  """(B,T,D), (B,T) -> (B,D): the mean over real tokens only, in float32, so padding never
  changes it (a row with no real token gives zeros, not NaN)."""
  if attention_mask is None:
    return hidden.astype(jnp.float32).mean(1)
  m = attention_mask.astype(jnp.float32)[..., None]
  total = (hidden.astype(jnp.float32) * m).sum(1)
  return total / jnp.maximum(m.sum(1), 1.0)


class TaskHead(nn.Module):
  """[pool] -> [dropout, dense D->D, act, LayerNorm] -> dropout -> dense to num_outputs."""
  spec: Head
  num_outputs: int
  hidden_size: int
  layer_norm_eps: float = 1e-12
  dropout_rate: float = 0.0
  init_std: float = 0.02
  dtype: layers.Dtype = jnp.float32

  @nn.compact
  def __call__(self, x, deterministic=True):
    s = self.spec
    if s.act is not None:
      if s.pre_dropout:
        x = layers.Dropout(self.dropout_rate)(x, deterministic=deterministic)
      x = layers.Dense((self.hidden_size,), ("embed", "mlp"), use_bias=s.dense_bias,
                       init_std=self.init_std, dtype=self.dtype, name="dense")(x)
      x = layers.activation(s.act)(x)
    if s.norm:
      eps = s.norm_eps if s.norm_eps is not None else self.layer_norm_eps
      x = layers.LayerNorm(eps, use_bias=s.norm_bias, dtype=self.dtype, name="norm")(x)
    x = layers.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    y = layers.Dense((self.num_outputs,), ("embed", None), init_std=self.init_std,
                     dtype=self.dtype, name="out")(x)
    return y.astype(jnp.float32)


class TaskModel(nn.Module):
  """The family encoder (sharing this module's scope) plus one task head."""
  config: object  # the model section (FrozenConfigDict), heads set by `build`
  task: str
  num_labels: int = 2
  labels: Tuple[str, ...] = ()  # id -> label name (HF id2label); kept through export

  def setup(self):
    spec = head_spec(self.config, self.task)
    self.spec = spec
    self.backbone = base.family(self.config.get("family", "bert"))(config=self.config)
    nn.share_scope(self, self.backbone)
    c = self.config
    n = 2 if self.task == "qa" else self.num_labels
    setattr(self, f"{self.task}_head", TaskHead(
        spec, n, c.hidden_size, c.get("layer_norm_eps", 1e-12), dropout_rate(c, spec),
        c.get("initializer_range", 0.02), layers.dtype_from_name(c.dtype)))

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
               segment_ids=None, position_ids=None, deterministic=True):
    if segment_ids is not None and self.task == "qa":
      raise ValueError("packed rows (segment_ids) are not supported for the qa task: its "
                       "start/end softmax runs over a whole row")
    out = self.backbone(input_ids, attention_mask, token_type_ids, segment_ids=segment_ids,
                        position_ids=position_ids, deterministic=deterministic)
    h = out.last_hidden_state
    head = getattr(self, f"{self.task}_head")
    if self.task == "sequence" and segment_ids is not None:
      pooled = self._pool_segments(h, segment_ids)
      return TaskOutput(h, logits=head(pooled, deterministic), pooled=pooled)
    if self.task == "sequence":
      pooling = self.spec.pooling
      pooled = (out.pooler_output if pooling == "pooler" else h[:, 0] if pooling == "cls"
                else mean_pool(h, attention_mask).astype(h.dtype))
      return TaskOutput(h, logits=head(pooled, deterministic), pooled=pooled)
    logits = head(h, deterministic)
    if self.task == "token":
      return TaskOutput(h, logits=logits)
    return TaskOutput(h, start_logits=logits[..., 0], end_logits=logits[..., 1])


  def _pool_segments(self, h, segment_ids):
    """Packed rows (B,T,D), (B,T) segment ids -> (B,T,D): at every token, what the
    family's pooling gives for that token's example (segment). An example's own pooled
    vector is the one at its first token, which is where packed batches put its label
    (launch/data/finetune_data.pack_rows); the head runs on every token, a D x D (or
    D x N) matmul per token, small beside the encoder."""
    pooling = self.spec.pooling
    if pooling == "cls":  # the segment's first token is its [CLS]
      return h
    if pooling == "pooler":  # the family's pooler applied to each token as a first token
      b, t, d = h.shape
      return self.backbone.pooler(h.reshape(b * t, 1, d)).reshape(b, t, -1)
    # mean: each token gets the float32 mean over the real tokens of its segment
    seg = segment_ids.astype(jnp.int32)
    same = ((seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)).astype(jnp.float32)
    total = jnp.einsum("bts,bsd->btd", same, h.astype(jnp.float32))
    return (total / jnp.maximum(same.sum(-1), 1.0)[..., None]).astype(h.dtype)


def task_config(model_config, task: str):
  """The model section a task model runs its encoder with: the family's config with
  `heads` set to what the task needs (MLM / NSP / SOP heads dropped)."""
  cfg = ml_collections.ConfigDict(model_config.to_dict() if hasattr(model_config, "to_dict")
                                  else dict(model_config))
  cfg.heads = encoder_heads(cfg, task)
  base.resolve_auto(cfg)
  return ml_collections.FrozenConfigDict(cfg)


def build(model_config, task: str, num_labels: int = 2,
          labels: Sequence[str] = ()) -> TaskModel:
  """model section + task -> an unbound TaskModel. `labels` (names, index = class id)
  sets num_labels when given."""
  labels = tuple(str(x) for x in labels)
  if labels:
    num_labels = len(labels)
  if task == "qa":
    num_labels = 2
  if num_labels < 1:
    raise ValueError(f"num_labels must be >= 1, got {num_labels}")
  cfg = task_config(model_config, task)
  head_spec(cfg, task)  # errors early for an undeclared family / task
  return TaskModel(config=cfg, task=task, num_labels=num_labels, labels=labels)


def init_params(model: TaskModel, rng, batch_size=1, length=8):
  """Random float32 params of a task model (unboxed); jitted, as eager init is slow."""
  ids = jnp.zeros((batch_size, length), jnp.int32)
  return nn.unbox(jax.jit(model.init)(rng, ids))["params"]


def head_name(task: str) -> str:
  return f"{task}_head"


def with_pretrained(params: dict, pretrained: dict) -> Tuple[dict, Tuple[str, ...]]:
  """Task params with every encoder tensor `pretrained` has replaced by it (the head and
  anything the checkpoint lacks, e.g. BERT's pooler from an MLM-only run, stay as
  initialised). Returns (params, the paths left at their init)."""
  left = []

  def merge(ours, theirs, prefix):
    out = {}
    for key, value in ours.items():
      path = f"{prefix}/{key}" if prefix else key
      if isinstance(value, dict):
        out[key] = merge(value, theirs.get(key, {}) if isinstance(theirs, dict) else {}, path)
      elif isinstance(theirs, dict) and key in theirs:
        if tuple(theirs[key].shape) != tuple(value.shape):
          raise ValueError(f"pretrained {path} has shape {tuple(theirs[key].shape)}, the "
                           f"task model's is {tuple(value.shape)}")
        out[key] = jnp.asarray(theirs[key], value.dtype)
      else:
        out[key] = value
        left.append(path)
    return out

  return merge(params, pretrained, ""), tuple(left)


def embed(model, params, input_ids, attention_mask, token_type_ids=None, normalize=True):
  """Masked mean-pooled sentence embeddings (B,D) from any encoder or task model's last
  hidden state (sentence-transformers' mean pooling); unit length when `normalize`."""
  out = model.apply({"params": params}, input_ids, attention_mask, token_type_ids)
  v = mean_pool(out.last_hidden_state, attention_mask)
  if normalize:
    v = v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-12)
  return v
