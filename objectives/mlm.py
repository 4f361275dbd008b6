"""Masked language modelling (BERT, RoBERTa, ModernBERT), optionally with BERT's
next-sentence prediction."""
import jax
import jax.numpy as jnp

import encoders
from launch import flops
from objectives import losses, masking
from objectives.base import Objective, register_objective


@register_objective("mlm", "mlm_nsp")
class MaskedLM(Objective):
  """Loss and metrics only at masked positions; with NSP, plus the pair classifier."""

  def __init__(self, config, tokenizer):
    self.cfg = config.objective
    self.nsp = config.objective.name == "mlm_nsp"
    model_cfg = config.model
    if "mlm" not in model_cfg.heads or (self.nsp and "nsp" not in model_cfg.heads):
      raise ValueError(f"objective {config.objective.name!r} needs model heads "
                       f"{('mlm', 'nsp') if self.nsp else ('mlm',)}, got {model_cfg.heads}")
    self.model = encoders.build(model_cfg)
    self.modules = {"encoder": self.model}
    self.vocab_size = tokenizer.vocab_size
    self.mask_id = tokenizer.mask_id
    self.seq_len = config.data.seq_len

  def init(self, rng):
    ids = jnp.zeros((1, self.seq_len), jnp.int32)
    return {"encoder": self.model.init(rng, ids)["params"]}

  def transform(self, batch, rng):
    """Dynamic masking of the whole (global) batch, before any micro-batch split."""
    c = self.cfg
    masked = masking.mask_tokens(
        rng, batch["input_ids"], batch["special_tokens_mask"], vocab_size=self.vocab_size,
        mask_id=self.mask_id, mask_rate=c.mask_rate, mask_token_prob=c.mask_token_prob,
        random_token_prob=c.random_token_prob, word_starts=batch.get("word_starts"),
        whole_word=c.whole_word, max_predictions=c.max_predictions or None)
    out = dict(batch, input_ids=masked["input_ids"])
    if c.max_predictions:
      out.update(masked_positions=masked["masked_positions"],
                 mlm_labels=masked["masked_labels"], mlm_weights=masked["masked_weights"])
    else:
      out.update(mlm_labels=masked["labels"], mlm_weights=masked["weights"])
    return out

  def loss(self, params, batch, rng, train):
    out = self.model.apply(
        {"params": params["encoder"]}, batch["input_ids"],
        attention_mask=(batch["segment_ids"] > 0).astype(jnp.int32),
        # Positions come from the segment ids (restarting per packed document, with
        # RoBERTa's offset), so the pipeline's position_ids are not needed here.
        token_type_ids=batch["token_type_ids"], segment_ids=batch["segment_ids"],
        masked_positions=batch.get("masked_positions"), deterministic=not train,
        rngs={"dropout": rng})
    loss, metrics = losses.mlm_loss_and_metrics(out.mlm_logits, batch["mlm_labels"],
                                                batch["mlm_weights"])
    if self.nsp:
      nsp_loss, nsp_metrics = losses.nsp_loss_and_metrics(out.nsp_logits,
                                                          batch["next_sentence_label"])
      loss = loss + nsp_loss
      metrics = {**metrics, **nsp_metrics}
    return loss, metrics

  def forward_flops(self, seq_len):
    positions = self.cfg.max_predictions or None
    return flops.encoder_forward_flops(self.model.config, seq_len, positions)

  def export(self, params, path):
    return encoders.to_hf(self.model, params["encoder"], path)
