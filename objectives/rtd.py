"""Replaced-token detection (ELECTRA, Clark et al. 2020) on any registered family, with
DeBERTaV3's gradient-disentangled embedding sharing (GDES, He et al. 2021).

Two trained collections: "generator" (a smaller encoder of the discriminator's family,
`generator_config`, with the "mlm" head) and "discriminator" (the model section, with an
"rtd" head; a family that declares none gets `heads.RtdHead` added, so nothing here is
specific to one family). One step, all inside the jitted train step:

  mask (objective.mask_rate, on the whole global batch) -> generator MLM on the masked
  positions -> replacements sampled from softmax(generator logits / temperature), with no
  gradient through the sampling -> the discriminator reads the corrupted ids and scores
  every real (non-pad) token: label 1 where the token differs from the original (a
  sample equal to the original counts as "original") -> loss = MLM + disc_weight * BCE,
  each normalised by its global count (masked positions; real tokens).

Embedding sharing (`objective.sharing`) covers the embedding tables, i.e. every
`embeddings/*_embeddings/embedding` leaf both models have (word, position, token type):
  none   each model has its own;
  tied   the discriminator has none of its own: it reads the generator's, and both
         losses update them (ELECTRA);
  gdes   the discriminator reads stop_gradient(generator's) + its own delta table,
         initialised at zero: only the generator's MLM loss moves the shared tables, only
         the discriminator's loss moves the delta (DeBERTaV3). Export folds the delta in.
Sharing needs tables of equal shape: a family without `embedding_size` (BERT) shares only
with a generator of the discriminator's width (objective.generator_width=1; DeBERTaV3's
generator is full width and half depth).

Metrics (sums; held-out means after `losses.finalize_metrics`):
  mlm_accuracy                 the generator on the masked positions;
  rtd_accuracy, rtd_loss       the discriminator over its counted (real) tokens;
  rtd_replaced_accuracy        = recall: the share of replaced tokens flagged;
  rtd_flagged_accuracy         = precision: the share of flagged tokens truly replaced;
  rtd_original_accuracy        the share of original tokens left unflagged;
  rtd_fraction_replaced / _flagged;
  rtd_all_original_accuracy    the trivial baseline that never flags (its precision and
                               recall are 0), on exactly the same tokens.
`held_out_auc` scores the discriminator's ROC AUC on eval batches outside the step.
"""
import dataclasses
import functools
import json
import os
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import traverse_util
from safetensors.numpy import save_file

import encoders
from encoders import heads as heads_lib
from encoders import hf as hf_lib
from encoders import layers
from objectives import losses, masking, spec
from objectives import mlm as mlm_lib
from objectives.base import (Objective, model_forward_flops, register_objective,
                             select_heads)

SHARING = ("none", "tied", "gdes")
RTD_POSITIONS = ("all", "masked")  # "masked": ELECTRA 15% (the disc loss on masked only)


# ---------------------------------------------------------------------------- models

def generator_config(disc_cfg, obj_cfg) -> ml_collections.ConfigDict:
  """The generator's model section: the discriminator's, with hidden size, intermediate
  size and attention heads scaled by `generator_width` and the layer count by
  `generator_depth` (Clark et al. 2020, Table 6: 1/4 for Small and Large, 1/3 for Base),
  and the "mlm" head only (key/value heads, where the family groups them, scale alike).
  The embedding width (`embedding_size`, where the family has
  one) is kept, so the tables can be shared."""
  width = float(obj_cfg.get("generator_width", 0.25))
  depth = float(obj_cfg.get("generator_depth", 1.0))
  for name, v in (("generator_width", width), ("generator_depth", depth)):
    if not 0 < v <= 1:
      raise ValueError(f"objective.{name}={v} must be in (0, 1]")
  g = ml_collections.ConfigDict(disc_cfg.to_dict() if hasattr(disc_cfg, "to_dict")
                                else dict(disc_cfg))
  n_heads = max(1, round(g.num_attention_heads * width))
  hidden = round(g.hidden_size * width)
  if hidden % n_heads:
    raise ValueError(f"generator_width={width}: hidden size {hidden} does not split into "
                     f"{n_heads} attention heads; choose another width")
  kv = int(g.get("num_key_value_heads", 0) or 0)  # 0: as many K/V heads as heads
  if kv:
    # grouped-query attention keeps its ratio of query heads to K/V heads
    kv = max(1, round(kv * width))
    if n_heads % kv:
      raise ValueError(f"generator_width={width}: {n_heads} attention heads do not group "
                       f"into {kv} key/value heads; choose another width")
    g.num_key_value_heads = kv
  g.hidden_size = hidden
  g.num_attention_heads = n_heads
  g.intermediate_size = max(1, round(g.intermediate_size * width))
  g.num_hidden_layers = max(1, round(g.num_hidden_layers * depth))
  g.heads = ("mlm",)
  if g.get("variant"):
    g.variant = f"{g.variant}-generator"
  return g


