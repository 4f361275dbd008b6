"""The generic encoder: what every family shares, with the family's parts injected.

A family is a subclass that supplies `parts()` (its embeddings, layer stack, final norm and
heads, as factories) and, where it differs from the default, how it numbers positions and
what its attention needs per layer. This module owns the rest:

  input validation (before any computation) -> default mask, token types and positions ->
  embeddings -> AttentionInputs (+ a shared position bias, once) -> the layer stack ->
  final norm (if any) -> heads:
    "pooler"       pooler_output (B,D) from the pooler module
    "nsp", "sop"   (B,2) logits of a classifier on pooler_output
    "mlm"          (B,T,V) logits, or (B,M,V) at `masked_positions` (B,M): the hidden
                   states are gathered first, and the head decodes against the word
                   embeddings (`embeddings.attend`) and cuts padded vocabulary rows
    "rtd"          (B,T) logits of a per-token scorer (ELECTRA's discriminator)
"""
import dataclasses
from typing import Callable, Dict, Optional

import flax.linen as nn
import jax.numpy as jnp

from encoders import base, layers

# Head name -> the EncoderOutput field it fills.
HEAD_OUTPUTS = {"pooler": "pooler_output", "nsp": "nsp_logits", "sop": "sop_logits",
                "mlm": "mlm_logits", "rtd": "rtd_logits"}


@dataclasses.dataclass(frozen=True)
class Parts:
  """A family's wiring. Each entry is a factory called with `name=` (a module class or a
  functools.partial of one):
  embeddings  (input_ids, position_ids, token_type_ids, deterministic) -> (B,T,D); has
              `attend(h)` (..., E) -> (..., V) when an MLM head ties its decoder to it;
  stack       (x, inputs: layers.AttentionInputs, deterministic) -> (B,T,D), usually a
              `layers.Stack`; or a pair (B,T,D), (B,T,D): the last hidden state and what
              the MLM head decodes instead of it (DeBERTa's enhanced mask decoder);
  final_norm  optional (B,T,D) -> (B,T,D) after the stack (pre-LN families);
  heads       head name (see HEAD_OUTPUTS) -> factory; "pooler" must be present when
              "nsp" or "sop" is. The MLM head is called as head(h, decode).
  position_bias  optional T -> (1|B,H,T,T) score bias computed once per forward and added
              to `AttentionInputs.bias` for every layer (MPNet's shared bucketed relative
              bias: `layers.RelativePositionBias`).
  """
  embeddings: Callable[..., nn.Module]
  stack: Callable[..., nn.Module]
  final_norm: Optional[Callable[..., nn.Module]] = None
  heads: Dict[str, Callable[..., nn.Module]] = dataclasses.field(default_factory=dict)
  position_bias: Optional[Callable[..., nn.Module]] = None


