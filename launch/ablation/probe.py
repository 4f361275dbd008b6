"""A frozen-feature linear probe: how much a pretrained encoder's features know about a
labelled task, with no fine-tuning noise.

  feats = features(hf_dir, texts, seq_len=128)            # one vector per text
  acc = probe(feats[tr], y[tr], feats[ev], y[ev])["accuracy"]

Features are the encoder's last hidden state, mean-pooled over the real tokens ("mean")
or the first token's ("cls"), or ("mlm", for a model with an MLM head) the log of the
MLM head's predicted-token distribution averaged over the real tokens: a bag of the
words the model expects at each position. A linear probe on pooled hidden states cannot
apply the head's per-token nonlinearity before pooling; at CPU scale only "mlm" told a
pretrained tiny BERT from the same model at random init (docs/ablations/README.md). The probe is a multinomial logistic regression on
standardised features with an L2 penalty picked from `L2_GRID` on a fixed validation
slice of the training rows, then refit on all of them: deterministic (L-BFGS from zero),
so two encoders differ only by their features.
"""
from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize

import encoders
from encoders.tasks import data as task_data
from launch.data import finetune_data as fd

POOLS = ("mean", "cls", "mlm")
L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1)
VAL_FRACTION = 0.2


def read_labelled(path, text_column="text", label_column="label"):
  """(texts, class ids, class names) of a .csv/.tsv/.jsonl table; classes in sorted order,
  1, "1" and 1.0 one class (as fine-tuning names them)."""
  rows = fd.read_table(path, text_column, label=label_column)
  names = [task_data.canonical_label(r["label"]) for r in rows]
  keep = [i for i, n in enumerate(names) if n is not None]
  classes = sorted({names[i] for i in keep})
  if len(classes) < 2:
    raise ValueError(f"{path}: the probe needs at least 2 classes, found {classes}")
  index = {c: i for i, c in enumerate(classes)}
  return ([rows[i]["text"] for i in keep], np.asarray([index[names[i]] for i in keep]),
          classes)


def split(n, eval_fraction=0.2, split_seed=0, max_train=-1):
  """(training rows, held-out rows): launch.finetune's seeded split; the training rows
  in a seeded random order (tables are often sorted by label: the probe's validation
  slice is their tail), the first `max_train` of them when max_train > 0."""
  tr, ev = fd.holdout(n, float(eval_fraction), int(split_seed))
  tr = np.random.default_rng(int(split_seed) + 1).permutation(np.asarray(tr))
  if max_train and max_train > 0:
    tr = tr[:int(max_train)]
  return tr, np.asarray(ev)


def _pad_id(hf_dir):
  with open(os.path.join(hf_dir, "config.json")) as f:
    return int(json.load(f).get("pad_token_id", 0) or 0)


def features(hf_dir, texts, seq_len=128, pool="mean", batch_size=32):
  """[len(texts), hidden] float64 features of the encoder in `hf_dir` (its own
  tokenizer, [CLS] text [SEP] truncated to seq_len)."""
  if pool not in POOLS:
    raise ValueError(f"pool={pool!r}: expected one of {POOLS}")
  tok = fd.load_tokenizer(hf_dir)
  model, params = encoders.from_hf(hf_dir)  # its heads too: a strict load refuses fewer
  pad = _pad_id(hf_dir)
  tok.enable_truncation(max_length=int(seq_len))
  encs = tok.encode_batch(list(texts))
  tok.no_truncation()
  arrays = task_data.text_arrays(encs, int(seq_len), pad)

  @jax.jit
  def pooled(params, ids, mask, types):
    out = model.apply({"params": params}, ids, mask, types)
    if pool == "mlm":
      if out.mlm_logits is None:
        raise ValueError(f"{hf_dir} has no MLM head: probe.pool='mlm' needs one")
      h = jax.nn.softmax(out.mlm_logits.astype(jnp.float32))
    else:
      h = out.last_hidden_state.astype(jnp.float32)
    if pool == "cls":
      return h[:, 0]
    m = mask.astype(jnp.float32)[..., None]
    h = (h * m).sum(1) / jnp.maximum(m.sum(1), 1.0)
    return jnp.log(h + 1e-6) if pool == "mlm" else h

  out = []
  n = len(texts)
  for i in range(0, n, batch_size):
    sl = slice(i, min(n, i + batch_size))
    ids, mask = arrays["input_ids"][sl], arrays["attention_mask"][sl]
    types = arrays.get("token_type_ids", np.zeros_like(ids))[sl]
    k = ids.shape[0]
    if k < batch_size:  # one compiled shape: pad the last batch with empty rows
      fill = lambda a: np.concatenate([a, np.zeros((batch_size - k,) + a.shape[1:], a.dtype)])
      ids, mask, types = fill(ids), fill(mask), fill(types)
    out.append(np.asarray(pooled(params, ids, mask, types))[:k])
  return np.concatenate(out).astype(np.float64)