def with_rtd_head(model):
  """`model` (an unbound family encoder) with an "rtd" head: its family's own if it
  declares one, else `heads.RtdHead` on the last hidden state (params under "rtd")."""
  cls = type(model)

  class WithRtd(cls):
    def parts(self):
      p = super().parts()
      if "rtd" in p.heads:
        return p
      c = self.config
      act = c.get("hidden_act", "gelu")
      try:
        layers.activation(act)
      except ValueError:  # e.g. a gated MLP's name: the head uses plain GELU
        act = "gelu"
      head = functools.partial(heads_lib.RtdHead, c.hidden_size, act, c.initializer_range,
                               layers.dtype_from_name(c.dtype))
      return dataclasses.replace(p, heads={**p.heads, "rtd": head})

  WithRtd.__name__ = WithRtd.__qualname__ = cls.__name__
  return WithRtd(config=model.config)


def family_exports_rtd(family: str) -> bool:
  """Whether the family's HF mapping has a class with the "rtd" head (ELECTRA's
  ElectraForPreTraining); otherwise the discriminator exports as the family's base model
  plus `rtd_head.safetensors`."""
  try:
    mapping = hf_lib.mapping_for(family)  # the lookup encoders.to_hf does
  except ValueError:  # a family without an HF mapping
    return False
  return any("rtd" in h for _, h in mapping.architectures.values())


def save_head(head_params, path: str) -> None:
  """A head's params as one safetensors file (float32, keys joined by '/'): the heads a
  family's HF classes have no place for (the RTD head, the copy gate)."""
  save_file({k: np.asarray(jax.device_get(v), np.float32)
             for k, v in traverse_util.flatten_dict(head_params, sep="/").items()}, path)


def shared_paths(gen_shapes, disc_shapes):
  """The embedding tables both models have: paths embeddings/<x>_embeddings/embedding."""
  g, d = traverse_util.flatten_dict(gen_shapes), traverse_util.flatten_dict(disc_shapes)
  paths = sorted(p for p in d if len(p) == 3 and p[0] == "embeddings"
                 and p[1].endswith("_embeddings") and p[2] == "embedding")
  missing = [p for p in paths if p not in g]
  mismatched = [(p, _shape(g[p]), _shape(d[p])) for p in paths if p in g
                and _shape(g[p]) != _shape(d[p])]
  if mismatched or missing or not paths:
    raise ValueError(
        "embedding sharing needs the same tables in the generator and the discriminator; "
        + (f"shapes differ: {['/'.join(p) + f' {a} vs {b}' for p, a, b in mismatched]}"
           if mismatched else "")
        + (f"missing in the generator: {['/'.join(p) for p in missing]}" if missing else "")
        + ("the discriminator has no embedding tables" if not paths else "")
        + ". Use objective.generator_width=1 for a family whose embedding width is its "
          "hidden size, or objective.sharing='none'")
  return paths


def _shape(x):
  return tuple(nn.unbox(x).shape) if isinstance(x, nn.meta.AxisMetadata) else tuple(x.shape)


# ---------------------------------------------------------------------------- objective

