"""Sentence embeddings trained contrastively: (anchor, positive[, hard negatives]) rows.

    --config configs/finetune.py:embedding   (finetune.task="embedding", data_format "pairs")

Data: a .csv / .tsv / .jsonl table (optionally .gz / .bz2) with an anchor column, a
positive column and optional hard-negative columns (`finetune.embedding.*_column(s)`).
Anchors get `query_prompt` prepended, positives and negatives `document_prompt`.

Loss: in-batch-negatives InfoNCE as sentence-transformers' MultipleNegativesRankingLoss:
the cosine similarity of each anchor with every positive and hard negative of the GLOBAL
batch, times `scale`, and the cross-entropy of its own positive; `symmetric` averages it
with the positive -> anchors direction (MNRL with directions query_to_doc, doc_to_query,
per_direction). With `matryoshka_dims`, the loss is the weighted sum of that loss over
the embeddings truncated to each dimension (and re-normalised), as MatryoshkaLoss.
The loss is not a sum over examples: `optimizer.grad_accum_steps` > 1 is therefore the
gradient cache (Gao et al. 2021, launch/trainer/step.py): chunks embedded without
gradients, the loss's gradient w.r.t. the embeddings, then each chunk re-encoded with
that gradient; exact, and memory of one chunk.

Evaluation after each epoch: retrieval over the held-out rows (their anchors are the
queries, their positives and negatives the corpus): recall@1, recall@10, MRR@10; and the
Spearman correlation of cosine similarity with the scores of `scored_pairs_file`
(columns sentence1, sentence2, score) when given. Export: the HF base model plus the
sentence-transformers modules (modules.json, 1_Pooling, 2_Normalize,
sentence_bert_config.json, config_sentence_transformers.json).
"""
import copy
import csv
import json
import os
from typing import Dict, List, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from encoders import sentence
from encoders.tasks import data, metrics
from encoders.tasks.base import SEQ, SEQ2, Task, TaskOutput, register
from encoders.tasks.data import DataError, Row

POOLINGS = ("mean", "cls", "lasttoken", "max")
TEXT = ("input_ids", "attention_mask", "token_type_ids")
POSITIVE, NEGATIVE = "positive_", "negative_"  # field prefixes; the anchor's have none
METRICS = ("recall@1", "recall@10", "mrr@10", "spearman")


def pool(hidden, mask, mode: str = "mean"):
  """(B,T,D), (B,T) -> (B,D) float32, as sentence-transformers' Pooling (encoders/sentence.py):
  the mean over real tokens, the first token, the last real token or the max."""
  if mode not in POOLINGS:
    raise ValueError(f"pooling {mode!r} is not one of {POOLINGS}")
  return sentence.pool(hidden, mask, (mode,))


def normalize(v):
  """Unit length (a zero vector stays zero, with a finite gradient: no norm's sqrt at 0)."""
  return v * jax.lax.rsqrt(jnp.maximum(jnp.sum(v * v, axis=-1, keepdims=True), 1e-24))


def info_nce(anchors, docs, weight, scale: float, symmetric: bool):
  """(loss sum over real anchors, correct count): anchors (B,D), docs (B,R,D) with the
  positive at r=0, weight (B,) 0 on filler rows (neither an anchor nor a candidate)."""
  b, r, d = docs.shape
  w = weight.astype(jnp.float32)
  # filler rows as a float mask (1 - sign), not a boolean one: on a mesh the mask is
  # gathered, and a gathered boolean becomes a collective XLA's TPU cost model cannot price
  filler = 1.0 - jnp.sign(w)
  a = normalize(anchors)
  cand = normalize(docs).transpose(1, 0, 2).reshape(r * b, d)  # positives first, as MNRL
  sims = scale * a @ cand.T  # (B, R*B)
  # filler rows: no candidate (-1e9, which |sims| <= scale cannot move in float32; not
  # -inf: 0 * inf would be NaN)
  scores = sims - 1e9 * jnp.tile(filler, r)[None]
  # each anchor's own positive as a row-wise dot product, not the diagonal of `sims`: the
  # diagonal's gradient is a scatter, which the TPU compiler offloads to the SparseCore
  # and its cost model then cannot price (launch.aot had no step time)
  pos = scale * jnp.sum(a * cand[:b], axis=-1)
  lse = jax.nn.logsumexp(scores, axis=1)
  if symmetric:  # each positive against every anchor; the per-direction mean
    back = sims[:, :b].T - 1e9 * filler[None]
    lse = 0.5 * (lse + jax.nn.logsumexp(back, axis=1))
  right = (jnp.argmax(scores, axis=1) == jnp.arange(b)).astype(jnp.float32)
  return jnp.sum(w * (lse - pos)), jnp.sum(w * right)


