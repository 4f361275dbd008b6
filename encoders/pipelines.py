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

Batched and jitted: rows are padded to a fixed batch size and to the next length bucket
(16, 32, 64, ... up to the model's maximum), so a stream of inputs reuses a handful of
compiled programs instead of compiling per shape. Padding never changes a result (every
head is padding-invariant: tests/encoders/test_task_heads.py).
"""
import dataclasses
import os
from typing import Any, List, Optional, Sequence

import numpy as np

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
    import jax
    if length not in self._fns:
      model = self.model
      self._fns[length] = jax.jit(lambda p, i, m, t: model.apply({"params": p}, i, m, t))
    return self._fns[length]

  def run(self, encodings) -> List[dict]:
    """Per encoding, the model's outputs cut to its own tokens (numpy dicts)."""
    import jax.numpy as jnp
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
      per_token = PER_TOKEN | ({"logits"} if self.task == "token" else set())
      for i, e in enumerate(chunk):
        n = len(e.ids)
        row = {k: (v[i, :n] if k in per_token else v[i]) for k, v in host.items()}
        row["mask"] = mask[i, :n]
        out.append(row)
    return out


def load(path: str, batch_size: int = 32, **overrides) -> Pipeline:
  """An HF directory -> Pipeline: a task model for ...For{SequenceClassification,
  TokenClassification,QuestionAnswering}, else the encoder (its architecture's heads)."""
  from encoders import hf
  from encoders.hf import tasks as tasks_hf
  from launch.data import finetune_data
  arch = (hf.hf_config(path).get("architectures") or [""])[0]
  if any(arch.endswith(s) for s in ("ForSequenceClassification", "ForTokenClassification",
                                     "ForQuestionAnswering")):
    model, params = tasks_hf.from_hf(path, **overrides)
  else:
    model, params = hf.from_hf(path, **overrides)
  if not os.path.isfile(os.path.join(path, "tokenizer.json")) and not os.path.isfile(
      os.path.join(path, "vocab.txt")):
    raise ValueError(f"{path} has no tokenizer.json or vocab.txt")
  return Pipeline(model, params, finetune_data.load_tokenizer(path), batch_size)


def _softmax(x, axis=-1):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


def _labels(p: Pipeline):
  n = p.model.num_labels
  return p.model.labels or tuple(f"LABEL_{i}" for i in range(n))


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


def classify(p: Pipeline, texts: Sequence[str], pairs=None, top_k: int = 1):
  """Per text {"label", "score"} (softmax; sigmoid for one label), or the top_k list."""
  if p.task != "sequence":
    raise ValueError("classify needs a sequence-classification model")
  labels = _labels(p)
  out = []
  for row in p.run(p.encode(texts, pairs)):
    logits = row["logits"]
    probs = 1 / (1 + np.exp(-logits.astype(np.float64))) if len(logits) == 1 else _softmax(logits)
    order = np.argsort(-probs, kind="stable")[:top_k]
    res = [{"label": labels[i], "score": float(probs[i])} for i in order]
    out.append(res[0] if top_k == 1 else res)
  return out


def tag(p: Pipeline, texts: Sequence[str], ignore=("O",)):
  """Per text, per (non-special) token whose label is not ignored: {"entity", "score",
  "index", "word", "start", "end"}, as transformers' token-classification pipeline with
  aggregation_strategy="none"."""
  if p.task != "token":
    raise ValueError("tag needs a token-classification model")
  labels = _labels(p)
  encs = p.encode(texts)
  out = []
  for e, row in zip(encs, p.run(encs)):
    probs = _softmax(row["logits"])
    res = []
    for i, (tid, special) in enumerate(zip(e.ids, e.special_tokens_mask)):
      k = int(probs[i].argmax())
      if special or labels[k] in ignore:
        continue
      start, end = e.offsets[i]
      res.append({"entity": labels[k], "score": float(probs[i, k]), "index": i,
                  "word": p.tokenizer.id_to_token(tid), "start": int(start), "end": int(end)})
    out.append(res)
  return out


def answer(p: Pipeline, question: str, context: str, top_k: int = 1, doc_stride: int = 128,
           max_answer_len: int = 15, max_seq_len: Optional[int] = None,
           handle_impossible_answer: bool = False):
  """{"score", "start", "end", "answer"} (or the top_k list), as transformers'
  question-answering pipeline scores spans: per window, softmax over the context tokens
  (and [CLS]) of start and end, score = p(start) * p(end), spans of at most
  max_answer_len tokens; long contexts in windows overlapping by doc_stride tokens."""
  if p.task != "qa":
    raise ValueError("answer needs a question-answering model")
  tok = p.tokenizer
  max_len = min(max_seq_len or 384, p.max_length)
  stride = min(doc_stride, (max_len - len(tok.encode(question).ids)) // 2)
  tok.enable_truncation(max_length=max_len, stride=max(stride, 0), strategy="only_second")
  try:
    enc = tok.encode(question, context)
  finally:
    tok.no_truncation()
  windows = [enc] + list(enc.overflowing)
  cands, null = [], 1.0
  for w, row in zip(windows, p.run(windows)):
    allowed = np.array([s == 1 for s in w.sequence_ids])
    allowed[0] = True  # [CLS], as the pipeline keeps it
    s = _softmax(np.where(allowed, row["start_logits"], -10000.0))
    e = _softmax(np.where(allowed, row["end_logits"], -10000.0))
    null = min(null, float(s[0] * e[0]))
    s[0] = e[0] = 0.0
    scores = np.triu(np.outer(s, e)) * np.tril(np.ones((len(s), len(s))), max_answer_len - 1)
    flat = np.argsort(-scores.ravel(), kind="stable")[:max(top_k * 4, top_k)]
    for f in flat:
      a, b = divmod(int(f), len(s))
      if not (allowed[a] and allowed[b]) or a == 0 or b == 0:
        continue
      start, end = w.offsets[a][0], w.offsets[b][1]
      cands.append({"score": float(scores[a, b]), "start": int(start), "end": int(end),
                    "answer": context[start:end]})
  if handle_impossible_answer:
    cands.append({"score": null, "start": 0, "end": 0, "answer": ""})
  cands.sort(key=lambda c: -c["score"])
  return cands[0] if top_k == 1 else cands[:top_k]


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