@register_objective("rtd")
class ReplacedTokenDetection(Objective):
  """Generator MLM + disc_weight x discriminator BCE (module docstring)."""

  @classmethod
  def check_config(cls, config):
    """The masking settings, and this objective's enums and numbers (one-line errors)."""
    super().check_config(config)
    c = config.objective
    if str(c.get("sharing", "tied")) not in SHARING:
      raise ValueError(f"objective.sharing={c.get('sharing')!r}; choose from {SHARING}")
    if str(c.get("rtd_positions", "all")) not in RTD_POSITIONS:
      raise ValueError(f"objective.rtd_positions={c.get('rtd_positions')!r}; choose from "
                       f"{RTD_POSITIONS}")
    for key, default in (("temperature", 1.0), ("disc_weight", 50.0)):
      v = c.get(key, default)
      if not isinstance(v, (int, float)) or not v > 0:
        raise ValueError(f"objective.{key}={v!r} must be > 0")
    generator_config(config.model, c)  # generator_width / generator_depth

  def __init__(self, config, tokenizer):
    self.name = "rtd"
    c = self.cfg = config.objective
    if config.get("init_from", ""):
      raise ValueError("init_from is not supported by the rtd objective (it trains a "
                       "generator and a discriminator from scratch)")
    self.sharing = str(c.get("sharing", "tied"))
    if self.sharing not in SHARING:
      raise ValueError(f"objective.sharing={self.sharing!r}; choose from {SHARING}")
    self.rtd_positions = str(c.get("rtd_positions", "all"))
    if self.rtd_positions not in RTD_POSITIONS:
      raise ValueError(f"objective.rtd_positions={self.rtd_positions!r}; choose from "
                       f"{RTD_POSITIONS}")
    self.temperature = float(c.get("temperature", 1.0))
    if not self.temperature > 0:
      raise ValueError(f"objective.temperature={self.temperature} must be > 0")
    self.disc_weight = float(c.get("disc_weight", 50.0))
    if not self.disc_weight > 0:
      raise ValueError(f"objective.disc_weight={self.disc_weight} must be > 0")
    self._check_heads(config.model)
    self.model_config = config.model
    self.generator_config = generator_config(config.model, c)
    self.seq_len = int(config.data.seq_len)
    self.masks = masking.rates_and_budgets(c, self.seq_len)  # {train: (rate, budget)}
    self.max_predictions = self.masks[True][1]
    self.eval_mask_rate, self.eval_max_predictions = self.masks[False]
    self.generator = encoders.build(self.generator_config)
    self.discriminator = with_rtd_head(encoders.build(config.model))
    self.modules = {"generator": self.generator, "discriminator": self.discriminator}
    self.trained, self.frozen = ("generator", "discriminator"), ()
    self.forward_modules = ("discriminator",)  # inference scores with the discriminator
    self.term_weights = {"mlm": 1.0, "rtd": self.disc_weight}
    self.tokenizer = tokenizer
    self.vocab_size = tokenizer.vocab_size
    self.mask_id = tokenizer.mask_id
    self.init_from = ""
    self._host_transform = None
    self.shared = ()
    if self.sharing != "none":
      shapes = jax.eval_shape(self._init_both, jax.random.PRNGKey(0))
      self.shared = shared_paths(*shapes)

  def _check_heads(self, model_config):
    select_heads(model_config, ("rtd",), ("mlm", "nsp", "sop"), "rtd")

  # -------------------------------------------------------------------- params

  def _init_both(self, rng):
    kg, kd = jax.random.split(rng)
    return (encoders.init_boxed(self.generator, kg, length=self.seq_len),
            encoders.init_boxed(self.discriminator, kd, length=self.seq_len))

  def init(self, rng):
    """Boxed params; with sharing, the discriminator's shared tables are absent (tied) or
    zero deltas (gdes)."""
    gen, disc = self._init_both(rng)
    flat = traverse_util.flatten_dict(disc)
    for p in self.shared:
      if self.sharing == "tied":
        del flat[p]
      else:
        leaf = flat[p]
        flat[p] = (leaf.replace_boxed(jnp.zeros_like(leaf.unbox()))
                   if isinstance(leaf, nn.meta.AxisMetadata) else jnp.zeros_like(leaf))
    return {"generator": gen, "discriminator": traverse_util.unflatten_dict(flat)}

  def after_init(self, params, shardings):
    return params

  def model_params(self, params):
    """(generator params, full discriminator params): the shared tables put in place
    (gdes: stop_gradient(generator's) + delta)."""
    gen = params["generator"]
    if self.sharing == "none":
      return gen, params["discriminator"]
    g, flat = traverse_util.flatten_dict(gen), traverse_util.flatten_dict(params["discriminator"])
    for p in self.shared:
      if self.sharing == "tied":
        flat[p] = g[p]
      else:
        flat[p] = jax.lax.stop_gradient(g[p]) + flat[p]
    return gen, traverse_util.unflatten_dict(flat)

  # -------------------------------------------------------------------- the step

  def transform(self, batch, rng, train=True):
    """Masking of the whole (global) batch; the original ids are kept for the labels.
    Held-out batches (`train=False`) are masked at `eval_mask_rate`."""
    c = self.cfg
    rate, m = self.masks[bool(train)]
    m = m or None
    masked = masking.mask_tokens(
        rng, batch["input_ids"], batch["special_tokens_mask"], vocab_size=self.vocab_size,
        mask_id=self.mask_id, mask_rate=rate, mask_token_prob=c.mask_token_prob,
        random_token_prob=c.random_token_prob, word_starts=batch.get("word_starts"),
        whole_word=c.whole_word, max_predictions=m)
    out = dict(batch, input_ids=masked["input_ids"], original_ids=batch["input_ids"],
               masked_dense=masked["weights"])
    if m:
      out.update(masked_positions=masked["masked_positions"],
                 mlm_labels=masked["masked_labels"], mlm_weights=masked["masked_weights"])
    else:
      out.update(mlm_labels=masked["labels"], mlm_weights=masked["weights"])
    return out

  def _rtd_weights(self, batch):
    if self.rtd_positions == "masked":
      return batch["masked_dense"].astype(jnp.float32)
    return (batch["segment_ids"] > 0).astype(jnp.float32)

  def normalizers(self, batch):
    return {"mlm": jnp.sum(batch["mlm_weights"].astype(jnp.float32)),
            "rtd": jnp.sum(self._rtd_weights(batch))}

  def _apply(self, module, params, ids, batch, train, rng, masked_positions=None):
    return module.apply(
        {"params": params}, ids, attention_mask=(batch["segment_ids"] > 0).astype(jnp.int32),
        token_type_ids=batch["token_type_ids"], segment_ids=batch["segment_ids"],
        masked_positions=masked_positions, deterministic=not train,
        rngs={"dropout": rng} if train else None)

  def corrupt(self, rng, mlm_logits, batch):
    """The discriminator's input: the original ids with every masked position replaced by
    a sample from softmax(generator logits / temperature) (no gradient)."""
    original = batch["original_ids"]
    logits = jax.lax.stop_gradient(mlm_logits).astype(jnp.float32) / self.temperature
    sampled = jax.random.categorical(rng, logits, axis=-1).astype(original.dtype)
    chosen = batch["mlm_weights"] > 0
    if "masked_positions" not in batch:
      return jnp.where(chosen, sampled, original)
    pos = batch["masked_positions"].astype(jnp.int32)
    # Back from the gathered (B,M) entries to (B,T) positions by a (B,M,T) comparison
    # that XLA fuses into one reduction; padding entries (position 0, weight 0) match
    # nothing. Not a scatter: on TPU v5p XLA offloads a large one to the SparseCore,
    # which its cost model cannot price (ELECTRA-base's step at global batch 256 had no
    # step-time estimate).
    at = (pos[:, :, None] == jnp.arange(original.shape[1], dtype=jnp.int32)) & chosen[
        :, :, None]
    hit = jnp.any(at, axis=1)
    new = jnp.sum(jnp.where(at, sampled[:, :, None], 0), axis=1, dtype=original.dtype)
    return jnp.where(hit, new, original)

  def loss(self, params, batch, rng, train):
    gen_p, disc_p = self.model_params(params)
    k_gen, k_sample, k_disc = jax.random.split(rng, 3)
    g = self._apply(self.generator, gen_p, batch["input_ids"], batch, train, k_gen,
                    batch.get("masked_positions"))
    _, metrics = losses.mlm_loss_and_metrics(g.mlm_logits, batch["mlm_labels"],
                                             batch["mlm_weights"])
    corrupted = self.corrupt(k_sample, g.mlm_logits, batch)
    d = self._apply(self.discriminator, disc_p, corrupted, batch, train, k_disc)
    rtd_terms, rtd_metrics = rtd_loss_and_metrics(
        d.rtd_logits, corrupted != batch["original_ids"], self._rtd_weights(batch))
    return ({"mlm": metrics["mlm_loss_sum"], "rtd": rtd_terms},
            {**metrics, **rtd_metrics})

  # -------------------------------------------------------------------- FLOPs

  def module_flops(self, name, seq_len, all_positions=False):
    if name == "generator":
      positions = None if (all_positions or not self.max_predictions) else self.max_predictions
      return model_forward_flops(self.generator_config, seq_len, positions)
    body = ml_collections.ConfigDict(self.model_config.to_dict())
    body.heads = ()
    d = body.hidden_size
    return model_forward_flops(body, seq_len) + float(2 * seq_len * d * d + 2 * seq_len * d)

  # -------------------------------------------------------------------- batches

  def batch_spec(self):
    fields = dict(spec.TEXT_FIELDS)
    if self.cfg.whole_word:
      fields["word_starts"] = spec.WORD_STARTS
    tok = self.tokenizer
    return spec.BatchSpec(fields, lambda layout, width, rng: spec.text_rows(
        layout, width, tok, rng))

  def check_batch(self, batch):
    self.batch_spec().check(batch)
    encoders.validate_inputs(self.model_config, batch["input_ids"], None,
                             batch["token_type_ids"], batch["segment_ids"])

  def baselines(self, train_batches, eval_items):
    """The generator's: the most frequent training token at the eval's masked positions.
    The discriminator's trivial baseline (never flag: precision 0, recall 0) is scored in
    the eval itself as rtd_all_original_accuracy, since the replaced tokens depend on the
    generator at that step."""
    if self._host_transform is None:
      self._host_transform = jax.jit(functools.partial(self.transform, train=False))
    counts = np.zeros(self.vocab_size, np.int64)
    for b in train_batches:
      ids = np.asarray(b["input_ids"])[~np.asarray(b["special_tokens_mask"], bool)]
      counts += np.bincount(ids, minlength=counts.size)[:counts.size]
    top = int(counts.argmax())
    hits = total = 0
    for b, key in eval_items:
      m = jax.device_get(self._host_transform(b, key))
      w = np.asarray(m["mlm_weights"]) > 0
      hits += int((np.asarray(m["mlm_labels"])[w] == top).sum())
      total += int(w.sum())
    return {"mlm_majority_token": top, "mlm_majority_accuracy": hits / max(total, 1),
            "mlm_count": total, "rtd_all_original": "never flags: precision 0, recall 0, "
            "accuracy = eval rtd_all_original_accuracy"}

  # -------------------------------------------------------------------- outside the step

  def forward(self, params, batch):
    """The discriminator on the batch as given (every real token scored)."""
    _, disc_p = self.model_params(params)
    return self._apply(self.discriminator, disc_p, batch["input_ids"], batch, False, None)

  def export(self, params, path, tokenizer=None):
    """The discriminator to `path` (ELECTRA: ElectraForPreTraining; another family: its
    base model, plus the RTD head in rtd_head.safetensors), the generator (its family's
    MLM class, ElectraForMaskedLM for ELECTRA) to `path`/generator."""
    gen_p, disc_p = self.model_params(params)
    family = self.model_config.get("family", "bert")
    if family_exports_rtd(family):
      encoders.to_hf(self.discriminator, disc_p, path)
    else:
      body = ml_collections.ConfigDict(self.model_config.to_dict())
      body.heads = ()
      rest = {k: v for k, v in disc_p.items() if k != "rtd"}
      encoders.to_hf(encoders.build(body), rest, path)
      save_head(disc_p["rtd"], os.path.join(path, "rtd_head.safetensors"))
    encoders.to_hf(self.generator, gen_p, os.path.join(path, "generator"))
    if tokenizer is not None and hasattr(tokenizer, "save"):
      tokenizer.save(path)
      tokenizer.save(os.path.join(path, "generator"))
    return path

  def reference_inputs(self, batch, train, seed=0):
    """transformers' inputs of the same batch; with `train`, masked as a data collator
    would (outside the timed step): `labels` for the generator, `original_ids` for the
    discriminator's labels (see `reference_model`)."""
    real = np.asarray(batch["segment_ids"]) > 0
    x = {"input_ids": np.asarray(batch["input_ids"]).astype(np.int64),
         "attention_mask": real.astype(np.int64),
         "token_type_ids": np.asarray(batch["token_type_ids"]).astype(np.int64)}
    if train:
      rng = np.random.RandomState(seed)
      cand = ~np.asarray(batch["special_tokens_mask"], bool)
      pick = cand & (rng.rand(*cand.shape) < float(self.cfg.mask_rate))
      x["original_ids"] = x["input_ids"]
      x["labels"] = np.where(pick, x["input_ids"], -100).astype(np.int64)
      x["input_ids"] = np.where(pick, self.mask_id, x["input_ids"]).astype(np.int64)
    return x

  def reference_diff(self, ours, theirs, batch):
    return mlm_lib.hidden_state_diff(ours, theirs, batch)

  def reference_model(self, path):
    """transformers doing this objective's work, from an `export` directory: the
    generator's MLM loss, a sample from its softmax (no gradient), the discriminator's
    BCE over real tokens x disc_weight, with the embeddings shared as configured (tied:
    the same modules; gdes and none: separate tables, the closest transformers has).
    Called without labels it is the discriminator's forward."""
    return _torch_rtd(self, path)

  def describe(self):
    g = self.generator_config
    return {"name": self.name, "sharing": self.sharing, "disc_weight": self.disc_weight,
            "temperature": self.temperature, "rtd_positions": self.rtd_positions,
            "max_predictions": self.max_predictions, "mask_rate": float(self.cfg.mask_rate),
            "eval_mask_rate": self.eval_mask_rate,
            "generator": {"hidden_size": g.hidden_size, "num_hidden_layers": g.num_hidden_layers,
                          "num_attention_heads": g.num_attention_heads,
                          "intermediate_size": g.intermediate_size},
            "shared": ["/".join(p) for p in self.shared]}