# ---- reading ------------------------------------------------------------------------------

def read_pairs(path: str, columns: Sequence[str], *, bad, encoding="utf-8") -> List[Row]:
  """Rows {"anchor", "positive", "negatives": [...]} of a .csv / .tsv / .jsonl table;
  `columns`: the anchor's, the positive's, then the hard negatives' names."""
  before = dict(bad.counts)
  ext = os.path.splitext(path.removesuffix(".bz2").removesuffix(".gz"))[1].lower()
  if ext not in (".jsonl", ".json", ".csv", ".tsv"):
    raise DataError(f"{path}: unknown table format {ext!r}; use .csv, .tsv or .jsonl")
  records = []  # (where, {column: value})
  if ext in (".jsonl", ".json"):
    for n, line in data.lines(path, bad, encoding):
      if not line.strip():
        continue
      try:
        r = json.loads(line)
      except json.JSONDecodeError as e:
        bad.report("bad_json", f"{path}:{n}", str(e))
        continue
      if not isinstance(r, dict):
        bad.report("bad_json", f"{path}:{n}", f"a JSON {type(r).__name__}, not an object")
        continue
      records.append((f"{path}:{n}", r))
  else:
    numbered = list(data.lines(path, bad, encoding))
    csv.field_size_limit(max(csv.field_size_limit(), bad.max_document_bytes))
    reader = csv.reader((line for _, line in numbered), delimiter="\t" if ext == ".tsv"
                        else ",", strict=True)
    header = None
    try:
      for rec in reader:
        where = f"{path}:{numbered[min(reader.line_num, len(numbered)) - 1][0]}"
        if not rec:
          continue
        if header is None:
          header = [h.strip() for h in rec]
          missing = [c for c in columns if c not in header]
          if missing:
            raise DataError(f"{where}: no column {missing[0]!r} (the header has {header})")
          continue
        if len(rec) != len(header):
          bad.report("corrupt_record", where, f"{len(rec)} fields where the header has "
                     f"{len(header)}")
          continue
        records.append((where, dict(zip(header, rec))))
    except csv.Error as e:
      bad.report("corrupt_record", f"{path}:{reader.line_num}", str(e))
  rows = []
  for where, r in records:
    missing = [c for c in columns if r.get(c) is None]
    if missing:
      bad.report("bad_json", where, f"no {missing[0]!r} field (it has {sorted(r)})")
      continue
    texts = [v if isinstance(v, str) else str(v) for v in (r[c] for c in columns)]
    empty = [c for c, t in zip(columns, texts) if not t.strip()]
    if empty:
      bad.report("empty", where, f"no text in {empty[0]!r}")
      continue
    rows.append(data.located(Row(anchor=texts[0], positive=texts[1],
                                 negatives=texts[2:]), where))
  data.need_rows(rows, path, bad, before)
  return rows


def read_scored(path: str, *, bad, encoding="utf-8") -> List[Row]:
  """Rows {"text", "pair", "label": float} of a scored-pairs table (sentence1,
  sentence2, score)."""
  rows = read_pairs(path, ("sentence1", "sentence2", "score"), bad=bad, encoding=encoding)
  out = []
  for r in rows:
    score = r["negatives"][0].strip()
    if not data.is_number(score):
      raise DataError(f"{r.where}: score {score!r} is not a number")
    out.append(data.located(Row(text=r["anchor"], pair=r["positive"], label=float(score)),
                            r.where))
  return out


