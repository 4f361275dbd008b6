"""The fine-tuning task unit (`Task`), its registry, and the one task model (`TaskModel`)
that every task and family share.

A task subclasses `Task` and registers itself (`@register`): its head kind, data reader
and row encoder, loss, scorer and prediction records, HF class suffix and pipeline
function. Shared code asks the registered task (`get(name)`) and never compares a name.

Head kinds: "pooled" (one vector per example, pooled the family's way), "per_token" (a
vector per token), "span" (per token, two outputs: start and end). A family declares
each kind it supports once, as a `Head`, in `task_heads(cfg) -> {kind: Head}` on its class
(encoders/<family>.py); its HF mapping gives the transformers class-name prefix ("Bert"),
and the task the suffix ("ForTokenClassification"). A task with `head_kind = None` gets no
head: its outputs carry the masked mean of the last hidden state as `pooled`.

Params: the family encoder's own tree (`embeddings`, `encoder`, `pooler`, ...: the task
model shares its scope, so a pretrained checkpoint loads as it is) plus one head,
`<task>_head/{dense,norm,out}`.
"""
import dataclasses
import os
from typing import Dict, List, Optional, Sequence, Tuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from encoders import base, layers
from encoders.tasks import data

HEAD_KINDS = ("pooled", "per_token", "span")
POOLINGS = ("pooler", "cls", "mean", "late")
SEQ = "T"  # a batch field's per-row shape entry that stands for the row width
SEQ2 = "T2"  # a second row width (objectives/spec.py): a second text role, cut on its own
IGNORE = data.IGNORE


@dataclasses.dataclass(frozen=True)
class Head:
  """One head kind of a family: [pool] -> [dropout, dense D->D, act, norm] -> dropout -> out.

  pooling   (pooled heads) "pooler": the family's pooler output (BERT, ALBERT); "cls": the
            first token's hidden state; "mean": the mean over real tokens; "late": the
            whole head on every token, then the mean of its outputs over real tokens
            (EuroBERT's default: transformers averages the per-token logits).
  act       None, or the activation of the dense D->D transform before the output layer.
  norm      a LayerNorm after that transform; norm_bias, norm_eps (None: the model's).
  dropout   the classifier dropout rate (None: classifier_dropout,
            classifier_dropout_prob or hidden_dropout_prob of the config, in that order).
  hf        the transformers module of each part that exists: {"dense": ..., "norm": ...,
            "out": ...}, e.g. {"dense": "classifier.dense", "out": "classifier.out_proj"}.
  """
  pooling: str = "cls"
  act: Optional[str] = None
  norm: bool = False
  norm_bias: bool = True
  norm_eps: Optional[float] = None
  dropout: Optional[float] = None
  dense_bias: bool = True  # False: the D->D transform has no bias (ModernBERT's default)
  pre_dropout: bool = True  # dropout before the transform (False: ModernBERT's head)
  hf: Dict[str, str] = dataclasses.field(default_factory=dict, hash=False)


@flax.struct.dataclass
class TaskOutput:
  """logits: pooled heads (B,N), per-token heads (B,T,N); start/end_logits: span heads
  (B,T); pooled (B,D): what a pooled head classified (before its transform), else None."""
  last_hidden_state: jax.Array
  logits: Optional[jax.Array] = None
  start_logits: Optional[jax.Array] = None
  end_logits: Optional[jax.Array] = None
  pooled: Optional[jax.Array] = None


# ---- the registry -----------------------------------------------------------------------

_TASKS: Dict[str, "Task"] = {}


def register(cls):
  """Class decorator: registers an instance of the Task subclass under `cls.name`."""
  if not cls.name:
    raise ValueError(f"{cls.__name__} sets no task name")
  if cls.head_kind is not None and cls.head_kind not in HEAD_KINDS:
    raise ValueError(f"task {cls.name!r}: head_kind {cls.head_kind!r} is not one of "
                     f"{HEAD_KINDS} (or None: no head)")
  _TASKS[cls.name] = cls()
  return cls