def rtd_loss_and_metrics(logits, replaced, weights):
  """Binary cross-entropy of (B,T) logits against `replaced` (B,T) bool over the tokens
  with weight > 0. -> (loss sum, metric sums; see the module docstring)."""
  logits = logits.astype(jnp.float32)
  counted = weights > 0
  w = jnp.where(counted, weights, 0.0)
  label = replaced & counted
  bce = optax.sigmoid_binary_cross_entropy(logits, label.astype(jnp.float32))
  loss_sum = jnp.sum(jnp.where(counted, bce * w, 0.0))
  flagged = (logits > 0) & counted
  f = lambda x: jnp.sum(x.astype(jnp.float32))
  tp = f(flagged & label)
  metrics = {
      "rtd_loss_sum": loss_sum, "rtd_weight_sum": f(counted),
      "rtd_correct_sum": f((flagged == label) & counted),
      "rtd_fraction_replaced_sum": f(label), "rtd_fraction_flagged_sum": f(flagged),
      "rtd_all_original_accuracy_sum": f(counted & ~label),
      "rtd_replaced_weight_sum": f(label), "rtd_replaced_correct_sum": tp,
      "rtd_flagged_weight_sum": f(flagged), "rtd_flagged_correct_sum": tp,
      "rtd_original_weight_sum": f(counted & ~label),
      "rtd_original_correct_sum": f(counted & ~label & ~flagged),
  }
  return loss_sum, metrics


