"""ELECTRA's MLM-on-replaced-tokens ablations (Clark et al. 2020, Section 3.2, Table 5):
the generator and the sampling of objectives/rtd.py, but the second network is trained
with a masked-LM loss on the corrupted input instead of replaced-token detection.

  objective.name = "replaced_mlm"
  objective.mlm_targets = "masked"  "Replace MLM": predict the original token at the masked
                                    positions, which hold generator samples, not [MASK];
                        = "all"     "All-Tokens MLM": predict the original token at every
                                    real (non-pad) position;
  objective.copy_gate = True        (with "all") the paper's copy mechanism: a sigmoid
                                    gate D per token (the family's "rtd" head) mixes the
                                    input token and the MLM softmax:
                                    p(x) = D * [x == input] + (1 - D) * softmax(x).

The loss is generator MLM + disc_weight x the second network's MLM, each a mean over its
own global count (the ablation configs use disc_weight 1: both terms are cross-entropies
of one scale; the paper does not give the weight). Model heads: ("mlm",), plus "rtd" for
the copy gate. Metrics: the generator's `mlm_*`; the second network's `dmlm_loss`,
`dmlm_accuracy`, `dmlm_replaced_accuracy` (on the tokens the generator changed) and
`dmlm_copy_baseline_accuracy` (what copying the input scores on the same tokens).
Sharing (none, tied, gdes), sampling and FLOPs accounting are the rtd objective's.
Export: the second network as its family's MLM class (ElectraForMaskedLM), the copy gate
in copy_gate.safetensors, the generator in `path`/generator.
"""
import os

import jax
import jax.numpy as jnp
import ml_collections

import encoders
from objectives import losses, rtd
from objectives.base import model_forward_flops, register_objective, select_heads

MLM_TARGETS = ("masked", "all")


def copy_mixture(logp, gate_logits, input_ids):
  """log p of the copy mechanism: D = sigmoid(gate) on the input token, (1 - D) x the MLM
  softmax everywhere. logp (B,T,V) log-softmax, gate_logits (B,T), input_ids (B,T)."""
  gate = gate_logits.astype(jnp.float32)
  mix = jax.nn.log_sigmoid(-gate)[..., None] + logp
  on_input = jax.nn.one_hot(input_ids, logp.shape[-1], dtype=jnp.bool_)
  return jnp.where(on_input, jnp.logaddexp(mix, jax.nn.log_sigmoid(gate)[..., None]), mix)


def nll_and_metrics(logp, labels, weights, replaced, inputs, prefix="dmlm"):
  """Negative log-likelihood sums of `labels` under log-probabilities `logp` (B,T,V) over
  the positions with weight > 0, and accuracy sums overall, on the `replaced` positions
  and for the copy-the-input predictor (`inputs` (B,T))."""
  counted = weights > 0
  w = jnp.where(counted, weights, 0.0).astype(jnp.float32)
  safe = jnp.where(counted, labels, 0)
  lp = jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
  correct = losses.argmax_equals(logp, safe) & counted
  rep = replaced & counted
  f = lambda x: jnp.sum(x.astype(jnp.float32))
  loss_sum = jnp.sum(jnp.where(counted, -lp * w, 0.0))
  return loss_sum, {
      f"{prefix}_loss_sum": loss_sum, f"{prefix}_weight_sum": f(counted),
      f"{prefix}_correct_sum": f(correct),
      f"{prefix}_copy_baseline_accuracy_sum": f(counted & (inputs == safe)),
      f"{prefix}_replaced_weight_sum": f(rep), f"{prefix}_replaced_correct_sum": f(correct & rep)}