def eval_texts(pairs, scored, query_prompt="", document_prompt=""):
  """The eval rows: one text each, {"text", "role": query | corpus | scored}, the queries
  with their relevant corpus indices ("relevant") and the scored pairs' halves with
  their score, from held-out pair rows (anchors -> queries, positives and negatives ->
  the corpus, each distinct text once)."""
  corpus, queries = {}, {}
  for r in pairs:
    for t in [r["positive"]] + list(r["negatives"]):
      corpus.setdefault(t, len(corpus))
    queries.setdefault(r["anchor"], set()).add(corpus[r["positive"]])
  rows = [Row(text=query_prompt + q, role="query", relevant=sorted(rel))
          for q, rel in queries.items()]
  rows += [Row(text=document_prompt + t, role="corpus") for t in corpus]
  for r in scored:
    rows += [Row(text=r["text"], role="scored", label=r["label"]),
             Row(text=r["pair"], role="scored", label=r["label"])]
  return rows


def retrieval(q, c, relevant, ks=(1, 10), mrr_at=10) -> Dict[str, float]:
  """recall@k (the share of a query's relevant documents in its top k, averaged) and
  MRR@k of cosine retrieval: q (Q,D), c (N,D), relevant[i] the corpus ids of query i."""
  q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
  c = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-12)
  sims = q @ c.T
  top = np.argsort(-sims, axis=1, kind="stable")[:, :max(max(ks), mrr_at)]
  out = {f"recall@{k}": 0.0 for k in ks}
  mrr = 0.0
  for i, rel in enumerate(relevant):
    rel = set(rel)
    for k in ks:
      out[f"recall@{k}"] += len(rel & set(top[i, :k].tolist())) / len(rel)
    hit = [j for j, d in enumerate(top[i, :mrr_at]) if d in rel]
    mrr += 1.0 / (hit[0] + 1) if hit else 0.0
  out = {k: v / len(relevant) for k, v in out.items()}
  out[f"mrr@{mrr_at}"] = mrr / len(relevant)
  return out, top


def _settings(f):
  return f.get("embedding", {}) or {}


