"""The end-of-run fill-mask demo: a few HELD-OUT sentences (rows of the eval split, never
training text) with one word masked, and the trained model's top predictions.

A masked word is a single-piece word (its piece begins a word and the next piece begins
another), alphabetic, at least 3 characters, not the sentence's first word: the kind of
word a reader can judge. Predictions skip special tokens and pieces that decode to
nothing (the bare word mark); the rest are ranked by the model's probability.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

MARK = "\u2581"  # sentencepiece's word mark '▁'
BYTE_LEVEL_MARK = "\u0120"  # byte-level BPE's 'Ġ'


def _piece(tokenizer, i: int) -> str:
  return tokenizer.id_to_token(int(i)) or ""


def _word(tokenizer, i: int) -> str:
  return _piece(tokenizer, i).lstrip(MARK).lstrip(BYTE_LEVEL_MARK)


def examples(tok, batches, n: int = 3, max_tokens: int = 24):
  """Up to `n` (tokens, masked index) from distinct held-out rows of `batches` (the
  pipeline's eval batches, with `segment_ids` and `word_starts`): the first segment's
  text (up to `max_tokens` pieces, cut after a '.' where there is one)."""
  if not batches:
    return []
  b = batches[0]
  out = []
  for ids, seg, starts in zip(b["input_ids"], b["segment_ids"], b["word_starts"]):
    real = np.flatnonzero((seg == seg[0]) & (seg > 0))
    if len(real) < 8 or ids[0] != tok.cls_id:
      continue
    body = [int(i) for i in ids[1:real[-1] + 1]]
    if tok.sep_id in body:
      body = body[:body.index(tok.sep_id)]
    body = body[:max_tokens]
    stops = [k for k, i in enumerate(body) if _piece(tok, i) in (".", MARK + ".") and k >= 6]
    if stops:
      body = body[:stops[0] + 1]
    ws = [bool(starts[1 + k]) for k in range(len(body))] + [True]
    cands = [k for k in range(1, len(body)) if ws[k] and ws[k + 1]
             and _word(tok, body[k]).isalpha() and len(_word(tok, body[k])) >= 3]
    if cands:
      out.append((body, cands[len(cands) // 2]))
    if len(out) == n:
      break
  return out


def predict(objective, params, tokenizer, tokens, position, k: int = 5):
  """The model's top-k (piece id, probability) at `position` of `tokens` masked there."""
  ids = [tokenizer.cls_id] + list(tokens) + [tokenizer.sep_id]
  ids[1 + position] = tokenizer.mask_id
  x = jnp.asarray([ids], jnp.int32)
  out = objective.model.apply({"params": params["encoder"]}, x,
                              attention_mask=jnp.ones_like(x),
                              token_type_ids=jnp.zeros_like(x))
  logits = np.asarray(jax.device_get(out.mlm_logits[0, 1 + position]), np.float64)
  logits = logits[:tokenizer.vocab_size]
  probs = np.exp(logits - logits.max())
  probs /= probs.sum()
  keep = []
  for i in np.argsort(-probs):
    if tokenizer.special[i] or not _word(tokenizer, i).strip():
      continue
    keep.append((int(i), float(probs[i])))
    if len(keep) == k:
      break
  return keep


def masked_text(tokenizer, tokens, position) -> str:
  """The sentence with its word at `position` shown as the mask token."""
  mask = _piece(tokenizer, tokenizer.mask_id)
  left = tokenizer.decode(tokens[:position])
  right = tokenizer.decode(tokens[position + 1:]) if position + 1 < len(tokens) else ""
  after = " " if position + 1 < len(tokens) and _piece(tokenizer, tokens[position + 1]
                                                        ).startswith(MARK) else ""
  return f"{left} {mask}{after}{right}".strip()


def lines(objective, params, tok, batches, n: int = 3, k: int = 5) -> list[str]:
  """The demo's printed lines; [] when the objective has no MLM head or no held-out data."""
  model_config = getattr(objective, "model_config", None)
  if getattr(objective, "model", None) is None or model_config is None \
      or "mlm" not in tuple(model_config.get("heads", ())):
    return []
  found = examples(tok, batches, n)
  if not found:
    return []
  out = [(f"fill-mask on {len(found)} held-out sentences (eval split, never trained on); "
          f"the model's top {k}:")]
  for tokens, pos in found:
    preds = predict(objective, params, tok, tokens, pos, k)
    out.append(f"  {masked_text(tok, tokens, pos)}")
    out.append("      " + "  ".join(f"{_word(tok, i)} {100 * p:.1f}%" for i, p in preds)
               + f"   (the held-out word: {_word(tok, tokens[pos])})")
  return out