def roc_auc(scores, labels) -> float:
  """ROC AUC of `scores` for binary `labels` (ties counted half); nan without both
  classes."""
  scores, labels = np.asarray(scores, np.float64), np.asarray(labels, bool)
  n_pos, n_neg = int(labels.sum()), int((~labels).sum())
  if not n_pos or not n_neg:
    return float("nan")
  order = np.argsort(scores, kind="mergesort")
  ranks = np.empty(len(scores), np.float64)
  s = scores[order]
  # average ranks over ties
  _, first, counts = np.unique(s, return_index=True, return_counts=True)
  avg = first + (counts - 1) / 2.0 + 1
  ranks[order] = np.repeat(avg, counts)
  return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def held_out_auc(objective, params, eval_items) -> dict:
  """The discriminator's ROC AUC on the real tokens of `eval_items` ((batch, key) pairs,
  transformed and corrupted exactly as the eval step does)."""
  @jax.jit
  def scores(params, batch, key):
    batch = objective.transform(batch, key, train=False)
    gen_p, disc_p = objective.model_params(params)
    _, k_sample, _ = jax.random.split(key, 3)
    g = objective._apply(objective.generator, gen_p, batch["input_ids"], batch, False, None,
                         batch.get("masked_positions"))
    corrupted = objective.corrupt(k_sample, g.mlm_logits, batch)
    d = objective._apply(objective.discriminator, disc_p, corrupted, batch, False, None)
    return d.rtd_logits, corrupted != batch["original_ids"], objective._rtd_weights(batch)
  all_s, all_l = [], []
  for b, key in eval_items:
    s, lab, w = jax.device_get(scores(params, b, key))
    keep = np.asarray(w) > 0
    all_s.append(np.asarray(s, np.float32)[keep])
    all_l.append(np.asarray(lab)[keep])
  s, lab = np.concatenate(all_s), np.concatenate(all_l)
  return {"rtd_auc": roc_auc(s, lab), "rtd_auc_count": int(lab.size),
          "rtd_auc_replaced": int(lab.sum())}