@register_objective("replaced_mlm")
class ReplacedMlm(rtd.ReplacedTokenDetection):
  """Generator MLM + disc_weight x MLM of the second network on the corrupted input."""

  @classmethod
  def check_config(cls, config):
    """rtd's settings, and mlm_targets / copy_gate / rtd_positions (one-line errors, at
    start-up before any data work, and again when the objective is built)."""
    super().check_config(config)
    c = config.objective
    targets = str(c.get("mlm_targets", "masked"))
    if targets not in MLM_TARGETS:
      raise ValueError(f"objective.mlm_targets={targets!r}; choose from {MLM_TARGETS}")
    if bool(c.get("copy_gate", False)) and targets != "all":
      raise ValueError("objective.copy_gate needs objective.mlm_targets='all' (the copy "
                       "mechanism of All-Tokens MLM)")
    if str(c.get("rtd_positions", "all")) != "all":
      raise ValueError("objective.rtd_positions is an rtd setting; replaced_mlm chooses "
                       "its positions with objective.mlm_targets")

  def __init__(self, config, tokenizer):
    type(self).check_config(config)
    c = config.objective
    self.targets = str(c.get("mlm_targets", "masked"))
    self.copy_gate = bool(c.get("copy_gate", False))
    super().__init__(config, tokenizer)
    self.name = "replaced_mlm"
    self.term_weights = {"mlm": 1.0, "dmlm": self.disc_weight}

  def _check_heads(self, model_config):
    needed = ("mlm", "rtd") if self.copy_gate else ("mlm",)
    unused = ("nsp", "sop") + (() if self.copy_gate else ("rtd",))
    select_heads(model_config, needed, unused, "replaced_mlm")

  # -------------------------------------------------------------------- the step

  def normalizers(self, batch):
    n = (batch["mlm_weights"] if self.targets == "masked" else batch["segment_ids"] > 0)
    return {"mlm": jnp.sum(batch["mlm_weights"].astype(jnp.float32)),
            "dmlm": jnp.sum(n.astype(jnp.float32))}

  def loss(self, params, batch, rng, train):
    gen_p, disc_p = self.model_params(params)
    k_gen, k_sample, k_disc = jax.random.split(rng, 3)
    positions = batch.get("masked_positions")
    g = self._apply(self.generator, gen_p, batch["input_ids"], batch, train, k_gen, positions)
    _, metrics = losses.mlm_loss_and_metrics(g.mlm_logits, batch["mlm_labels"],
                                             batch["mlm_weights"])
    corrupted = self.corrupt(k_sample, g.mlm_logits, batch)
    replaced = corrupted != batch["original_ids"]
    if self.targets == "masked":
      d = self._apply(self.discriminator, disc_p, corrupted, batch, train, k_disc, positions)
      labels, weights = batch["mlm_labels"], batch["mlm_weights"]
      inputs = corrupted
      if positions is not None:
        pos = positions.astype(jnp.int32)
        replaced = jnp.take_along_axis(replaced, pos, axis=1)
        inputs = jnp.take_along_axis(corrupted, pos, axis=1)
      logp = jax.nn.log_softmax(d.mlm_logits.astype(jnp.float32), axis=-1)
    else:
      d = self._apply(self.discriminator, disc_p, corrupted, batch, train, k_disc)
      labels, weights = batch["original_ids"], (batch["segment_ids"] > 0).astype(jnp.float32)
      inputs = corrupted
      logp = jax.nn.log_softmax(d.mlm_logits.astype(jnp.float32), axis=-1)
      if self.copy_gate:
        logp = copy_mixture(logp, d.rtd_logits, corrupted)
    term, dmetrics = nll_and_metrics(logp, labels, weights, replaced, inputs)
    return {"mlm": metrics["mlm_loss_sum"], "dmlm": term}, {**metrics, **dmetrics}

  # -------------------------------------------------------------------- FLOPs

  def module_flops(self, name, seq_len, all_positions=False):
    if name == "generator":
      return super().module_flops(name, seq_len, all_positions)
    body = ml_collections.ConfigDict(self.model_config.to_dict())
    body.heads = ("mlm",)
    gathered = self.targets == "masked" and self.max_predictions and not all_positions
    f = model_forward_flops(body, seq_len, self.max_predictions if gathered else None)
    if self.copy_gate:
      d = body.hidden_size
      f += float(2 * seq_len * d * d + 2 * seq_len * d)
    return f

  # -------------------------------------------------------------------- outside the step

  def export(self, params, path, tokenizer=None):
    """The second network as its family's MLM class to `path` (copy gate in
    copy_gate.safetensors), the generator to `path`/generator."""
    gen_p, disc_p = self.model_params(params)
    body = ml_collections.ConfigDict(self.model_config.to_dict())
    body.heads = ("mlm",)
    encoders.to_hf(encoders.build(body), {k: v for k, v in disc_p.items() if k != "rtd"},
                   path)
    if self.copy_gate:
      rtd.save_head(disc_p["rtd"], os.path.join(path, "copy_gate.safetensors"))
    encoders.to_hf(self.generator, gen_p, os.path.join(path, "generator"))
    if tokenizer is not None and hasattr(tokenizer, "save"):
      tokenizer.save(path)
      tokenizer.save(os.path.join(path, "generator"))
    return path

  def reference_model(self, path):
    raise ValueError("--compare-hf has a transformers reference for objective 'rtd' only, "
                     "not for the replaced_mlm ablations")

  def describe(self):
    return {**super().describe(), "name": self.name, "mlm_targets": self.targets,
            "copy_gate": self.copy_gate}
