"""Fine-tuning on the spine's objective interface (objectives/base.py): the task model of
`config.finetune.task` (a registered unit of encoders/tasks/), so the one trainer
(launch/trainer/) runs it with its sharding, exact accumulation, optimizer and
checkpoints.

The task states the batch fields, the loss (sums plus the sum of its label weights as the
normaliser, so accumulation and devices give the full-batch gradient) and the baselines;
this class wires them to the trainer. Every batch also has `example_weight` (B,) float: 0
on rows that only pad the last batch of an epoch, so they count in no loss, metric or
gradient. Packed batches (`finetune.packing`, tasks that allow it): several examples to a
row, `segment_ids` (B,T), per-token `labels` with `label_weight` (B,T) (an example-level
label at its example's first token); the loss sums and normalizers are those of the same
examples unpacked (tests/launch/test_finetune.py). Metrics: `task_loss`, `task_accuracy`.
"""
import jax
import jax.numpy as jnp
import numpy as np

import encoders
from encoders import tasks
from encoders.hf import tasks as tasks_hf
from objectives.base import Objective, model_forward_flops, register_objective
from objectives.spec import BatchSpec, Field


def _text_rows(layout, width, packed):
  """mask, first-token flags, segment ids and input ids of synthetic rows: per row, its
  examples' lengths; unpacked rows hold one example (the layout's sum)."""
  b = len(layout)
  seg = np.zeros((b, width), np.int32)
  first = np.zeros((b, width), bool)
  for r, docs in enumerate(layout):
    if not packed:
      docs = [min(sum(docs), width)] if docs else []
    col = 0
    for s, n in enumerate(docs):
      n = min(n, width - col)
      if n <= 0:
        break
      seg[r, col:col + n], first[r, col] = s + 1, True
      col += n
  return (seg > 0).astype(np.int32), first, seg


def synthesizer(task: tasks.Task, num_labels: int, vocab_size: int, packed: bool):
  """Synthetic batches of the task's fields (objectives/spec.py's layouts)."""
  def synth(layout, width, rng):
    mask, first, seg = _text_rows(layout, width, packed)
    b = len(layout)
    out = {"input_ids": (rng.randint(5, vocab_size, (b, width)) * mask).astype(np.int32),
           "attention_mask": mask, "token_type_ids": np.zeros((b, width), np.int32)}
    if packed:
      out["segment_ids"] = seg
    else:
      out["example_weight"] = (mask.sum(1) > 0).astype(np.float32)
    out.update(task.synth_labels(rng, mask, first, num_labels, packed))
    return out
  return synth


@register_objective("finetune")
class Finetune(Objective):
  """A task model (encoders.tasks) trained on labelled rows; see the module docstring.
  `task` is the task's name; `unit` the registered tasks.Task."""
  name = "finetune"
  trained = ("encoder",)

  def __init__(self, config, tokenizer=None):
    self.config = config
    f = config.finetune
    self.task = str(f.task)
    self.unit = tasks.get(self.task)
    if hasattr(self.unit, "configured"):  # a task whose step reads its own settings
      self.unit = self.unit.configured(f)
    labels = tuple(f.get("labels", ()) or ())
    self.model = tasks.build(config.model, self.task, num_labels=len(labels) or int(
        f.get("num_labels", 2)), labels=labels)
    self.model_config = self.model.config
    self.modules = {"encoder": self.model}
    self.tokenizer = tokenizer
    self.init_from = config.get("init_from", "")
    self.seq_len = int(config.data.seq_len)
    self.packed = bool(f.get("packing", False))
    if self.packed and not self.unit.packable:
      raise ValueError(f"finetune.packing=True packs rows for the tasks that allow it, not "
                       f"{self.task!r}")

  def init(self, rng):
    return {"encoder": encoders.init_boxed(self.model, rng, length=self.seq_len)}

  def after_init(self, params, shardings):
    """init_from's weights into the encoder (base class), unless finetune.random_init."""
    if self.config.finetune.get("random_init", False):
      return params
    return super().after_init(params, shardings)

  def normalizers(self, batch):
    return {"task": jnp.sum(self.unit.label_weights(batch))}

  def encode(self, params, batch, rng=None, train=False):
    """The task model on one set of text fields."""
    rngs = {"dropout": rng} if (train and rng is not None) else None
    return self.model.apply({"params": params["encoder"]}, batch["input_ids"],
                            batch["attention_mask"], batch["token_type_ids"],
                            segment_ids=batch.get("segment_ids"),
                            deterministic=not train, rngs=rngs)

  def apply(self, params, batch, rng=None, train=False):
    """The task's outputs; a task with `run` encodes several texts per example itself
    (run(encode(text fields, rng), batch, rng))."""
    run = getattr(self.unit, "run", None)
    if run is None:
      return self.encode(params, batch, rng, train)
    return run(lambda texts, key: self.encode(params, texts, key, train), batch, rng)

  def loss(self, params, batch, rng, train):
    return self.unit.loss(self.apply(params, batch, rng, train), batch)

  def loss_parts(self):
    """(embed(params, batch, rng) -> per-example vectors, loss of those vectors over
    the whole batch -> (term sums, metric sums)) when the task's loss reads only
    `pooled` (`cacheable`): launch/trainer/step.py's gradient cache; else None."""
    if not getattr(self.unit, "cacheable", False):
      return None
    embed = lambda params, batch, rng: self.apply(params, batch, rng, True).pooled
    return embed, lambda reps, batch: self.unit.loss(tasks.TaskOutput(None, pooled=reps),
                                                     batch)

  def forward(self, params, batch):
    return self.apply(params, batch)

  def module_flops(self, name, seq_len, all_positions=False):
    """The encoder's forward over each text of an example (`texts_per_example` of a task
    that encodes several: a pair task's anchor, positive, negatives)."""
    texts = int(getattr(self.unit, "texts_per_example", 1))
    return texts * model_forward_flops(self.model_config, seq_len, 0)

  def batch_spec(self):
    fields = {k: Field(shape, dtype)
              for k, (shape, dtype) in self.unit.batch_fields(self.packed).items()}
    return BatchSpec(fields, synthesizer(self.unit, self.model.num_labels,
                                         self.model_config.vocab_size, self.packed))

  def baselines(self, train_batches, eval_items):
    """The task's trivial predictors (classification: the majority class of the training
    rows), scored on the eval rows."""
    return self.unit.baselines(train_batches, eval_items)

  def export(self, params, path, tokenizer=None):
    own = getattr(self.unit, "export", None)  # a task with its own export format
    if own is not None:
      own(self.model, jax.device_get(params["encoder"]), path, self.config)
    else:
      tasks_hf.to_hf(self.model, jax.device_get(params["encoder"]), path)
    if tokenizer is not None and hasattr(tokenizer, "save"):
      tokenizer.save(path)
    return path

  def describe(self):
    return {"name": self.name, "task": self.task, "num_labels": self.model.num_labels,
            "labels": list(self.model.labels)}
