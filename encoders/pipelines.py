"""Inference helpers over any encoder or task model and its tokenizer, shaped like
transformers' pipelines (and sentence-transformers for embeddings):

    p = pipelines.load(hf_dir)                  # model, params and tokenizer.json
    pipelines.fill_mask(p, ["Paris is the [MASK] of France."], top_k=5)
    pipelines.embed(p, texts)                   # (N, D) masked mean, unit length
    pipelines.classify(p, texts)                # [{"label", "score"}]
    pipelines.tag(p, texts)                     # [[{"entity", "score", "index", "word",
                                                #    "start", "end"}]], "O" left out
    pipelines.answer(p, question, context)      # {"score", "start", "end", "answer"}
    pipelines.search(p, queries, corpus, top_k) # [[{"corpus_id", "score"}]] by cosine

    pipelines.predict(p, *args)                 # the model's task's own pipeline

classify, tag and answer are the pipeline functions of the sequence (and regression),
token and qa tasks (encoders/tasks/); `predict` runs whichever the model's task has.

Batched and jitted: rows are padded to a fixed batch size and to the next length bucket
(16, 32, 64, ... up to the model's maximum), so a stream of inputs reuses a handful of
compiled programs instead of compiling per shape. Padding never changes a result (every
head is padding-invariant: tests/encoders/test_task_heads.py).
"""
import dataclasses
import os
from typing import Any, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from encoders import hf, tasks
from encoders.hf import tasks as tasks_hf
from encoders.tasks.qa import answer  # noqa: F401  (the qa task's pipeline)
from encoders.tasks.sequence import classify  # noqa: F401  (sequence, regression)
from encoders.tasks.token import tag  # noqa: F401  (the token task's pipeline)
from encoders.tokenizer import load_tokenizer

