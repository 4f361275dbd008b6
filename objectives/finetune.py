"""Fine-tuning objectives on the spine's objective interface (objectives/base.py): one
class for the task heads of encoders/tasks.py, so the one trainer (launch/trainer/) runs
them with its sharding, exact accumulation, optimizer and checkpoints.

config.finetune.task:
  "sequence"   logits (B,N) vs `labels` (B,) int; num_labels=1 is regression: MSE vs
               `labels` (B,) float (`finetune.regression=True`)
  "token"      logits (B,T,N) vs `labels` (B,T) int, -100 where not scored (the second
               and later sub-tokens of a word, special tokens, padding)
  "qa"         start/end logits (B,T) vs `start_positions`, `end_positions` (B,) int
               (0, the [CLS] position, where the window holds no answer)
Every batch also has `example_weight` (B,) float: 0 on rows that only pad the last
batch of an epoch, so they count in no loss, metric or gradient.

Packed batches (`finetune.packing`, sequence and token tasks): several examples to a row,
`segment_ids` (B,T) 1, 2, ... per example (0 = padding), and per-token `labels` (B,T)
with `label_weight` (B,T) 1 where a label is scored (a sequence example's at its first
token, where the packed head's logits for it sit); no `example_weight`. The loss sums and
normalizers are those of the same examples unpacked (tests/launch/test_finetune.py).

Loss terms are SUMS with global normalizers (the number of scored labels), as the
interface requires; metrics are `task_loss`, `task_accuracy` (argmax == label on the
scored positions; QA: start and end both right).
"""
import jax
import jax.numpy as jnp
import numpy as np

import encoders
from encoders import tasks
from objectives import losses
from objectives.base import Objective, register_objective
from objectives.spec import SEQ, BatchSpec, Field

IGNORE = -100


def batch_fields(task: str, regression: bool = False, packed: bool = False):
  f = {"input_ids": Field((SEQ,), "int32"), "attention_mask": Field((SEQ,), "int32"),
       "token_type_ids": Field((SEQ,), "int32")}
  if packed:
    f["segment_ids"] = Field((SEQ,), "int32")
    f["labels"] = Field((SEQ,), "float32" if regression else "int32")
    f["label_weight"] = Field((SEQ,), "float32")
    return f
  f["example_weight"] = Field((), "float32")
  if task == "sequence":
    f["labels"] = Field((), "float32" if regression else "int32")
  elif task == "token":
    f["labels"] = Field((SEQ,), "int32")
  else:
    f["start_positions"] = Field((), "int32")
    f["end_positions"] = Field((), "int32")
  return f


def _synth_packed(task, num_labels, regression, vocab_size):
  """Packed rows laid out as `layout` gives (per row, its examples' lengths)."""
  def synth(layout, width, rng):
    b = len(layout)
    seg = np.zeros((b, width), np.int32)
    first = np.zeros((b, width), bool)
    for r, docs in enumerate(layout):
      col = 0
      for s, n in enumerate(docs):
        n = min(n, width - col)
        if n <= 0:
          break
        seg[r, col:col + n], first[r, col] = s + 1, True
        col += n
    mask = (seg > 0).astype(np.int32)
    scored = first if task == "sequence" else mask > 0
    if regression:
      labels = np.where(scored, rng.randn(b, width), 0.0).astype(np.float32)
    else:
      labels = np.where(scored, rng.randint(0, num_labels, (b, width)), IGNORE).astype(np.int32)
    return {"input_ids": (rng.randint(5, vocab_size, (b, width)) * mask).astype(np.int32),
            "attention_mask": mask, "token_type_ids": np.zeros((b, width), np.int32),
            "segment_ids": seg, "labels": labels, "label_weight": scored.astype(np.float32)}
  return synth


def _synth(task, num_labels, regression, vocab_size):
  def synth(layout, width, rng):
    b = len(layout)
    lengths = np.array([min(sum(d), width) if d else 0 for d in layout])
    mask = (np.arange(width)[None] < lengths[:, None]).astype(np.int32)
    out = {"input_ids": (rng.randint(5, vocab_size, (b, width)) * mask).astype(np.int32),
           "attention_mask": mask, "token_type_ids": np.zeros((b, width), np.int32),
           "example_weight": (lengths > 0).astype(np.float32)}
    if task == "sequence":
      out["labels"] = (rng.randn(b).astype(np.float32) if regression
                       else rng.randint(0, num_labels, b).astype(np.int32))
    elif task == "token":
      out["labels"] = np.where(mask > 0, rng.randint(0, num_labels, (b, width)),
                               IGNORE).astype(np.int32)
    else:
      out["start_positions"] = rng.randint(0, max(int(lengths.min()), 1), b).astype(np.int32)
      out["end_positions"] = out["start_positions"]
    return out
  return synth


def label_weights(batch, task: str):
  """The weight of each scored label: packed rows' `label_weight` (B,T); else
  `example_weight` (B,), per token (B,T) for the token task (0 where labels are IGNORE)."""
  if "label_weight" in batch:  # packed rows: a label per scored token (module docstring)
    return batch["label_weight"].astype(jnp.float32)
  w = batch["example_weight"].astype(jnp.float32)
  return w[:, None] * (batch["labels"] != IGNORE) if task == "token" else w