def _torch_rtd(objective, path):

  import torch  # optional (the hf extra): only the benchmark's torch reference
  import transformers  # optional (the hf extra)

  with open(os.path.join(path, "config.json")) as f:
    disc_arch = json.load(f)["architectures"][0]
  with open(os.path.join(path, "generator", "config.json")) as f:
    gen_arch = json.load(f)["architectures"][0]
  gen = getattr(transformers, gen_arch).from_pretrained(os.path.join(path, "generator"))
  disc = getattr(transformers, disc_arch).from_pretrained(path)
  if disc_arch.endswith("Model"):
    raise ValueError(f"--compare-hf needs a transformers class with the RTD head; "
                     f"{disc_arch} has none")
  if objective.sharing == "tied":
    g_emb, d_emb = gen.base_model.embeddings, disc.base_model.embeddings
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
      if hasattr(g_emb, name) and hasattr(d_emb, name):
        setattr(d_emb, name, getattr(g_emb, name))
  weight, temperature = objective.disc_weight, objective.temperature

  class TorchRtd(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.generator, self.discriminator, self.config = gen, disc, disc.config

    def forward(self, input_ids, attention_mask, token_type_ids, labels=None,
                original_ids=None, **kw):
      if labels is None:
        return self.discriminator(input_ids, attention_mask=attention_mask,
                                  token_type_ids=token_type_ids, **kw)
      g = self.generator(input_ids, attention_mask=attention_mask,
                         token_type_ids=token_type_ids, labels=labels)
      masked = labels >= 0
      with torch.no_grad():
        probs = torch.softmax(g.logits[masked].float() / temperature, -1)
        sampled = torch.multinomial(probs, 1)[:, 0]
        corrupted = original_ids.clone()
        corrupted[masked] = sampled
        replaced = (corrupted != original_ids).long()
      d = self.discriminator(corrupted, attention_mask=attention_mask,
                             token_type_ids=token_type_ids, labels=replaced)
      return types.SimpleNamespace(loss=g.loss + weight * d.loss)

  return TorchRtd()
