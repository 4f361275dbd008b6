"""Extractive question answering: the answer's start and end token in the context.

    --config configs/finetune.py:qa           finetune.data_format: squad

Data: SQuAD-format JSON (v1.1, or v2.0 with is_impossible / empty answers). Question +
context go in windows of seq_len tokens that overlap by `finetune.stride` tokens of
context; a window's target is the answer's first and last token when it holds the answer
whole, else 0 (the [CLS] position: "no answer here"). Scored by SQuAD's exact match and
F1 over the best span of n-best start/end pairs across an example's windows (v2: "" when
the null score beats it by `null_threshold`); the pipeline is `answer`.
"""
import json
import math
from typing import Dict, List, Optional, Sequence, Tuple

import jax.numpy as jnp
import numpy as np

from encoders.tasks import data, metrics
from encoders.tasks.base import Task, TaskOutput, register, weighted_ce
from encoders.tasks.data import DataError, Row


def read_squad(path: str, *, bad, encoding: str = "utf-8") -> List[Row]:
  """Examples {"id", "question", "context", "answers": [{"text", "answer_start"}]}; a
  question with a missing field or an answer not at its answer_start is bad (named by
  its place in the file, data[i].paragraphs[j].qas[k], and its id)."""
  before = dict(bad.counts)
  raw = data.open_bytes(path)
  try:
    squad = json.loads(raw.decode(encoding))
  except UnicodeDecodeError as e:
    raise DataError(f"{path}: not {encoding.upper()} at byte {e.start} ({e.reason})") from None
  except json.JSONDecodeError as e:
    raise DataError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
  if not isinstance(squad, dict) or not isinstance(squad.get("data"), list):
    raise DataError(f"{path}: not SQuAD JSON (no top-level 'data' list)")
  out = []
  for i, article in enumerate(squad["data"]):
    paras = article.get("paragraphs") if isinstance(article, dict) else None
    if not isinstance(paras, list):
      bad.report("corrupt_record", f"{path}: data[{i}]", "no 'paragraphs' list")
      continue
    for j, para in enumerate(paras):
      here = f"{path}: data[{i}].paragraphs[{j}]"
      if not isinstance(para, dict) or not isinstance(para.get("context"), str) or \
          not isinstance(para.get("qas"), list):
        bad.report("corrupt_record", here, "needs a 'context' string and a 'qas' list")
        continue
      ctx = para["context"]
      for k, qa in enumerate(para["qas"]):
        ex = _squad_question(qa, ctx, f"{here}.qas[{k}]", bad)
        if ex is not None:
          out.append(ex)
  data.need_rows(out, path, bad, before)
  return out


def _squad_question(qa, ctx: str, where: str, bad) -> Optional[Row]:
  if not isinstance(qa, dict) or "id" not in qa or not isinstance(qa.get("question"), str):
    bad.report("corrupt_record", where, "a question needs an 'id' and a 'question'")
    return None
  where = f"{where} (id {qa['id']!r})"
  answers = [] if qa.get("is_impossible") else qa.get("answers", [])
  if not isinstance(answers, list):
    bad.report("corrupt_record", where, "'answers' is not a list")
    return None
  for a in answers:
    if not isinstance(a, dict) or not isinstance(a.get("text"), str) or \
        not isinstance(a.get("answer_start"), int) or isinstance(a["answer_start"], bool):
      bad.report("corrupt_record", where, f"an answer needs a 'text' and an integer "
                 f"'answer_start', got {a!r}")
      return None
    s = a["answer_start"]
    if s < 0 or ctx[s:s + len(a["text"])] != a["text"]:
      bad.report("corrupt_record", where, f"answer {a['text']!r} is not at answer_start {s}")
      return None
  return data.located(Row(id=str(qa["id"]), question=qa["question"], context=ctx,
                          answers=list(answers)), where)


def encode_qa(tok, examples: Sequence[Dict], seq_len: int, pad_id: int, stride: int = 128
              ) -> Tuple[Dict, List[Dict]]:
  """-> (arrays, one meta dict per window: example index, token char offsets, and which
  positions are context)."""
  if stride >= seq_len // 2:
    raise ValueError(f"stride {stride} must be below half of seq_len {seq_len}")
  tok.enable_truncation(max_length=seq_len, stride=stride, strategy="only_second")
  windows, starts, ends, meta = [], [], [], []
  for ei, ex in enumerate(examples):
    enc = tok.encode(ex["question"], ex["context"])
    for w in [enc] + list(enc.overflowing):
      seq = w.sequence_ids
      ctx = [j for j, s in enumerate(seq) if s == 1]
      start = end = 0
      if ex["answers"] and ctx:
        a = ex["answers"][0]
        s_char, e_char = a["answer_start"], a["answer_start"] + len(a["text"])
        lo, hi = w.offsets[ctx[0]][0], w.offsets[ctx[-1]][1]
        if lo <= s_char and e_char <= hi:
          start = next(j for j in ctx if w.offsets[j][1] > s_char)
          end = max(j for j in ctx if w.offsets[j][0] < e_char)
      windows.append(w)
      starts.append(start)
      ends.append(end)
      meta.append({"example": ei, "offsets": list(w.offsets),
                   "context": [s == 1 for s in seq]})
  tok.no_truncation()
  arrays = data.text_arrays(windows, seq_len, pad_id)
  arrays["start_positions"] = np.asarray(starts, np.int32)
  arrays["end_positions"] = np.asarray(ends, np.int32)
  return arrays, meta


