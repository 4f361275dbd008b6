"""Token classification (tagging): a label per word, e.g. named entities or parts of speech.

    --config configs/finetune.py:token        finetune.data_format: conll

Data: CoNLL-style files, one token per line, the token first and the tag last (whitespace
separated), sentences separated by blank lines; -DOCSTART- lines are skipped. Words are
pre-tokenized; the FIRST sub-token of each word carries its tag, the other sub-tokens,
special tokens and padding IGNORE; words cut off by the length limit are predicted "O".
Scored by entity precision / recall / F1 (BIO chunks, conlleval's rules) and token
accuracy; the pipeline is `tag`.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from encoders.tasks import data, metrics
from encoders.tasks.base import IGNORE, Task, majority_accuracy, register
from encoders.tasks.data import Sentence


def read_conll(path: str, *, bad, encoding: str = "utf-8") -> List[Sentence]:
  """(words, tags) per sentence. Every token line has the same number of columns (at
  least 2: the token first, the tag last) as the file's first; a sentence with a line
  that does not is bad (corrupt_record) as a whole."""
  before = dict(bad.counts)
  out, words, tags, first, width, broken = [], [], [], 0, None, False

  def close():
    if words and not broken:
      out.append(data.located(Sentence((words, tags)), f"{path}:{first}"))

  for n, line in data.lines(path, bad, encoding):
    parts = line.split()
    if not parts:
      close()
      words, tags, broken = [], [], False
      continue
    if parts[0] == "-DOCSTART-":
      continue
    if not words and not broken:
      first = n
    if broken:
      continue
    if len(parts) < 2 or (width is not None and len(parts) != width):
      want = f"{width} columns" if width is not None and len(parts) >= 2 else \
          "'token ... tag'"
      bad.report("corrupt_record", f"{path}:{n}", f"expected {want}, got {line.strip()!r}")
      broken = True
      continue
    width = width or len(parts)
    words.append(parts[0])
    tags.append(parts[-1])
  close()
  data.need_rows(out, path, bad, before)
  return out


def tag_names(given: Sequence) -> Tuple[str, ...]:
  """`finetune.labels` as tag names (stripped); empty or repeated ones are an error."""
  labels = tuple(str(g).strip() for g in given)
  if len(set(labels)) != len(labels) or not all(labels):
    raise ValueError(f"finetune.labels {list(given)}: empty or repeated tag names")
  return labels


def tag_labels(train, evals, given=(), unknown: str = "error",
               skipped: Optional[Dict[str, int]] = None,
               names: Tuple[str, str] = ("the training sentences", "the eval sentences")):
  """-> (tags, train sentences, eval sentences). The tag set is `given`, else the
  training tags (string order); a training tag outside `given` is an error; an eval tag
  outside the set per `unknown` (the whole sentence skipped)."""
  skipped = {} if skipped is None else skipped
  if given:
    labels = tag_names(given)
    data.check_known(train, lambda s: s[1], labels, "finetune.labels", "training", "error",
                     skipped)
  else:
    labels = tuple(sorted({t for _, tags in train for t in tags}))
  evals = data.check_known(evals, lambda s: s[1], labels,
                           "finetune.labels" if given else "training", "eval", unknown,
                           skipped)
  data.need_known(evals, names[1], skipped)
  return labels, train, evals


def encode_tokens(tok, sentences: Sequence[Tuple[List[str], List[str]]], seq_len: int,
                  pad_id: int, labels: Sequence[str]) -> Tuple[Dict, List[List[int]]]:
  """-> (arrays, per sentence the row position of each word's first sub-token, -1 for
  words cut off by the length limit)."""
  index = {name: i for i, name in enumerate(labels)}
  tok.enable_truncation(max_length=seq_len)
  encs = tok.encode_batch([list(w) for w, _ in sentences], is_pretokenized=True)
  tok.no_truncation()
  y = np.full((len(sentences), seq_len), IGNORE, np.int32)
  firsts = []
  for i, (enc, (words, tags)) in enumerate(zip(encs, sentences)):
    first = [-1] * len(words)
    for pos, w in enumerate(enc.word_ids):
      if w is not None and first[w] < 0:
        first[w] = pos
        if tags[w] not in index:
          raise ValueError(f"tag {tags[w]!r} is not among the labels {list(labels)}")
        y[i, pos] = index[tags[w]]
    firsts.append(first)
  return dict(data.text_arrays(encs, seq_len, pad_id), labels=y), firsts


def tag(p, texts: Sequence[str], ignore=("O",)):
  """Per text, per (non-special) token whose label is not ignored: {"entity", "score",
  "index", "word", "start", "end"}, as transformers' token-classification pipeline with
  aggregation_strategy="none"."""
  if not isinstance(p.unit, TokenClassification):
    raise ValueError("tag needs a token-classification model")
  labels = p.labels()
  encs = p.encode(texts)
  out = []
  for e, row in zip(encs, p.run(encs)):
    x = row["logits"].astype(np.float64)
    probs = np.exp(x - x.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
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


@register
class TokenClassification(Task):
  name = "token"
  head_kind = "per_token"
  hf_suffix = "ForTokenClassification"
  per_token = True
  token_labels = True
  formats = ("conll",)
  metrics = ("entity_precision", "entity_recall", "entity_f1", "token_accuracy")
  selection = "entity_f1"

  def label_set(self, values, given=()):
    return tag_names(given) if given else tuple(sorted(set(values)))

  def read_file(self, path, f, bad):
    return read_conll(path, bad=bad, encoding=f.get("encoding", "utf-8"))

  def labels(self, train, evals, f, bad, skipped, names):
    return tag_labels(train, evals, tuple(f.labels), str(f.get("unknown_eval_labels",
                                                               "error")), skipped, names)

  def encode(self, tok, rows, f, seq_len, pad_id, labels):
    arrays, firsts = encode_tokens(tok, rows, seq_len, pad_id, labels)
    return arrays, {"firsts": firsts}

  def score(self, outputs, info, labels, f):
    pred_ids = outputs["logits"].argmax(-1)
    golds, preds = [], []
    for i, ((words, tags), first) in enumerate(zip(info["rows"], info["firsts"])):
      golds.append(list(tags))
      preds.append([labels[pred_ids[i, p]] if p >= 0 else "O" for p in first])
    result = dict(metrics.entity_f1(golds, preds),
                  token_accuracy=metrics.token_accuracy(golds, preds))
    return result, [{"words": w, "tags": g, "prediction": p}
                    for (w, _), g, p in zip(info["rows"], golds, preds)]

  def baselines(self, train_batches, eval_items):
    return majority_accuracy(train_batches, eval_items)

  def pipeline(self, p, texts, ignore=("O",)):
    return tag(p, texts, ignore)
