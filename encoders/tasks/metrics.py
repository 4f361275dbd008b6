"""Fine-tuning metrics, computed on the host from predictions (numpy only):

- classification: accuracy, macro-F1 (over the classes that occur in the gold or the
  predicted labels, as scikit-learn's default), the confusion matrix and its PNG;
- tagging: entity-level precision/recall/F1 with exact span match over BIO/IOB2 tags,
  chunks read as seqeval's default (conlleval) mode does, and token accuracy (the share
  of words whose tag is right: what a tag set without chunks, such as part-of-speech
  tags, is scored by);
- extractive QA: SQuAD exact match and token F1 after SQuAD's answer normalisation, the
  max over the gold answers (an unanswerable question scores 1 only for an empty answer);
- regression: Pearson and Spearman (average ranks for ties) correlations.
"""
import collections
import re
import string
from typing import Dict, List, Sequence, Tuple

import numpy as np


# ---- classification ---------------------------------------------------------------------

def confusion_matrix(y_true, y_pred, num_classes: int) -> np.ndarray:
  """(num_classes, num_classes) counts, rows gold, columns predicted."""
  m = np.zeros((num_classes, num_classes), np.int64)
  np.add.at(m, (np.asarray(y_true, np.int64), np.asarray(y_pred, np.int64)), 1)
  return m


def classification(y_true, y_pred, num_classes: int) -> Dict[str, float]:
  y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
  if y_true.shape != y_pred.shape or y_true.size == 0:
    raise ValueError(f"need equal, non-empty label arrays, got {y_true.shape} and "
                     f"{y_pred.shape}")
  m = confusion_matrix(y_true, y_pred, num_classes)
  tp = np.diag(m).astype(np.float64)
  gold, pred = m.sum(1), m.sum(0)
  present = (gold + pred) > 0
  f1 = np.where(gold + pred > 0, 2 * tp / np.maximum(gold + pred, 1), 0.0)
  return {"accuracy": float(tp.sum() / m.sum()), "macro_f1": float(f1[present].mean())}