@register
class Embedding(Task):
  name = "embedding"
  head_kind = None  # the encoder's pooled last hidden state is the embedding
  hf_suffix = None
  output_fields = ("pooled",)
  named_labels = False
  packable = False
  formats = ("pairs",)
  metrics = METRICS
  selection = "mrr@10"
  # the run's settings (`configured`): the defaults of configs/finetune.py
  pooling, scale, symmetric, num_negatives = "mean", 20.0, False, 0
  matryoshka = ()  # ((dim, weight), ...)

  def configured(self, f) -> "Embedding":
    """This task bound to the run's finetune.embedding settings."""
    e = _settings(f)
    out = copy.copy(self)
    out.pooling = str(e.get("pooling", "mean"))
    out.scale = float(e.get("scale", 20.0))
    out.symmetric = bool(e.get("symmetric", False))
    out.num_negatives = len(tuple(e.get("negative_columns", ()) or ()))
    dims = tuple(int(d) for d in e.get("matryoshka_dims", ()) or ())
    weights = tuple(float(w) for w in e.get("matryoshka_weights", ()) or ()) or (1.0,) * len(
        dims)
    out.matryoshka = tuple(zip(dims, weights))
    return out

  # ---- data ---------------------------------------------------------------------------

  def config_errors(self, f, seq_len):
    errs = super().config_errors(f, seq_len)
    e = _settings(f)
    if str(e.get("pooling", "mean")) not in POOLINGS:
      errs.append(f"finetune.embedding.pooling={e.get('pooling')!r}; expected one of "
                  f"{POOLINGS}")
    if not float(e.get("scale", 20.0)) > 0:
      errs.append(f"finetune.embedding.scale={e.get('scale')!r} must be > 0")
    dims = tuple(e.get("matryoshka_dims", ()) or ())
    weights = tuple(e.get("matryoshka_weights", ()) or ())
    if any(not isinstance(d, int) or d < 1 for d in dims):
      errs.append(f"finetune.embedding.matryoshka_dims={list(dims)} must be positive ints")
    if weights and len(weights) != len(dims):
      errs.append(f"finetune.embedding.matryoshka_weights={list(weights)}: one weight per "
                  f"dimension of matryoshka_dims={list(dims)}")
    scored = str(e.get("scored_pairs_file", "") or "")
    if scored and not os.path.isfile(scored):
      errs.append(f"finetune.embedding.scored_pairs_file={scored!r} does not exist")
    if str(f.get("selection_metric", "") or "") == "spearman" and not scored:
      errs.append("finetune.selection_metric='spearman' needs "
                  "finetune.embedding.scored_pairs_file")
    return errs

  def columns(self, f):
    e = _settings(f)
    return (str(e.get("anchor_column", "anchor")), str(e.get("positive_column", "positive")),
            *[str(c) for c in e.get("negative_columns", ()) or ()])

  def read_file(self, path, f, bad):
    return read_pairs(path, self.columns(f), bad=bad, encoding=f.get("encoding", "utf-8"))

  def labels(self, train, evals, f, bad, skipped, names):
    """The eval pairs become retrieval rows (`eval_texts`), plus the scored pairs."""
    e = _settings(f)
    path = str(e.get("scored_pairs_file", "") or "")
    scored = read_scored(path, bad=bad, encoding=f.get("encoding", "utf-8")) if path else []
    if scored and len(scored) < 2:
      raise DataError(f"{path}: 1 scored pair; a correlation needs 2 or more")
    return (), train, eval_texts(evals, scored, str(e.get("query_prompt", "")),
                                 str(e.get("document_prompt", "")))

  def encode(self, tok, rows, f, seq_len, pad_id, labels):
    """Training rows: the anchor's text fields, positive_* and negative_* (N,K,T);
    eval rows (one text each): the text fields."""
    tok.enable_truncation(max_length=seq_len)
    try:
      def arrays(texts):
        a = data.text_arrays(tok.encode_batch(list(texts)), seq_len, pad_id)
        return {k: a[k] for k in TEXT}
      if rows and "text" in rows[0]:
        return dict(arrays(r["text"] for r in rows),
                    example_weight=np.ones(len(rows), np.float32)), {}
      e = _settings(f)
      qp, dp = str(e.get("query_prompt", "")), str(e.get("document_prompt", ""))
      out = dict(arrays(qp + r["anchor"] for r in rows),
                 example_weight=np.ones(len(rows), np.float32))
      out.update({POSITIVE + k: v for k, v in arrays(dp + r["positive"] for r in rows).items()})
      k = len(rows[0]["negatives"]) if rows else 0
      if k:
        neg = arrays(dp + t for r in rows for t in r["negatives"])
        out.update({NEGATIVE + n: v.reshape(len(rows), k, -1) for n, v in neg.items()})
      return out, {}
    finally:
      tok.no_truncation()

  def score(self, outputs, info, labels, f):
    rows = info["rows"]
    emb = np.asarray(outputs["pooled"], np.float64)
    role = np.asarray([r["role"] for r in rows])
    q, c = emb[role == "query"], emb[role == "corpus"]
    queries = [r for r in rows if r["role"] == "query"]
    corpus = [r["text"] for r in rows if r["role"] == "corpus"]
    result, top = retrieval(q, c, [r["relevant"] for r in queries])
    s = emb[role == "scored"]
    if len(s):
      a, b = s[0::2], s[1::2]
      cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1),
                                         1e-12)
      gold = [r["label"] for r in rows if r["role"] == "scored"][0::2]
      result["spearman"] = metrics.regression(gold, cos)["spearman"]
    records = [{"query": r["text"], "relevant": [corpus[i] for i in r["relevant"]],
                "top": [corpus[i] for i in top[n, :3]]} for n, r in enumerate(queries)]
    return result, records

  # ---- training -------------------------------------------------------------------------

  # queries (often a title or a question) and documents are each cut to their own width,
  # as sentence-transformers pads each text column to its own longest: a batch of short
  # queries does not run at the documents' width
  width_groups = (("",), (POSITIVE, NEGATIVE))

  def batch_fields(self, packed=False):
    out = {k: ((SEQ,), "int32") for k in TEXT}
    out.update({POSITIVE + k: ((SEQ2,), "int32") for k in TEXT},
               example_weight=((), "float32"))
    if self.num_negatives:
      out.update({NEGATIVE + k: ((self.num_negatives, SEQ2), "int32") for k in TEXT})
    return out

  def synth_labels(self, rng, mask, first, num_labels, packed):
    """Positives (and negatives): texts of the lengths of the non-empty anchor rows, of
    ids 5..29 (in any vocabulary: this hook is not told its size)."""
    b, width = mask.shape
    real = np.flatnonzero(mask.sum(1) > 0)
    real = real if real.size else np.arange(b)

    def texts():
      m = mask[rng.choice(real, b)].astype(np.int32)
      return {"input_ids": (rng.randint(5, 30, (b, width)) * m).astype(np.int32),
              "attention_mask": m, "token_type_ids": np.zeros((b, width), np.int32)}
    out = {POSITIVE + k: v for k, v in texts().items()}
    if self.num_negatives:
      negs = [texts() for _ in range(self.num_negatives)]
      out.update({NEGATIVE + k: np.stack([n[k] for n in negs], 1) for k in TEXT})
    return out

  def run(self, encode, batch, rng):
    """The model on each text role of a batch: `encode(text fields, rng) -> TaskOutput`.
    A batch of one text per row (evaluation): pooled (B,D); a training batch: pooled
    (B, 2 + negatives, D), the anchor, the positive, then the hard negatives."""
    def embed(prefix, i):
      texts = {k: batch[prefix + k] for k in TEXT}
      shape = texts["input_ids"].shape
      texts = {k: v.reshape(-1, shape[-1]) for k, v in texts.items()}
      key = None if rng is None else jax.random.fold_in(rng, i)
      out = encode(texts, key)
      v = pool(out.last_hidden_state, texts["attention_mask"], self.pooling)
      return out, v.reshape(shape[:-1] + v.shape[-1:])

    out, anchor = embed("", 0)
    if POSITIVE + "input_ids" not in batch:
      return TaskOutput(out.last_hidden_state, pooled=anchor)
    _, positive = embed(POSITIVE, 1)
    parts = [anchor[:, None], positive[:, None]]
    if NEGATIVE + "input_ids" in batch:
      parts.append(embed(NEGATIVE, 2)[1])
    return TaskOutput(None, pooled=jnp.concatenate(parts, axis=1))

  cacheable = True  # the loss reads only `pooled`: the gradient cache applies

  @property
  def texts_per_example(self) -> int:
    return 2 + self.num_negatives

  def loss(self, out, batch):
    """(term sums, metric sums) over the whole (global) batch: InfoNCE of each anchor
    against every positive and hard negative, summed over the Matryoshka dimensions."""
    reps, w = out.pooled, batch["example_weight"]
    dims = self.matryoshka or ((reps.shape[-1], 1.0),)
    total, correct = 0.0, None
    for dim, weight in dims:
      loss_sum, right = info_nce(reps[:, 0, :dim], reps[:, 1:, :dim], w, self.scale,
                                 self.symmetric)
      total += weight * loss_sum
      correct = right if correct is None else correct  # the first dimension's ranking
    return {"task": total}, {"task_loss_sum": total, "task_correct_sum": correct,
                             "task_weight_sum": jnp.sum(w.astype(jnp.float32))}

  # ---- export -------------------------------------------------------------------------

  def export(self, model, params, path, config):
    """The HF base model + the sentence-transformers modules (module docstring)."""
    from encoders import hf  # why: encoders.hf imports this package (a cycle at import)
    from encoders import base
    backbone = base.family(model.config.get("family", "bert"))(config=model.config)
    hf.to_hf(backbone, params, path)
    write_sentence_transformers(path, int(model.config.hidden_size), self.pooling,
                                int(config.data.seq_len), _settings(config.finetune))
    return path


def write_sentence_transformers(path, dim, pooling, max_seq_length, e):
  """The sentence-transformers files (encoders/sentence.py's writer) into `path`: this
  pooling, Normalize, max_seq_length, the query/document prompts, cosine similarity."""
  prompts = {k: str(e.get(f"{k}_prompt", "")) for k in ("query", "document")}
  sentence.write(path, sentence.Spec(pooling=(pooling,), normalize=True,
                                     max_seq_length=max_seq_length,
                                     prompts={k: v for k, v in prompts.items() if v},
                                     similarity_fn_name="cosine"), dim)