PER_TOKEN = {"last_hidden_state", "mlm_logits", "start_logits", "end_logits", "rtd_logits"}
BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclasses.dataclass
class Pipeline:
  """A model (encoders.build / tasks.build), its params and a `tokenizers.Tokenizer`."""
  model: Any
  params: Any
  tokenizer: Any
  batch_size: int = 32
  max_length: Optional[int] = None
  _fns: dict = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    limit = self.model.config.get("max_position_embeddings") or BUCKETS[-1]
    if self.model.config.get("position_style") == "roberta":
      limit -= self.model.config.pad_token_id + 1
    self.max_length = min(self.max_length or limit, limit)
    self.pad_id = int(self.model.config.get("pad_token_id", 0))

  @property
  def task(self):
    return getattr(self.model, "task", None)

  @property
  def unit(self) -> Optional[tasks.Task]:
    """The model's registered task (None: an encoder)."""
    return tasks.get(self.task) if self.task is not None else None

  def labels(self):
    """The label names of a task model's outputs (LABEL_i where it has none)."""
    return self.model.labels or tuple(f"LABEL_{i}" for i in range(self.model.num_labels))

  def bucket(self, n: int) -> int:
    for b in BUCKETS:
      if b >= n:
        return min(b, self.max_length)
    return self.max_length

  def encode(self, inputs, pairs=None, truncate=True):
    tok = self.tokenizer
    if truncate:
      tok.enable_truncation(max_length=self.max_length)
    try:
      batch = list(inputs) if pairs is None else list(zip(inputs, pairs))
      return tok.encode_batch(batch)
    finally:
      tok.no_truncation()

  def _fn(self, length: int):
    if length not in self._fns:
      model = self.model
      self._fns[length] = jax.jit(lambda p, i, m, t: model.apply({"params": p}, i, m, t))
    return self._fns[length]

  def run(self, encodings) -> List[dict]:
    """Per encoding, the model's outputs cut to its own tokens (numpy dicts)."""
    per_token = PER_TOKEN | ({"logits"} if self.unit is not None and self.unit.per_token
                             else set())
    out = []
    for lo in range(0, len(encodings), self.batch_size):
      chunk = encodings[lo:lo + self.batch_size]
      t = self.bucket(max(len(e.ids) for e in chunk))
      ids = np.full((self.batch_size, t), self.pad_id, np.int32)
      mask = np.zeros((self.batch_size, t), np.int32)
      types = np.zeros((self.batch_size, t), np.int32)
      for i, e in enumerate(chunk):
        n = len(e.ids)
        ids[i, :n], mask[i, :n], types[i, :n] = e.ids, e.attention_mask, e.type_ids
      res = self._fn(t)(self.params, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
      host = {f.name: np.asarray(getattr(res, f.name)) for f in dataclasses.fields(res)
              if getattr(res, f.name) is not None}
      for i, e in enumerate(chunk):
        n = len(e.ids)
        row = {k: (v[i, :n] if k in per_token else v[i]) for k, v in host.items()}
        row["mask"] = mask[i, :n]
        out.append(row)
    return out


def load(path: str, batch_size: int = 32, **overrides) -> Pipeline:
  """An HF directory -> Pipeline: a task model for a registered task's class
  (...ForSequenceClassification, ...ForTokenClassification, ...ForQuestionAnswering),
  else the encoder (its architecture's heads)."""
  if tasks_hf.is_task_model(path):
    model, params = tasks_hf.from_hf(path, **overrides)
  else:
    model, params = hf.from_hf(path, **overrides)
  if not os.path.isfile(os.path.join(path, "tokenizer.json")) and not os.path.isfile(
      os.path.join(path, "vocab.txt")):
    raise ValueError(f"{path} has no tokenizer.json or vocab.txt")
  return Pipeline(model, params, load_tokenizer(path), batch_size)


def _softmax(x, axis=-1):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


def fill_mask(p: Pipeline, texts: Sequence[str], top_k: int = 5, mask_token="[MASK]"):
  """Per text (one mask token each): the top_k {"score", "token", "token_str",
  "sequence"} by probability, as transformers' fill-mask pipeline."""
  mask_id = p.tokenizer.token_to_id(mask_token)
  if mask_id is None:
    raise ValueError(f"the tokenizer has no {mask_token!r} token")
  encs = p.encode(texts)
  out = []
  for e, row in zip(encs, p.run(encs)):
    where = [i for i, t in enumerate(e.ids) if t == mask_id]
    if len(where) != 1:
      raise ValueError(f"each text needs exactly one {mask_token}, got {len(where)}")
    if "mlm_logits" not in row:
      raise ValueError("fill_mask needs a model with an MLM head (e.g. ...ForMaskedLM)")
    probs = _softmax(row["mlm_logits"][where[0]])
    top = np.argsort(-probs, kind="stable")[:top_k]
    res = []
    for t in top:
      ids = list(e.ids)
      ids[where[0]] = int(t)
      res.append({"score": float(probs[t]), "token": int(t),
                  "token_str": p.tokenizer.decode([int(t)], skip_special_tokens=False),
                  "sequence": p.tokenizer.decode(ids, skip_special_tokens=True)})
    out.append(res)
  return out


def embed(p: Pipeline, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
  """(N, D) masked mean of the last hidden state (sentence-transformers' mean pooling),
  unit length when `normalize`."""
  encs = p.encode(texts)
  vecs = []
  for row in p.run(encs):
    h, m = row["last_hidden_state"].astype(np.float64), row["mask"][:, None]
    vecs.append((h * m).sum(0) / max(m.sum(), 1))
  v = np.stack(vecs)
  if normalize:
    v = v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)
  return v.astype(np.float32)


def predict(p: Pipeline, *args, **kwargs):
  """The pipeline function of the model's task (classify, tag, answer, ...)."""
  if p.unit is None:
    raise ValueError("predict needs a task model (encoders.hf.tasks.from_hf); for an "
                     "encoder use fill_mask, embed or search")
  return p.unit.pipeline(p, *args, **kwargs)


def search(p: Pipeline, queries: Sequence[str], corpus, top_k: int = 5):
  """Per query, the top_k corpus entries by cosine similarity: [{"corpus_id", "score"}].
  `corpus`: texts, or their (N, D) embeddings from `embed`."""
  q = embed(p, queries)
  c = np.asarray(corpus, np.float32) if not isinstance(corpus[0], str) else embed(p, corpus)
  c = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
  sims = q @ c.T
  out = []
  for row in sims:
    order = np.argsort(-row, kind="stable")[:top_k]
    out.append([{"corpus_id": int(i), "score": float(row[i])} for i in order])
  return out
