"""A toy fine-tuning task defined outside the project's files, as a user would add one:
does a text name a place? Its own reader format ("text ||| yes" lines), a pooled head
with one output, a logistic loss, a hit-rate scorer, the HF class suffix
"ForToyPlaceDetection" and a pipeline function. Importing this module registers it."""
import jax.numpy as jnp
import numpy as np

from encoders import tasks
from encoders.tasks import data

NAME = "toy_place"


def read_lines(path, bad, encoding="utf-8"):
  """Rows {"text", "label": 1.0 | 0.0} of "text ||| yes|no" lines."""
  before, rows = dict(bad.counts), []
  for n, line in data.lines(path, bad, encoding):
    text, sep, answer = line.strip().rpartition("|||")
    if not sep or answer.strip() not in ("yes", "no") or not text.strip():
      bad.report("corrupt_record", f"{path}:{n}", "expected 'text ||| yes|no'")
      continue
    rows.append(data.located(data.Row(text=text.strip(),
                                      label=float(answer.strip() == "yes")), f"{path}:{n}"))
  data.need_rows(rows, path, bad, before)
  return rows


def detect(p, texts):
  """Per text {"place": bool, "probability": float}."""
  out = []
  for row in p.run(p.encode(texts)):
    prob = float(1 / (1 + np.exp(-float(row["logits"][0]))))
    out.append({"place": prob > 0.5, "probability": prob})
  return out


@tasks.register
class ToyPlaceDetection(tasks.Task):
  name = NAME
  head_kind = "pooled"
  num_outputs = 1
  hf_suffix = "ForToyPlaceDetection"
  label_dtype = "float32"
  named_labels = False
  formats = ("toy_lines",)
  metrics = ("hit_rate",)
  selection = "hit_rate"

  def read_file(self, path, f, bad):
    return read_lines(path, bad, f.get("encoding", "utf-8"))

  def encode(self, tok, rows, f, seq_len, pad_id, labels):
    tok.enable_truncation(max_length=seq_len)
    encs = tok.encode_batch([r["text"] for r in rows])
    tok.no_truncation()
    y = np.asarray([r["label"] for r in rows], np.float32)
    return dict(data.text_arrays(encs, seq_len, pad_id), labels=y), {}

  def loss(self, out, batch):
    w = self.label_weights(batch)
    z, y = out.logits[..., 0], batch["labels"].astype(jnp.float32)
    loss_sum = jnp.sum(w * (jnp.logaddexp(0.0, z) - y * z))  # -log sigmoid(+-z)
    hits = jnp.sum(jnp.where((z > 0) == (y > 0.5), w, 0.0))
    return {"task": loss_sum}, {"task_loss_sum": loss_sum, "task_correct_sum": hits,
                                "task_weight_sum": jnp.sum(w)}

  def score(self, outputs, info, labels, f):
    pred = outputs["logits"][:, 0] > 0
    gold = np.asarray([r["label"] > 0.5 for r in info["rows"]])
    return {"hit_rate": float(np.mean(pred == gold))}, [
        {"text": r["text"], "label": bool(g), "prediction": bool(p)}
        for r, g, p in zip(info["rows"], gold, pred)]

  def pipeline(self, p, texts):
    return detect(p, texts)