def _standardise(train, *others):
  mu, sd = train.mean(0), train.std(0)
  sd = np.where(sd > 1e-8, sd, 1.0)
  return [(x - mu) / sd for x in (train,) + others]


def fit_logistic(x, y, n_classes, l2):
  """(W [d, k], b [k]) minimising mean cross-entropy + l2/2 |W|^2, from zero. With more
  features than rows the minimiser lies in the rows' span (the penalty only grows
  outside it): the fit runs on the rows' coordinates in that span, the same solution
  at n instead of d dimensions (8,000 for pool="mlm")."""
  n, d = x.shape
  if d > n:
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    w, b = fit_logistic(x @ vt.T, y, n_classes, l2)
    return vt.T @ w, b
  onehot = np.eye(n_classes)[y]

  def loss_grad(theta):
    w, b = theta[:d * n_classes].reshape(d, n_classes), theta[d * n_classes:]
    z = x @ w + b
    z -= z.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    p = np.exp(logp)
    loss = -(onehot * logp).sum() / n + 0.5 * l2 * (w * w).sum()
    g = (p - onehot) / n
    return loss, np.concatenate([(x.T @ g + l2 * w).ravel(), g.sum(0)])

  res = optimize.minimize(loss_grad, np.zeros(d * n_classes + n_classes), jac=True,
                          method="L-BFGS-B", options={"maxiter": 500})
  return res.x[:d * n_classes].reshape(d, n_classes), res.x[d * n_classes:]


def _accuracy(w, b, x, y):
  return float(np.mean(np.argmax(x @ w + b, 1) == y))


def probe(x_train, y_train, x_eval, y_eval, l2_grid=L2_GRID):
  """Held-out accuracy of the logistic probe ({"accuracy", "l2", "n_train", "n_eval",
  "se"}: se is the binomial standard error over the held-out rows)."""
  x_train, y_train = np.asarray(x_train, np.float64), np.asarray(y_train)
  x_eval, y_eval = np.asarray(x_eval, np.float64), np.asarray(y_eval)
  k = int(max(y_train.max(), y_eval.max())) + 1
  n_val = max(1, int(round(len(y_train) * VAL_FRACTION)))
  fit_x, val_x = x_train[:-n_val], x_train[-n_val:]
  fit_y, val_y = y_train[:-n_val], y_train[-n_val:]
  fit_x, val_x = _standardise(fit_x, val_x)
  scores = [_accuracy(*fit_logistic(fit_x, fit_y, k, l2), val_x, val_y) for l2 in l2_grid]
  l2 = l2_grid[int(np.argmax(scores))]  # ties: the smallest penalty
  tr, ev = _standardise(x_train, x_eval)
  acc = _accuracy(*fit_logistic(tr, y_train, k, l2), ev, y_eval)
  return {"accuracy": acc, "l2": l2, "n_train": int(len(y_train)),
          "n_eval": int(len(y_eval)), "se": float(np.sqrt(acc * (1 - acc) / len(y_eval)))}


def majority(y_train, y_eval):
  """Accuracy of always predicting the most frequent training class."""
  top = int(np.bincount(np.asarray(y_train)).argmax())
  return float(np.mean(np.asarray(y_eval) == top))