def best_spans(start_logits, end_logits, meta: Dict, context: str, n_best: int = 20,
               max_answer_length: int = 30) -> Tuple[List[Dict], float]:
  """The n-best answer spans of one window (text, char start/end, score = start + end
  logit), best first, and its no-answer score (start + end logit at position 0)."""
  ctx = np.asarray(meta["context"] + [False] * (len(start_logits) - len(meta["context"])))
  s_idx = np.argsort(start_logits)[::-1][:n_best]
  e_idx = np.argsort(end_logits)[::-1][:n_best]
  spans = []
  for s in s_idx:
    for e in e_idx:
      if not (ctx[s] and ctx[e]) or e < s or e - s + 1 > max_answer_length:
        continue
      a, b = meta["offsets"][s][0], meta["offsets"][e][1]
      spans.append({"text": context[a:b], "start": int(a), "end": int(b),
                    "score": float(start_logits[s] + end_logits[e])})
  spans.sort(key=lambda x: -x["score"])
  return spans[:n_best], float(start_logits[0] + end_logits[0])


def _softmax(x):
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def answer(p, question: str, context: str, top_k: int = 1, doc_stride: int = 128,
           max_answer_len: int = 15, max_seq_len: Optional[int] = None,
           handle_impossible_answer: bool = False):
  """{"score", "start", "end", "answer"} (or the top_k list), as transformers'
  question-answering pipeline scores spans: per window, softmax over the context tokens
  (and [CLS]) of start and end, score = p(start) * p(end), spans of at most
  max_answer_len tokens; long contexts in windows overlapping by doc_stride tokens."""
  if not isinstance(p.unit, QuestionAnswering):
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


@register
class QuestionAnswering(Task):
  name = "qa"
  head_kind = "span"
  num_outputs = 2
  hf_suffix = "ForQuestionAnswering"
  output_fields = ("start_logits", "end_logits")
  per_token = True
  packable = False
  named_labels = False
  formats = ("squad",)
  metrics = ("exact_match", "f1")
  selection = "f1"

  def outputs(self, hidden, logits, pooled):
    return TaskOutput(hidden, start_logits=logits[..., 0], end_logits=logits[..., 1])

  def pad_value(self, field):
    return -1e9  # no span starts or ends in padding

  def config_errors(self, f, seq_len):
    errs = super().config_errors(f, seq_len)
    if not 0 <= int(f.stride) < seq_len // 2:
      errs.append(f"finetune.stride={f.stride} must be in [0, data.seq_len // 2 = "
                  f"{seq_len // 2})")
    for key in ("n_best", "max_answer_length"):
      if int(f.get(key)) < 1:
        errs.append(f"finetune.{key}={f.get(key)!r} must be >= 1")
    return errs

  def read_file(self, path, f, bad):
    return read_squad(path, bad=bad, encoding=f.get("encoding", "utf-8"))

  def encode(self, tok, rows, f, seq_len, pad_id, labels):
    arrays, meta = encode_qa(tok, rows, seq_len, pad_id, int(f.stride))
    return arrays, {"meta": meta}

  def score(self, outputs, info, labels, f):
    rows, best = info["rows"], {}
    for w, meta in enumerate(info["meta"]):
      ex = rows[meta["example"]]
      spans, null = best_spans(outputs["start_logits"][w], outputs["end_logits"][w], meta,
                               ex["context"], int(f.n_best), int(f.max_answer_length))
      cur = best.setdefault(meta["example"], {"span": None, "null": math.inf})
      cur["null"] = min(cur["null"], null)
      if spans and (cur["span"] is None or spans[0]["score"] > cur["span"]["score"]):
        cur["span"] = spans[0]
    preds = []
    for i, ex in enumerate(rows):
      b = best.get(i, {"span": None, "null": math.inf})
      text = b["span"]["text"] if b["span"] else ""
      if f.version_2 and (b["span"] is None
                          or b["null"] - b["span"]["score"] > f.null_threshold):
        text = ""
      preds.append(text)
    result = metrics.squad([[a["text"] for a in ex["answers"]] for ex in rows], preds)
    return result, [{"id": ex["id"], "prediction": p,
                     "answers": [a["text"] for a in ex["answers"]]}
                    for ex, p in zip(rows, preds)]

  def batch_fields(self, packed=False):
    fields = super().batch_fields(packed)
    del fields["labels"]
    return dict(fields, start_positions=((), "int32"), end_positions=((), "int32"))

  def synth_labels(self, rng, mask, first, num_labels, packed):
    shortest = max(int(mask.sum(1).min()), 1)
    start = rng.randint(0, shortest, mask.shape[0]).astype(np.int32)
    return {"start_positions": start, "end_positions": start}

  def label_weights(self, batch):
    return batch["example_weight"].astype(jnp.float32)

  def loss(self, out, batch):
    w = self.label_weights(batch)
    s_sum, _ = weighted_ce(out.start_logits, batch["start_positions"], w)
    e_sum, _ = weighted_ce(out.end_logits, batch["end_positions"], w)
    both = ((jnp.argmax(out.start_logits, -1) == batch["start_positions"])
            & (jnp.argmax(out.end_logits, -1) == batch["end_positions"]))
    loss_sum = 0.5 * (s_sum + e_sum)  # transformers' (start + end) / 2
    return {"task": loss_sum}, {"task_loss_sum": loss_sum, "task_weight_sum": jnp.sum(w),
                                "task_correct_sum": jnp.sum(jnp.where(both, w, 0.0))}

  def pipeline(self, p, question, context, **kwargs):
    return answer(p, question, context, **kwargs)