def get(name) -> "Task":
  """The registered task `name`; ValueError naming the registered ones."""
  if name not in _TASKS:
    raise ValueError(f"unknown task {name!r}; registered: {sorted(_TASKS)}")
  return _TASKS[name]


def names() -> Tuple[str, ...]:
  return tuple(sorted(_TASKS))


def registered() -> Tuple["Task", ...]:
  return tuple(_TASKS[n] for n in names())


# ---- losses -------------------------------------------------------------------------------

def weighted_ce(logits, labels, weights):
  """(loss sum, correct sum) of the softmax cross-entropy over the last axis: each
  position weighted, and positions of weight 0 in neither sum (their labels may be
  IGNORE, their logits anything)."""
  logits = logits.astype(jnp.float32)
  counted = weights != 0
  safe = jnp.where(counted, labels, 0).astype(jnp.int32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  ce = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
  right = jnp.argmax(logits, axis=-1) == safe
  return (jnp.sum(jnp.where(counted, ce * weights, 0.0)),
          jnp.sum(jnp.where(counted & right, weights, 0.0)))


def majority_accuracy(train_batches, eval_items) -> Dict[str, float]:
  """The accuracy of always predicting the training rows' most frequent class (`labels`,
  IGNORE left out) on the eval rows; {} when there is no training label."""
  train = np.concatenate([np.asarray(b["labels"]).ravel() for b in train_batches])
  train = train[train != IGNORE]
  if train.size == 0:
    return {}
  majority = np.bincount(train).argmax()
  gold = np.concatenate([np.asarray(b["labels"]).ravel() for b, _ in eval_items])
  gold = gold[gold != IGNORE]
  return {"task_majority_accuracy": float(np.mean(gold == majority)) if gold.size else 0.0}


# ---- the task unit ------------------------------------------------------------------------

class Task:
  """One fine-tuning task. Subclass, set the class attributes, override what differs from
  the defaults (single-label classification of `labels` by cross-entropy), and decorate
  with `@register`.

  The data methods read `f`, the config's `finetune` section; `bad` is the run's bad-data
  policy (encoders/tasks/data.py). Batches hold `input_ids`, `attention_mask`,
  `token_type_ids` (B,T) and the task's label fields; `example_weight` (B,) is 0 on rows
  that only pad a batch. Packed batches (`packable`) put several examples in a row:
  `segment_ids` (B,T), and per-token `labels` with `label_weight` (B,T) (an example-level
  label at its example's first token).
  """
  name: str = ""
  head_kind: Optional[str] = "pooled"
  num_outputs: Optional[int] = None  # the head's width when fixed (None: one per label)
  hf_suffix: Optional[str] = None  # "ForSequenceClassification"; None: no HF class
  output_fields: Tuple[str, ...] = ("logits",)  # the TaskOutput fields the scorer reads
  per_token: bool = False  # the output fields have a token axis (B,T,...)
  token_labels: bool = False  # `labels` (B,T), IGNORE where not scored; else (B,)
  label_dtype: str = "int32"
  packable: bool = True
  named_labels: bool = True  # finetune.labels / id2label name the classes
  formats: Tuple[str, ...] = ()  # finetune.data_format values `read` knows
  metrics: Tuple[str, ...] = ()  # what `score` returns (numbers)
  selection: str = ""  # the metric that picks the best epoch (finetune.selection_metric)
  # Several texts per row (`<prefix>input_ids`, ...): the field prefixes cut to one width
  # together, per group (None: every text of a row at the width of the longest)
  width_groups: Optional[Tuple[Tuple[str, ...], ...]] = None

  @property
  def head_name(self) -> str:
    return f"{self.name}_head"

  # ---- the model ----------------------------------------------------------------------

  def outputs(self, hidden, logits, pooled) -> TaskOutput:
    """The head's output (logits; None without a head) as the task's TaskOutput."""
    return TaskOutput(hidden, logits=logits, pooled=pooled)

  def pad_value(self, field: str) -> float:
    """What an output field is padded with where a batch was cut short of the row width
    (per-token fields): a value that predicts nothing there."""
    return 0.0

  # ---- Hugging Face ---------------------------------------------------------------------

  def hf_claims(self, hf: dict) -> bool:
    """Whether an HF config.json of this task's class (prefix + hf_suffix) is this task's
    (sequence and regression share a class; problem_type tells them apart)."""
    return True

  def hf_labels(self, hf: dict) -> Tuple[str, ...]:
    """The label names of an HF config.json (id2label in id order)."""
    if not self.named_labels:
      return ()
    id2label = hf.get("id2label") or {}
    ids = sorted(int(k) for k in id2label)
    if ids != list(range(len(ids))):
      raise ValueError(f"id2label ids must be 0..N-1, got {ids}")
    return tuple(str(id2label[str(i)] if str(i) in id2label else id2label[i]) for i in ids)

  def hf_entries(self, labels: Tuple[str, ...], num_labels: int) -> dict:
    """The config.json entries an export adds (id2label / label2id)."""
    if not self.named_labels:
      return {}
    if labels and len(labels) != num_labels:
      raise ValueError(f"{len(labels)} labels for a {num_labels}-way head")
    labels = labels or tuple(f"LABEL_{i}" for i in range(num_labels))
    return {"id2label": {str(i): n for i, n in enumerate(labels)},
            "label2id": {n: i for i, n in enumerate(labels)}}

  # ---- data ---------------------------------------------------------------------------

  def config_errors(self, f, seq_len: int) -> List[str]:
    """One message per bad `finetune.*` setting of this task (checked before any read):
    the data files, the label names, packing."""
    errs = self.source_errors(f)
    given = tuple(f.get("labels", ()) or ())
    if given and not self.named_labels:
      errs.append(f"finetune.labels={list(given)} is for classification; the {self.name!r} "
                  "task has none")
    elif given:
      try:
        self.label_set((), given)
        if len(given) < 2:
          errs.append(f"finetune.labels={list(given)}: a classifier needs 2 or more labels")
      except ValueError as e:
        errs.append(str(e))
    if f.get("packing", False) and not self.packable:
      errs.append(f"finetune.packing=True packs rows for the tasks that allow it, not "
                  f"{self.name!r}")
    return errs

  def source_errors(self, f) -> List[str]:
    """What is wrong with the settings that name the rows (files: `train_file`,
    `eval_file`)."""
    errs = []
    for key in ("train_file", "eval_file"):
      path = str(f.get(key, "") or "")
      if key == "train_file" and not path:
        errs.append("finetune.train_file is empty: name the training file")
      elif path and "://" not in path and not os.path.isfile(path):
        errs.append(f"finetune.{key}={path!r} does not exist")
    return errs

  def has_eval(self, f) -> bool:
    """Whether the settings name eval rows (else a held-out part of the training rows)."""
    return bool(f.get("eval_file", ""))

  def read(self, f, split: str, bad) -> Optional[Tuple[list, str]]:
    """(rows, their source's name) of split "train" or "eval"; None when no eval rows
    are given. Files: `read_file`."""
    path = f.train_file if split == "train" else f.get("eval_file", "")
    if not path:
      return None
    return self.read_file(path, f, bad), path

  def read_file(self, path: str, f, bad) -> list:
    raise NotImplementedError(f"task {self.name!r} reads no files")

  def label_set(self, values, given=()) -> Tuple[str, ...]:
    """The class names: `given` (finetune.labels) checked, else those of `values`."""
    return data.label_names(values, given)

  def labels(self, train, evals, f, bad, skipped: Dict[str, int],
             names: Tuple[str, str]) -> Tuple[Tuple[str, ...], list, list]:
    """-> (label names, train rows, eval rows): rows with a label outside the set follow
    finetune.unknown_eval_labels (skipped ones counted by label in `skipped`); `names`
    name the two sources in messages."""
    return (), train, evals

  def encode(self, tok, rows, f, seq_len: int, pad_id: int, labels) -> Tuple[Dict, Dict]:
    """(arrays of the rows, what scoring needs besides the rows)."""
    raise NotImplementedError

  def score(self, outputs: Dict[str, np.ndarray], info: Dict, labels, f
            ) -> Tuple[Dict, List[Dict]]:
    """(metrics, one prediction record per eval row) from the eval rows' outputs
    (`output_fields`, numpy) and `info` ({"rows": eval rows, ...encode's info})."""
    raise NotImplementedError

  def report(self, metrics: Dict, labels, directory: str, title: str = "") -> List[str]:
    """Files beyond predictions.jsonl that show the best epoch's `metrics` (a confusion
    matrix), written into `directory`; returns their paths."""
    return []

  # ---- training -------------------------------------------------------------------------

  def batch_fields(self, packed: bool = False) -> Dict[str, Tuple[tuple, str]]:
    """{name: (per-row shape, SEQ for the row width; dtype)} of a batch."""
    text = {k: ((SEQ,), "int32") for k in ("input_ids", "attention_mask", "token_type_ids")}
    if packed:
      return dict(text, segment_ids=((SEQ,), "int32"), labels=((SEQ,), self.label_dtype),
                  label_weight=((SEQ,), "float32"))
    return dict(text, example_weight=((), "float32"),
                labels=((SEQ,) if self.token_labels else (), self.label_dtype))

  def random_labels(self, rng, shape, num_labels: int) -> np.ndarray:
    if self.label_dtype.startswith("float"):
      return rng.randn(*shape).astype(self.label_dtype)
    return rng.randint(0, num_labels, shape).astype(self.label_dtype)

  def synth_labels(self, rng, mask, first, num_labels: int, packed: bool) -> Dict:
    """Valid label fields for synthetic rows: `mask` (B,T) real tokens, `first` (B,T)
    each example's first token."""
    b, width = mask.shape
    if packed:
      scored = mask > 0 if self.token_labels else first
      empty = 0.0 if self.label_dtype.startswith("float") else IGNORE
      labels = np.where(scored, self.random_labels(rng, (b, width), num_labels), empty)
      return {"labels": labels.astype(self.label_dtype),
              "label_weight": scored.astype(np.float32)}
    if self.token_labels:
      return {"labels": np.where(mask > 0, self.random_labels(rng, (b, width), num_labels),
                                 IGNORE).astype(self.label_dtype)}
    return {"labels": self.random_labels(rng, (b,), num_labels)}

  def label_weights(self, batch):
    """The weight of each scored label: packed rows' `label_weight` (B,T); else
    `example_weight` (B,), per token (B,T) when labels are per token (0 at IGNORE)."""
    if "label_weight" in batch:
      return batch["label_weight"].astype(jnp.float32)
    w = batch["example_weight"].astype(jnp.float32)
    return w[:, None] * (batch["labels"] != IGNORE) if self.token_labels else w

  def loss(self, out: TaskOutput, batch) -> Tuple[Dict, Dict]:
    """(term sums, metric sums): {"task": loss sum}, normalised by the sum of
    `label_weights`; metrics task_loss_sum, task_weight_sum (+ task_correct_sum)."""
    w = self.label_weights(batch)
    loss_sum, correct = weighted_ce(out.logits, batch["labels"], w)
    return {"task": loss_sum}, {"task_loss_sum": loss_sum, "task_correct_sum": correct,
                                "task_weight_sum": jnp.sum(w)}

  def baselines(self, train_batches, eval_items) -> Dict[str, float]:
    return {}

  # ---- inference ------------------------------------------------------------------------

  def pipeline(self, p, *args, **kwargs):
    """The inference helper of encoders/pipelines.py for this task's models."""
    raise ValueError(f"the {self.name!r} task has no pipeline function")


# ---- the task model -----------------------------------------------------------------------

def _undeclared(family: str, what: str) -> ValueError:
  return ValueError(
      f"family {family!r} has not declared task heads ({what}); add a static "
      f"`task_heads(cfg) -> {{kind: tasks.Head}}` to its class in encoders/{family}.py "
      f"and a `task_prefix` to its Mapping in encoders/hf/{family}.py — see the docstring "
      "of encoders/tasks/base.py")


def family_heads(cfg) -> Dict[str, Head]:
  """The family's declared heads {kind: Head} for model config `cfg` (ValueError if none)."""
  name = cfg.get("family", "bert")
  declare = getattr(base.family(name), "task_heads", None)
  if declare is None:
    raise _undeclared(name, "no task_heads on the family class")
  heads = declare(cfg)
  if not isinstance(heads, dict) or not all(isinstance(h, Head) for h in heads.values()):
    raise ValueError(f"family {name!r}: task_heads must return {{kind: tasks.Head}}, got "
                     f"{heads!r}")
  unknown = sorted(set(heads) - set(HEAD_KINDS))
  if unknown:
    raise ValueError(f"family {name!r} declares head kinds {unknown}; known: {HEAD_KINDS}")
  return heads


def head_spec(cfg, kind: str) -> Head:
  """The family's Head of `kind`; ValueError when it declares none."""
  spec = family_heads(cfg).get(kind)
  if spec is None:
    raise ValueError(f"family {cfg.get('family', 'bert')!r} declares no {kind!r} head")
  if spec.pooling not in POOLINGS:
    raise ValueError(f"pooling {spec.pooling!r} is not one of {POOLINGS}")
  return spec


def encoder_heads(cfg, task: Task) -> Tuple[str, ...]:
  """The encoder heads a task model needs: ("pooler",) when its pooled head classifies
  the family's pooler output, else none (no MLM/NSP work while fine-tuning)."""
  if task.head_kind == "pooled" and head_spec(cfg, "pooled").pooling == "pooler":
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
  """The family encoder (sharing this module's scope) plus the task's head."""
  config: object  # the model section (FrozenConfigDict), heads set by `build`
  task: str  # a registered task's name
  num_labels: int = 2  # the head's width
  labels: Tuple[str, ...] = ()  # id -> label name (HF id2label); kept through export

  def setup(self):
    unit = get(self.task)
    self.backbone = base.family(self.config.get("family", "bert"))(config=self.config)
    nn.share_scope(self, self.backbone)
    if unit.head_kind is None:
      return
    c = self.config
    spec = head_spec(c, unit.head_kind)
    self.spec = spec
    setattr(self, unit.head_name, TaskHead(
        spec, self.num_labels, c.hidden_size, c.get("layer_norm_eps", 1e-12),
        dropout_rate(c, spec), c.get("initializer_range", 0.02),
        layers.dtype_from_name(c.dtype)))

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
               segment_ids=None, position_ids=None, deterministic=True):
    unit = get(self.task)
    if segment_ids is not None and not unit.packable:
      raise ValueError(f"packed rows (segment_ids) are not supported for the {self.task} "
                       "task: its outputs are read over a whole row")
    out = self.backbone(input_ids, attention_mask, token_type_ids, segment_ids=segment_ids,
                        position_ids=position_ids, deterministic=deterministic)
    h = out.last_hidden_state
    if unit.head_kind is None:
      return unit.outputs(h, None, mean_pool(h, attention_mask))
    head = getattr(self, unit.head_name)
    if unit.head_kind != "pooled":
      return unit.outputs(h, head(h, deterministic), None)
    if self.spec.pooling == "late":  # the head per token, its outputs averaged
      per_token = head(h, deterministic)
      logits = (self._segment_mean(per_token, segment_ids) if segment_ids is not None
                else mean_pool(per_token, attention_mask))
      return unit.outputs(h, logits, None)
    if segment_ids is not None:
      pooled = self._pool_segments(h, segment_ids)
    else:
      pooling = self.spec.pooling
      pooled = (out.pooler_output if pooling == "pooler" else h[:, 0] if pooling == "cls"
                else mean_pool(h, attention_mask).astype(h.dtype))
    return unit.outputs(h, head(pooled, deterministic), pooled)

  def _pool_segments(self, h, segment_ids):
    """Packed rows (B,T,D), (B,T) segment ids -> (B,T,D): at every token, what the
    family's pooling gives for that token's example (segment). An example's own pooled
    vector is the one at its first token, which is where packed batches put its label;
    the head runs on every token, a D x D (or D x N) matmul per token, small beside the
    encoder."""
    pooling = self.spec.pooling
    if pooling == "cls":  # the segment's first token is its [CLS]
      return h
    if pooling == "pooler":  # the family's pooler applied to each token as a first token
      b, t, d = h.shape
      return self.backbone.pooler(h.reshape(b * t, 1, d)).reshape(b, t, -1)
    return self._segment_mean(h, segment_ids).astype(h.dtype)

  @staticmethod
  def _segment_mean(x, segment_ids):
    """(B,T,F), (B,T) -> (B,T,F) float32: at each token, the mean over the real tokens of
    its segment."""
    seg = segment_ids.astype(jnp.int32)
    same = ((seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)).astype(jnp.float32)
    total = jnp.einsum("bts,bsd->btd", same, x.astype(jnp.float32))
    return total / jnp.maximum(same.sum(-1), 1.0)[..., None]


