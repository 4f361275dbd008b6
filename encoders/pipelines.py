"""Inference helpers over any encoder or task model and its tokenizer, shaped like
transformers' pipelines (and sentence-transformers for embeddings):

    p = pipelines.load(hf_dir)                  # model, params and tokenizer.json
    pipelines.fill_mask(p, ["Paris is the [MASK] of France."], top_k=5)
    pipelines.embed(p, texts)                   # (N, D) sentence embeddings
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

A sentence-transformers directory (`modules.json`) embeds as sentence-transformers does
(encoders/sentence.py: its pooling, Dense, Normalize, `max_seq_length`, lower-casing and
prompts). `embed` sorts the texts by token count and pads each batch to a length step of
at most a quarter of its length; pooling and normalization run on the device inside the
jitted program, batches are dispatched asynchronously (the next batch is padded while the
device runs the last), and the results come back once, in input order.
"""
import dataclasses
import json
from concurrent import futures
import os
from typing import Any, List, Optional, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from tokenizers import normalizers

from encoders import base, hf, sentence, tasks
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
  sentence_spec: Optional[sentence.Spec] = None  # a sentence-transformers directory's
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
  else the encoder (its architecture's heads). A sentence-transformers directory
  (`modules.json`) loads its Transformer module and its pooling, Dense, Normalize,
  `max_seq_length`, `do_lower_case` and prompts for `embed` and `search`."""
  spec = sentence.read(path)
  if spec is not None:
    path = spec.transformer_dir
  if tasks_hf.is_task_model(path):
    model, params = tasks_hf.from_hf(path, **overrides)
  elif spec is not None:
    model, params = _base_model(path, **overrides)
  else:
    model, params = hf.from_hf(path, **overrides)
  if not os.path.isfile(os.path.join(path, "tokenizer.json")) and not os.path.isfile(
      os.path.join(path, "vocab.txt")):
    raise ValueError(f"{path} has no tokenizer.json or vocab.txt")
  tok = load_tokenizer(path)
  max_length = None
  if spec is not None:
    if spec.do_lower_case:
      tok.normalizer = (normalizers.Sequence([normalizers.Lowercase(), tok.normalizer])
                        if tok.normalizer is not None else normalizers.Lowercase())
    max_length = spec.max_seq_length or _tokenizer_max_length(path)
  return Pipeline(model, params, tok, batch_size, max_length=max_length, sentence_spec=spec)


def _base_model(path: str, **overrides):
  """The encoder of a sentence-transformers Transformer module. sentence-transformers loads
  the base model of whatever checkpoint it holds (all-mpnet-base-v2's config names
  MPNetForMaskedLM over base-model weights): the heads its config names, else the pooler,
  else none, whichever set the file holds exactly (still no missing or unused tensor)."""
  first = None
  for heads in (None, ("pooler",), ()):
    try:
      return hf.from_hf(path, heads=heads, **overrides)
    except ValueError as e:
      first = first or e
  raise first


def _tokenizer_max_length(path: str) -> Optional[int]:
  """tokenizer_config.json's model_max_length where it is a real limit (transformers
  writes 1e30 for "none")."""
  f = os.path.join(path, "tokenizer_config.json")
  if not os.path.isfile(f):
    return None
  with open(f) as fh:
    value = json.load(fh).get("model_max_length")
  return int(value) if isinstance(value, (int, float)) and 0 < value < 1e9 else None


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


def length_step(n: int) -> int:
  """The padded width of a batch whose longest row has n tokens: n rounded up to a step of
  8, or of a quarter of the power of two below n when that is larger (16 widths from 8 to
  256: few programs to compile, at most a quarter of padding)."""
  step = max(8, (1 << max(n - 1, 1).bit_length()) // 8)
  return -(-n // step) * step


def _prompt_length(tok, prompt: str) -> int:
  """The prompt's tokens at the start of each row (its leading special tokens included, a
  trailing one not), as sentence-transformers counts them for include_prompt=False."""
  e = tok.encode(prompt)
  n = len(e.ids)
  return n - 1 if n and e.special_tokens_mask[-1] else n


def embed(p: Pipeline, texts: Sequence[str], normalize: Optional[bool] = None,
          prompt: Optional[str] = None, prompt_name: Optional[str] = None) -> np.ndarray:
  """(N, D') float32 sentence embeddings, in the order of `texts`.

  A sentence-transformers directory embeds as `SentenceTransformer(dir).encode` does: its
  pooling, Dense layers and Normalize, its max_seq_length, and its prompts (`prompt` text,
  or `prompt_name` from config_sentence_transformers.json, else its default prompt). Any
  other directory: the masked mean of the last hidden state, unit length. `normalize`
  True/False overrides the directory's Normalize."""
  texts = list(texts)
  if any(not isinstance(t, str) for t in texts):
    raise TypeError("embed takes a sequence of strings")
  spec = p.sentence_spec or sentence.Spec(normalize=True)
  if normalize is not None:
    spec = dataclasses.replace(spec, normalize=bool(normalize))
  text_prompt = spec.prompt(prompt, prompt_name)
  if text_prompt:
    texts = [text_prompt + t for t in texts]
  cut = _prompt_length(p.tokenizer, text_prompt) if text_prompt and not spec.include_prompt \
      else 0
  encoder, pool = None, sentence.embed_fn(spec)
  spec_key = ("embed", spec.pooling, spec.include_prompt, spec.normalize,
              tuple(id(d) for d in spec.dense))

  def program(width):  # one jitted program per padded width, kept for the next call
    nonlocal encoder
    if (spec_key, width) not in p._fns:
      encoder = encoder or _encoder_of(p.model)
      def fn(params, ids, mask, types, cut):
        h = encoder.apply({"params": params}, ids, mask, types).last_hidden_state
        return pool(h, mask, jnp.full((ids.shape[0],), cut, jnp.int32))
      p._fns[(spec_key, width)] = jax.jit(fn)
    return p._fns[(spec_key, width)]

  # Chunks of texts by character count (longest first) are tokenized in a thread while
  # the device runs the previous chunk's batches; within a chunk, rows go by token count.
  by_chars = np.argsort([-len(t) for t in texts], kind="stable")
  size = p.batch_size * 8
  chunks = [by_chars[i:i + size] for i in range(0, len(texts), size)]
  order, outs = [], []
  with futures.ThreadPoolExecutor(1) as tokenizing:
    pending = tokenizing.submit(p.encode, [texts[i] for i in chunks[0]]) if chunks else None
    for k, chunk in enumerate(chunks):
      encs = pending.result()
      if k + 1 < len(chunks):
        pending = tokenizing.submit(p.encode, [texts[i] for i in chunks[k + 1]])
      lengths = np.array([len(e.ids) for e in encs])
      local = np.argsort(-lengths, kind="stable")
      order.extend(chunk[local])
      for lo in range(0, len(local), p.batch_size):
        rows = local[lo:lo + p.batch_size]
        t = min(length_step(int(lengths[rows[0]])), p.max_length)
        ids = np.full((p.batch_size, t), p.pad_id, np.int32)
        mask = np.zeros((p.batch_size, t), np.int32)
        types = np.zeros((p.batch_size, t), np.int32)
        for i, r in enumerate(rows):
          e = encs[r]
          n = len(e.ids)
          ids[i, :n], mask[i, :n], types[i, :n] = e.ids, e.attention_mask, e.type_ids
        outs.append((len(rows), program(t)(p.params, ids, mask, types, cut)))  # async
  if not outs:
    return np.zeros((0, 0), np.float32)
  vecs = np.concatenate([np.asarray(v)[:n] for n, v in outs])
  result = np.empty_like(vecs, dtype=np.float32)
  result[np.asarray(order)] = vecs
  return result


def _encoder_of(model):
  """The model without heads (its last hidden state is all embed needs), or a task model
  as it is."""
  config = getattr(model, "config", None)
  if config is None or getattr(model, "task", None) is not None or not config.get("heads"):
    return model
  config = ml_collections.ConfigDict(config.to_dict())
  config.heads = ()
  return base.build(config)


def predict(p: Pipeline, *args, **kwargs):
  """The pipeline function of the model's task (classify, tag, answer, ...)."""
  if p.unit is None:
    raise ValueError("predict needs a task model (encoders.hf.tasks.from_hf); for an "
                     "encoder use fill_mask, embed or search")
  return p.unit.pipeline(p, *args, **kwargs)


def search(p: Pipeline, queries: Sequence[str], corpus, top_k: int = 5):
  """Per query, the top_k corpus entries by cosine similarity: [{"corpus_id", "score"}].
  `corpus`: texts, or their (N, D) embeddings from `embed`. A directory's "query" prompt
  goes before the queries and its "document" (or "passage", "corpus") prompt before the
  corpus texts, as sentence-transformers' encode_query / encode_document do."""
  prompts = p.sentence_spec.prompts if p.sentence_spec is not None else {}
  q = embed(p, queries, prompt_name="query" if "query" in prompts else None)
  if isinstance(corpus[0], str):
    doc = next((n for n in ("document", "passage", "corpus") if n in prompts), None)
    c = embed(p, corpus, prompt_name=doc)
  else:
    c = np.asarray(corpus, np.float32)
  q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
  c = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
  sims = q @ c.T
  out = []
  for row in sims:
    order = np.argsort(-row, kind="stable")[:top_k]
    out.append([{"corpus_id": int(i), "score": float(row[i])} for i in order])
  return out
