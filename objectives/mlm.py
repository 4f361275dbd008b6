"""Masked language modelling (BERT, RoBERTa, ModernBERT, ALBERT), alone ("mlm") or with a
sentence-pair head: BERT's next-sentence prediction ("mlm_nsp") or ALBERT's
sentence-order prediction ("mlm_sop").

The pair rows come from the data pipeline (`data.packing="pairs"`, `data.pair_task` =
"nsp" | "sop", built by launch/data/pairs.py); a pair label < 0 marks a padding row of a
partial eval batch and is counted nowhere. MLM never masks padding or special tokens.
`objective.max_predictions` sets how many positions the MLM head runs on
(`masking.prediction_budget`: 0 every position, -1 auto = ceil(mask_rate * seq_len)).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np

import encoders
from objectives import losses, masking, spec
from objectives.base import (Objective, model_forward_flops, optional,
                             register_objective, select_heads)

# pair task -> (model head, output field, label key); HF's pretraining classes take the
# label under the same name.
PAIR_TASKS = {"nsp": ("nsp", "nsp_logits", "next_sentence_label"),
              "sop": ("sop", "sop_logits", "sentence_order_label")}
_PAIR_OF = {"mlm": None, "mlm_nsp": "nsp", "mlm_sop": "sop"}


@register_objective(*_PAIR_OF)
class MaskedLM(Objective):
  """Loss and metrics at the masked positions; with a pair task, plus its classifier."""

  def __init__(self, config, tokenizer):
    self.name = config.objective.name
    self.cfg = config.objective
    self.pair = _PAIR_OF[self.name]
    model_cfg = config.model
    # objective.pair_head (optional): the model head that classifies the pairs, when it
    # is not the task's own (ALBERT's "sop" classifier trained on NSP pairs; an ablation
    # runner scoring one pair task's head on the other's pairs).
    self.pair_head = (optional(config, "objective", "pair_head", "") or
                      (PAIR_TASKS[self.pair][0] if self.pair else ""))
    if self.pair and self.pair_head not in PAIR_TASKS:
      raise ValueError(f"objective.pair_head={self.pair_head!r}; expected one of "
                       f"{tuple(PAIR_TASKS)}")
    needed = ("mlm",) + ((self.pair_head,) if self.pair else ())
    unused = tuple(h for h, _, _ in PAIR_TASKS.values() if h not in needed)
    select_heads(model_cfg, needed, unused, self.name)
    packing = optional(config, "data", "packing", "documents")
    pair_task = optional(config, "data", "pair_task", "nsp")
    if self.pair and (packing != "pairs" or pair_task != self.pair):
      raise ValueError(
          f"objective {self.name!r} needs sentence-pair rows labelled for {self.pair!r}: "
          f"set data.packing='pairs' and data.pair_task='{self.pair}' (got packing="
          f"{packing!r}, pair_task={pair_task!r})")
    self.seq_len = int(config.data.seq_len)
    # Training and held-out (objective.eval_mask_rate) masking: {train: (rate, budget)};
    # raises at construction when an explicit cap is too small for a rate.
    self.masks = masking.rates_and_budgets(self.cfg, self.seq_len)
    self.max_predictions = self.masks[True][1]
    self.eval_mask_rate, self.eval_max_predictions = self.masks[False]
    self.model_config = model_cfg
    self.model = encoders.build(model_cfg)
    self.modules = {"encoder": self.model}
    self.trained, self.frozen = ("encoder",), ()
    self.tokenizer = tokenizer
    self.vocab_size = tokenizer.vocab_size
    self.mask_id = tokenizer.mask_id
    self.init_from = config.get("init_from", "") or ""
    self._host_transform = None

  # -------------------------------------------------------------------- init

  def init(self, rng):
    return {"encoder": encoders.init_boxed(self.model, rng, length=self.seq_len)}

  # -------------------------------------------------------------------- the step

  def transform(self, batch, rng, train=True):
    """Dynamic masking of the whole (global) batch, before any micro-batch split; held-out
    batches (`train=False`) at `eval_mask_rate`."""
    c = self.cfg
    rate, m = self.masks[bool(train)]
    m = m or None
    masked = masking.mask_tokens(
        rng, batch["input_ids"], batch["special_tokens_mask"], vocab_size=self.vocab_size,
        mask_id=self.mask_id, mask_rate=rate, mask_token_prob=c.mask_token_prob,
        random_token_prob=c.random_token_prob, word_starts=batch.get("word_starts"),
        whole_word=c.whole_word, max_predictions=m)
    out = dict(batch, input_ids=masked["input_ids"])
    if m:
      out.update(masked_positions=masked["masked_positions"],
                 mlm_labels=masked["masked_labels"], mlm_weights=masked["masked_weights"])
    else:
      out.update(mlm_labels=masked["labels"], mlm_weights=masked["weights"])
    return out

  def _pair_weights(self, batch):
    return (batch[PAIR_TASKS[self.pair][2]] >= 0).astype(jnp.float32)

  def normalizers(self, batch):
    out = {"mlm": jnp.sum(batch["mlm_weights"].astype(jnp.float32))}
    if self.pair:
      out[self.pair] = jnp.sum(self._pair_weights(batch))
    return out

  def _apply(self, params, batch, train, rng=None, masked_positions=None):
    return self.model.apply(
        {"params": params["encoder"]}, batch["input_ids"],
        attention_mask=(batch["segment_ids"] > 0).astype(jnp.int32),
        # Positions come from the segment ids (restarting per packed document, with
        # RoBERTa's offset), so the pipeline's position_ids are not needed here.
        token_type_ids=batch["token_type_ids"], segment_ids=batch["segment_ids"],
        masked_positions=masked_positions, deterministic=not train,
        rngs={"dropout": rng} if rng is not None else None)

  def loss(self, params, batch, rng, train):
    out = self._apply(params, batch, train, rng, batch.get("masked_positions"))
    _, metrics = losses.mlm_loss_and_metrics(out.mlm_logits, batch["mlm_labels"],
                                             batch["mlm_weights"])
    terms = {"mlm": metrics["mlm_loss_sum"]}
    if self.pair:
      label = PAIR_TASKS[self.pair][2]
      field = PAIR_TASKS[self.pair_head][1]
      _, pair_metrics = losses.sequence_classification_loss(
          getattr(out, field), jnp.maximum(batch[label], 0), self._pair_weights(batch),
          prefix=self.pair)
      terms[self.pair] = pair_metrics[f"{self.pair}_loss_sum"]
      metrics = {**metrics, **pair_metrics}
    return terms, metrics

  # -------------------------------------------------------------------- FLOPs

  def module_flops(self, name, seq_len, all_positions=False):
    positions = None if (all_positions or not self.max_predictions) else self.max_predictions
    return model_forward_flops(self.model.config, seq_len, positions)

  # -------------------------------------------------------------------- batches

  def batch_spec(self):
    fields = dict(spec.TEXT_FIELDS)
    if self.cfg.whole_word:
      fields["word_starts"] = spec.WORD_STARTS
    label = PAIR_TASKS[self.pair][2] if self.pair else None
    if label:
      fields[label] = spec.Field((), "int32", f"{self.pair} label; < 0: padding row")
    tok = self.tokenizer

    def synthesize(layout, width, rng):
      out = spec.text_rows(layout, width, tok, rng, pair=bool(self.pair))
      if label:
        out[label] = spec.pair_labels(layout, rng)
      return out

    return spec.BatchSpec(fields, synthesize)

  def check_batch(self, batch):
    self.batch_spec().check(batch)
    encoders.validate_inputs(self.model_config, batch["input_ids"], None,
                             batch["token_type_ids"], batch["segment_ids"])
    if self.pair:
      labels = np.asarray(batch[PAIR_TASKS[self.pair][2]])
      if labels.size and (labels.min() < -1 or labels.max() > 1):
        raise ValueError(f"{PAIR_TASKS[self.pair][2]} holds {sorted(set(labels.tolist()))};"
                         " expected 0, 1 (or -1 for a padding row)")

  def baselines(self, train_batches, eval_items):
    """The most frequent training token, scored at exactly the eval's masked positions
    (the same keys give the same masks); with a pair task, its most frequent label."""
    if self._host_transform is None:
      self._host_transform = jax.jit(functools.partial(self.transform, train=False))
    counts = np.zeros(self.vocab_size, np.int64)
    label = PAIR_TASKS[self.pair][2] if self.pair else None
    label_counts = np.zeros(2, np.int64)
    for b in train_batches:
      ids = np.asarray(b["input_ids"])[~np.asarray(b["special_tokens_mask"], bool)]
      counts += np.bincount(ids, minlength=counts.size)[:counts.size]
      if label:
        lab = np.asarray(b[label])
        label_counts += np.bincount(lab[lab >= 0], minlength=2)[:2]
    top = int(counts.argmax())
    top_label = int(label_counts.argmax())
    hits = total = pair_hits = pair_total = 0
    for b, key in eval_items:
      m = jax.device_get(self._host_transform(b, key))
      w = np.asarray(m["mlm_weights"]) > 0
      hits += int((np.asarray(m["mlm_labels"])[w] == top).sum())
      total += int(w.sum())
      if label:
        lab = np.asarray(b[label])
        pair_hits += int((lab[lab >= 0] == top_label).sum())
        pair_total += int((lab >= 0).sum())
    out = {"mlm_majority_token": top, "mlm_majority_accuracy": hits / max(total, 1),
           "mlm_count": total}
    if hasattr(self.tokenizer, "decode"):
      out["mlm_majority_token_text"] = self.tokenizer.decode([top])
    if label:
      out.update({f"{self.pair}_majority_label": top_label,
                  f"{self.pair}_majority_accuracy": pair_hits / max(pair_total, 1),
                  f"{self.pair}_count": pair_total})
    return out

  # -------------------------------------------------------------------- outside the step

  def forward(self, params, batch):
    return self._apply(params, batch, False)

  def export(self, params, path, tokenizer=None):
    encoders.to_hf(self.model, params["encoder"], path)
    if tokenizer is not None and hasattr(tokenizer, "save"):
      tokenizer.save(path)
    return path

  def describe(self):
    return {"name": self.name, "max_predictions": self.max_predictions,
            "mask_rate": float(self.cfg.mask_rate), "eval_mask_rate": self.eval_mask_rate}

  def reference_inputs(self, batch, train, seed=0):
    b = batch
    x = {"input_ids": b["input_ids"].astype(np.int64),
         "attention_mask": (b["segment_ids"] > 0).astype(np.int64),
         "token_type_ids": b["token_type_ids"].astype(np.int64)}
    if not self.model_config.get("type_vocab_size", 1):
      del x["token_type_ids"]  # a model without token types (DistilBERT) takes none
    if train:
      # A data collator's work (outside the timed step): mask_rate of the tokens masked.
      rng = np.random.RandomState(seed)
      cand = ~np.asarray(b["special_tokens_mask"], bool)
      pick = cand & (rng.rand(*cand.shape) < self.cfg.mask_rate)
      x["labels"] = np.where(pick, b["input_ids"], -100).astype(np.int64)
      x["input_ids"] = np.where(pick, self.mask_id, b["input_ids"]).astype(np.int64)
      if self.pair:
        label = PAIR_TASKS[self.pair][2]
        x[label] = np.maximum(b[label], 0).astype(np.int64)
    return x

  def reference_diff(self, ours, theirs, batch):
    return hidden_state_diff(ours, theirs, batch)


def hidden_state_diff(ours, theirs, batch) -> float:
  """Max |ours - transformers'| of the last hidden state over real (non-pad) tokens: the
  bench's check that both sides computed the same forward."""
  mine = np.asarray(jax.device_get(ours.last_hidden_state), np.float32)
  ref = np.asarray(theirs.hidden_states[-1].float().numpy())
  real = np.asarray(batch["segment_ids"]) > 0
  return float(np.abs(mine[real] - ref[real]).max())