class Encoder(nn.Module):
  """input_ids (B,T) [+ attention_mask, token_type_ids, segment_ids, position_ids] ->
  base.EncoderOutput. `masked_positions` (B,M) computes the MLM head only there.

  Out-of-range inputs (an id outside [0, vocab_size), a token type outside the type
  table, a position outside the position table, a mask value other than 0/1, a masked
  position outside [0, T)) raise ValueError when called eagerly. Under `jax.jit`, where
  values cannot be checked, every output of a row holding one is NaN (for a bad masked
  position: that position's MLM logits), never finite numbers from a clamped gather;
  rows without one are computed exactly as before.

  Families override `parts` and, optionally, `max_length`, `position_ids` and
  `attention_inputs`; they register with `base.register_family(name)` and give
  `defaults()` and `forward_flops(cfg, seq_len, mlm_positions)` as static methods."""
  config: object

  # ---- family hooks

  def parts(self) -> Parts:
    raise NotImplementedError

  def max_length(self) -> Optional[int]:
    """The longest sequence the model takes (None: unbounded)."""
    return self.config.get("max_position_embeddings") or None

  def position_ids(self, input_ids, segment_ids):
    """(B,T) positions when the caller gives none: 0.. per row, restarting per segment."""
    if segment_ids is not None:
      return base.positions_in_segments(segment_ids)
    return jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)

  def attention_inputs(self, attention_mask, segment_ids, position_ids) -> layers.AttentionInputs:
    """The per-layer attention inputs: by default the global mask (segment ids straight
    to the kernel for splash, which never builds a (T,T) mask; also for "auto" still
    undecided, which may pick splash at call time) and the positions."""
    if self.config.get("attention_impl") in ("splash", "auto"):
      mask = layers.segment_mask(attention_mask, segment_ids)
    else:
      mask = layers.make_attention_mask(attention_mask, segment_ids)
    return layers.AttentionInputs(mask=mask, positions=position_ids)

  @staticmethod
  def scan_params(cfg, params: dict) -> dict:
    """Per-layer params (HF import's layout: `encoder/layer_<i>`) -> this config's layout
    (stacked under `encoder/layers` when `scan_layers`)."""
    if not cfg.get("scan_layers", False):
      return params
    return layers.stack_layer_params(params, cfg.num_hidden_layers)

  @staticmethod
  def unscan_params(cfg, params: dict) -> dict:
    """The inverse of `scan_params` (HF export's layout)."""
    return layers.unstack_layer_params(params) if cfg.get("scan_layers", False) else params

  # ---- shared assembly

  def setup(self):
    p = self.parts()
    unknown = set(self.config.heads) - set(HEAD_OUTPUTS)
    if unknown:
      raise ValueError(f"unknown heads {sorted(unknown)}; known: {sorted(HEAD_OUTPUTS)}")
    missing = set(self.config.heads) - set(p.heads) - {"pooler"}
    if missing:
      raise ValueError(f"family {self.config.family!r} has no {sorted(missing)} head")
    self.embeddings = p.embeddings()
    self.encoder = p.stack()
    if p.final_norm is not None:
      self.final_norm = p.final_norm()
    self._has_final_norm = p.final_norm is not None
    if p.position_bias is not None:
      self.position_bias = p.position_bias()
    self._has_position_bias = p.position_bias is not None
    for name in HEAD_OUTPUTS:
      if name in p.heads and self._needs(name):
        setattr(self, name, p.heads[name]())

  def _needs(self, head: str) -> bool:
    heads = set(self.config.heads)
    return head in heads or (head == "pooler" and bool(heads & {"nsp", "sop"}))

  def __call__(self, input_ids, attention_mask=None, token_type_ids=None, *,
               segment_ids=None, position_ids=None, masked_positions=None,
               deterministic=True):
    c = self.config
    base.validate_inputs(c, input_ids, attention_mask, token_type_ids, segment_ids,
                         position_ids, max_length=self.max_length(),
                         masked_positions=masked_positions)
    # Under jit the values above cannot be checked: a row holding one that eager apply
    # refuses comes out all NaN (never finite numbers from a clamped or wrapped gather).
    bad = base.bad_rows(c, input_ids, attention_mask, token_type_ids, position_ids,
                        self.max_length())
    input_ids = input_ids.astype(jnp.int32)
    if attention_mask is None:
      attention_mask = (segment_ids > 0) if segment_ids is not None else jnp.ones_like(input_ids)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if position_ids is None:
      position_ids = self.position_ids(input_ids, segment_ids)
    x = base.poison(self.embeddings(input_ids, position_ids, token_type_ids, deterministic),
                    bad)
    inputs = self.attention_inputs(attention_mask, segment_ids, position_ids)
    if self._has_position_bias:
      shared = self.position_bias(input_ids.shape[1])
      inputs = inputs.replace(bias=shared if inputs.bias is None else inputs.bias + shared)
    x, mlm_x = self.encoder(x, inputs, deterministic), None
    if isinstance(x, tuple):  # (last hidden state, what the MLM head decodes instead)
      x, mlm_x = x
    if self._has_final_norm:
      x = self.final_norm(x)
    out = {"last_hidden_state": x}
    if self._needs("pooler"):
      out["pooler_output"] = self.pooler(x)
    for name in ("nsp", "sop"):
      if self._needs(name):
        out[HEAD_OUTPUTS[name]] = getattr(self, name)(out["pooler_output"])
    if self._needs("mlm"):
      mlm_x = x if mlm_x is None else mlm_x
      if masked_positions is None:
        out["mlm_logits"] = self.mlm(mlm_x, self.embeddings.attend)
      else:
        pos = masked_positions.astype(jnp.int32)
        h = jnp.take_along_axis(mlm_x, pos[..., None], axis=1)
        # a position outside [0, T) (refused eagerly) is NaN, not a wrapped -1 -> T-1
        wrong = None if base.is_concrete(masked_positions) else (pos < 0) | (
            pos >= mlm_x.shape[1])
        out["mlm_logits"] = base.poison(self.mlm(h, self.embeddings.attend), wrong)
    if self._needs("rtd"):
      out["rtd_logits"] = self.rtd(x)
    return base.EncoderOutput(**out)
