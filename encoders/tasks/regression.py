"""Regression: one number per text (or text pair), the pooled head's single output.

    --config configs/finetune.py:regression   (finetune.task="regression")

Data as sequence classification (a table or TFDS), the label column holding numbers in
any form (1, "1", 0.5, "2e3"). Loss: squared error. Scored by Pearson and Spearman
correlations (and the MSE). In transformers it is ...ForSequenceClassification with
problem_type "regression" and one label.
"""
import math

import jax.numpy as jnp
import numpy as np

from encoders.tasks import data, metrics
from encoders.tasks.base import register
from encoders.tasks.data import DataError
from encoders.tasks.sequence import SequenceClassification, encode_sequence, is_regression


def regression_labels(rows, what: str):
  """Every label a finite number (set on the row as a float); anything else is an error
  naming the row's file and line."""
  for r in rows:
    v = r["label"]
    ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(
        v, (bool, np.bool_))
    if not ok and isinstance(v, str) and data.is_number(v.strip()):
      v, ok = float(v), True
    if not ok or not math.isfinite(float(v)):
      raise DataError(f"{getattr(r, 'where', '') or what}: regression label {r['label']!r}"
                      " is not a finite number")
    r["label"] = float(v)
  return rows


@register
class Regression(SequenceClassification):
  name = "regression"
  num_outputs = 1
  label_dtype = "float32"
  named_labels = False
  metrics = ("pearson", "spearman", "mse")
  selection = "pearson"

  def hf_claims(self, hf):
    return is_regression(hf)

  def hf_entries(self, labels, num_labels):
    return {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
            "problem_type": "regression"}

  def labels(self, train, evals, f, bad, skipped, names):
    if len(evals) < 2:
      raise DataError(f"{names[1]}: {len(evals)} eval row; regression's correlations need "
                      "2 or more")
    return (), regression_labels(train, names[0]), regression_labels(evals, names[1])

  def encode(self, tok, rows, f, seq_len, pad_id, labels):
    return encode_sequence(tok, rows, seq_len, pad_id, regression=True), {}

  def score(self, outputs, info, labels, f):
    pred = outputs["logits"][:, 0]
    gold = np.asarray([float(r["label"]) for r in info["rows"]])
    return metrics.regression(gold, pred), [{"label": float(g), "prediction": float(p)}
                                            for g, p in zip(gold, pred)]

  def report(self, result, labels, directory, title=""):
    return []

  def loss(self, out, batch):
    w = self.label_weights(batch)
    err = out.logits[..., 0] - batch["labels"].astype(jnp.float32)
    loss_sum = jnp.sum(w * err * err)
    return {"task": loss_sum}, {"task_loss_sum": loss_sum, "task_weight_sum": jnp.sum(w)}

  def baselines(self, train_batches, eval_items):
    return {}