def plot_confusion(matrix: np.ndarray, labels: Sequence[str], path: str, title: str = ""):
  import matplotlib  # slow to import, and only the end of a classification run plots
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # after the backend is chosen
  n = len(labels)
  fig, ax = plt.subplots(figsize=(1.2 + 0.6 * n, 1.0 + 0.6 * n))
  ax.imshow(matrix, cmap="Blues")
  for i in range(n):
    for j in range(n):
      ax.text(j, i, str(int(matrix[i, j])), ha="center", va="center", fontsize=8,
              color="white" if matrix[i, j] > matrix.max() / 2 else "black")
  ax.set_xticks(range(n), labels, rotation=45, ha="right", fontsize=8)
  ax.set_yticks(range(n), labels, fontsize=8)
  ax.set_xlabel("predicted"), ax.set_ylabel("gold"), ax.set_title(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


# ---- tagging ------------------------------------------------------------------------------

def _split_tag(tag: str) -> Tuple[str, str]:
  if tag in ("O", "", None):
    return "O", ""
  if len(tag) > 1 and tag[1] in "-_" and tag[0] in "BIESL":
    return tag[0], tag[2:]
  return "I", tag  # a bare type counts as inside


def entities(tags: Sequence[str]) -> List[Tuple[str, int, int]]:
  """(type, first, last) chunks of one tag sequence, conlleval's rules: a chunk starts at
  B (or S), or at I/E whose type differs from the open chunk's, or after O."""
  out, start, kind = [], None, None
  prev_p, prev_t = "O", ""
  for i, tag in enumerate(list(tags) + ["O"]):
    p, t = _split_tag(tag)
    end = start is not None and (
        p in ("B", "S", "O") or t != prev_t or prev_p in ("E", "S", "L"))
    if end:
      out.append((kind, start, i - 1))
      start = None
    begin = p in ("B", "S") or (p in ("I", "E", "L") and (start is None))
    if begin and p != "O":
      start, kind = i, t
    prev_p, prev_t = p, t
  return out


def entity_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> Dict[str, float]:
  """Micro precision/recall/F1 of exact (type, span) matches over all sentences."""
  if len(gold) != len(pred):
    raise ValueError(f"{len(gold)} gold sentences, {len(pred)} predicted")
  n_gold = n_pred = n_ok = 0
  for g, p in zip(gold, pred):
    if len(g) != len(p):
      raise ValueError(f"a sentence has {len(g)} gold tags and {len(p)} predicted")
    ge = {(k, a, b) for k, a, b in entities(g)}
    pe = {(k, a, b) for k, a, b in entities(p)}
    n_gold, n_pred, n_ok = n_gold + len(ge), n_pred + len(pe), n_ok + len(ge & pe)
  prec = n_ok / n_pred if n_pred else 0.0
  rec = n_ok / n_gold if n_gold else 0.0
  f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
  return {"entity_precision": prec, "entity_recall": rec, "entity_f1": f1}


def token_accuracy(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> float:
  """The share of words, over all sentences, whose predicted tag equals the gold tag."""
  if len(gold) != len(pred):
    raise ValueError(f"{len(gold)} gold sentences, {len(pred)} predicted")
  n = ok = 0
  for g, p in zip(gold, pred):
    if len(g) != len(p):
      raise ValueError(f"a sentence has {len(g)} gold tags and {len(p)} predicted")
    n += len(g)
    ok += sum(a == b for a, b in zip(g, p))
  return ok / n if n else 0.0


# ---- extractive QA ------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
  """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
  s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
  return " ".join(_ARTICLES.sub(" ", s).split())


def _f1(gold: str, pred: str) -> float:
  g, p = normalize_answer(gold).split(), normalize_answer(pred).split()
  if not g or not p:
    return float(g == p)
  common = collections.Counter(g) & collections.Counter(p)
  same = sum(common.values())
  if same == 0:
    return 0.0
  prec, rec = same / len(p), same / len(g)
  return 2 * prec * rec / (prec + rec)


def squad(golds: Sequence[Sequence[str]], preds: Sequence[str]) -> Dict[str, float]:
  """EM and F1 (in [0, 1]); golds[i] lists question i's answers ([] or [""]: none)."""
  if len(golds) != len(preds) or not preds:
    raise ValueError(f"{len(golds)} questions with answers, {len(preds)} predictions")
  em = f1 = 0.0
  for answers, pred in zip(golds, preds):
    answers = [a for a in answers if normalize_answer(a)] or [""]
    em += max(float(normalize_answer(a) == normalize_answer(pred)) for a in answers)
    f1 += max(_f1(a, pred) for a in answers)
  return {"exact_match": em / len(preds), "f1": f1 / len(preds)}


# ---- regression ---------------------------------------------------------------------------

def _ranks(x: np.ndarray) -> np.ndarray:
  order = np.argsort(x, kind="mergesort")
  ranks = np.empty(len(x), np.float64)
  ranks[order] = np.arange(len(x), dtype=np.float64)
  _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
  sums = np.zeros(len(counts))
  np.add.at(sums, inverse, ranks)
  return sums[inverse] / counts[inverse]


def regression(y_true, y_pred) -> Dict[str, float]:
  a, b = np.asarray(y_true, np.float64).ravel(), np.asarray(y_pred, np.float64).ravel()
  if a.shape != b.shape or a.size < 2:
    raise ValueError(f"need two equal arrays of at least 2 values, got {a.shape}, {b.shape}")

  def corr(x, y):
    x, y = x - x.mean(), y - y.mean()
    d = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / d) if d > 0 else 0.0

  return {"pearson": corr(a, b), "spearman": corr(_ranks(a), _ranks(b)),
          "mse": float(np.mean((a - b) ** 2))}