def task_config(model_config, task: str):
  """The model section a task model runs its encoder with: the family's config with
  `heads` set to what the task needs (MLM / NSP / SOP heads dropped)."""
  cfg = ml_collections.ConfigDict(model_config.to_dict() if hasattr(model_config, "to_dict")
                                  else dict(model_config))
  cfg.heads = encoder_heads(cfg, get(task))
  base.resolve_auto(cfg)
  return ml_collections.FrozenConfigDict(cfg)


def build(model_config, task: str, num_labels: int = 2,
          labels: Sequence[str] = ()) -> TaskModel:
  """model section + task name -> an unbound TaskModel. `labels` (names, index = class
  id) set num_labels when given; a task with a fixed head width (qa: 2) sets its own."""
  unit = get(task)
  labels = tuple(str(x) for x in labels) if unit.named_labels else ()
  if labels:
    num_labels = len(labels)
  if unit.num_outputs is not None:
    num_labels = unit.num_outputs
  if num_labels < 1:
    raise ValueError(f"num_labels must be >= 1, got {num_labels}")
  cfg = task_config(model_config, task)
  if unit.head_kind is not None:
    head_spec(cfg, unit.head_kind)  # errors early for an undeclared family / kind
  return TaskModel(config=cfg, task=task, num_labels=num_labels, labels=labels)


def init_params(model: TaskModel, rng, batch_size=1, length=8):
  """Random float32 params of a task model (unboxed); jitted, as eager init is slow."""
  ids = jnp.zeros((batch_size, length), jnp.int32)
  return nn.unbox(jax.jit(model.init)(rng, ids))["params"]


def embed(model, params, input_ids, attention_mask, token_type_ids=None, normalize=True):
  """Masked mean-pooled sentence embeddings (B,D) from any encoder or task model's last
  hidden state (sentence-transformers' mean pooling); unit length when `normalize`."""
  out = model.apply({"params": params}, input_ids, attention_mask, token_type_ids)
  v = mean_pool(out.last_hidden_state, attention_mask)
  if normalize:
    v = v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-12)
  return v