def task_loss(out, batch, task: str, regression: bool):
  """(term sums, metric sums) of a TaskOutput against a batch."""
  w = label_weights(batch, task)
  if task == "sequence" and regression:
    err = out.logits[..., 0] - batch["labels"].astype(jnp.float32)
    loss_sum = jnp.sum(w * err * err)
    return ({"task": loss_sum}, {"task_loss_sum": loss_sum, "task_weight_sum": jnp.sum(w)})
  if task in ("sequence", "token"):
    _, m = losses.weighted_cross_entropy(out.logits, batch["labels"], w, prefix="task")
    return {"task": m["task_loss_sum"]}, m
  _, ms = losses.weighted_cross_entropy(out.start_logits, batch["start_positions"], w,
                                        prefix="s")
  _, me = losses.weighted_cross_entropy(out.end_logits, batch["end_positions"], w,
                                        prefix="e")
  both = ((jnp.argmax(out.start_logits, -1) == batch["start_positions"])
          & (jnp.argmax(out.end_logits, -1) == batch["end_positions"]))
  loss_sum = 0.5 * (ms["s_loss_sum"] + me["e_loss_sum"])  # HF's (start + end) / 2
  return ({"task": loss_sum}, {"task_loss_sum": loss_sum, "task_weight_sum": jnp.sum(w),
                               "task_correct_sum": jnp.sum(jnp.where(both, w, 0.0))})


@register_objective("finetune")
class Finetune(Objective):
  """A task model (encoders.tasks) trained on labelled rows; see the module docstring."""
  name = "finetune"
  trained = ("encoder",)

  def __init__(self, config, tokenizer=None):
    self.config = config
    f = config.finetune
    self.task = f.task
    self.regression = bool(f.get("regression", False))
    labels = tuple(f.get("labels", ()) or ())
    num_labels = 1 if self.regression else (len(labels) or int(f.num_labels))
    self.model = tasks.build(config.model, self.task, num_labels=num_labels, labels=labels)
    self.model_config = self.model.config
    self.modules = {"encoder": self.model}
    self.tokenizer = tokenizer
    self.init_from = config.get("init_from", "")
    self.seq_len = int(config.data.seq_len)
    self.packed = bool(f.get("packing", False))
    if self.packed and self.task == "qa":
      raise ValueError("finetune.packing=True supports the sequence and token tasks; qa "
                       "windows are scored over whole rows, so pack them off")

  def init(self, rng):
    return {"encoder": encoders.init_boxed(self.model, rng, length=self.seq_len)}

  def after_init(self, params, shardings):
    """init_from's weights into the encoder (base class), unless finetune.random_init."""
    if self.config.finetune.get("random_init", False):
      return params
    return super().after_init(params, shardings)

  def normalizers(self, batch):
    return {"task": jnp.sum(label_weights(batch, self.task))}

  def apply(self, params, batch, rng=None, train=False):
    rngs = {"dropout": rng} if (train and rng is not None) else None
    return self.model.apply({"params": params["encoder"]}, batch["input_ids"],
                            batch["attention_mask"], batch["token_type_ids"],
                            segment_ids=batch.get("segment_ids"),
                            deterministic=not train, rngs=rngs)

  def loss(self, params, batch, rng, train):
    return task_loss(self.apply(params, batch, rng, train), batch, self.task,
                     self.regression)

  def forward(self, params, batch):
    return self.apply(params, batch)

  def module_flops(self, name, seq_len, all_positions=False):
    from objectives.base import model_forward_flops
    cfg = self.model_config
    return model_forward_flops(cfg, seq_len, 0)

  def batch_spec(self):
    n = self.model.num_labels
    synth = _synth_packed if self.packed else _synth
    return BatchSpec(batch_fields(self.task, self.regression, self.packed),
                     synth(self.task, n, self.regression, self.model_config.vocab_size))

  def baselines(self, train_batches, eval_items):
    """The majority class of the training rows, scored on the eval rows."""
    if self.task == "qa" or self.regression:
      return {}
    key = "labels"
    train = np.concatenate([np.asarray(b[key]).ravel() for b in train_batches])
    train = train[train != IGNORE]
    if train.size == 0:
      return {}
    majority = np.bincount(train).argmax()
    gold = np.concatenate([np.asarray(b[key]).ravel() for b, _ in eval_items])
    gold = gold[gold != IGNORE]
    return {"task_majority_accuracy": float(np.mean(gold == majority)) if gold.size else 0.0}

  def export(self, params, path, tokenizer=None):
    from encoders.hf import tasks as tasks_hf
    tasks_hf.to_hf(self.model, jax.device_get(params["encoder"]), path)
    if tokenizer is not None and hasattr(tokenizer, "save"):
      tokenizer.save(path)
    return path

  def describe(self):
    return {"name": self.name, "task": self.task, "num_labels": self.model.num_labels,
            "labels": list(self.model.labels), "regression": self.regression}
