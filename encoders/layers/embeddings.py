"""Token, position and token-type embeddings (with ALBERT/ELECTRA's E -> D projection)."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from encoders.layers.core import Dense, Dtype, LayerNorm, constrain, normal_init
from encoders.layers.dropout import Dropout

Array = jax.Array


def sinusoidal_table(num_positions: int, dim: int) -> Array:
  """(P, dim) fixed sin/cos position table (DistilBERT's sinusoidal_pos_embds layout)."""
  pos = jnp.arange(num_positions, dtype=jnp.float32)[:, None]
  inv = jnp.power(10000.0, -2.0 * (jnp.arange(dim) // 2) / dim)[None, :]
  angles = pos * inv
  table = jnp.where(jnp.arange(dim) % 2 == 0, jnp.sin(angles), jnp.cos(angles))
  return table


class Embeddings(nn.Module):
  """Word (+ position) (+ token type) embeddings, then LayerNorm, dropout and an optional
  E -> D projection (ALBERT, ELECTRA's small generators; with `project_before_norm`,
  DeBERTa's order: projection, LayerNorm over D, dropout).

  input_ids (B,T), position_ids (B,T), token_type_ids (B,T) -> (B,T,D).
  `word_embeddings` is a separate submodule so MLM decoders can tie to it (`attend`).
  """
  vocab_size: int
  embedding_size: int
  max_position_embeddings: int = 0  # 0: no learned positions (DeBERTa, ModernBERT)
  type_vocab_size: int = 0  # 0: no token types
  sinusoidal_positions: bool = False
  # Learned positions' initial values: normal (N(0, init_std), BERT's) | sinusoidal (the
  # sin/cos table scaled to the same RMS init_std, then learned like any parameter)
  position_init: str = "normal"
  layer_norm_eps: float = 1e-12
  norm_bias: bool = True
  use_norm: bool = True
  dropout_rate: float = 0.0
  projection_size: int = 0  # 0: no projection
  projection_bias: bool = True
  project_before_norm: bool = False  # DeBERTa: project E -> D, then LayerNorm over D
  init_std: float = 0.02
  dtype: Dtype = jnp.float32

  def setup(self):
    self.word_embeddings = nn.Embed(
        self.vocab_size, self.embedding_size, dtype=self.dtype, param_dtype=jnp.float32,
        embedding_init=normal_init(self.init_std, ("vocab", "embed")))

  @nn.compact
  def __call__(self, input_ids, position_ids=None, token_type_ids=None, deterministic=True):
    x = self.word_embeddings(input_ids)
    if self.max_position_embeddings:
      if self.sinusoidal_positions:
        table = sinusoidal_table(self.max_position_embeddings, self.embedding_size)
        x = x + jnp.take(table, position_ids, axis=0).astype(self.dtype)
      else:
        x = x + nn.Embed(self.max_position_embeddings, self.embedding_size, dtype=self.dtype,
                         param_dtype=jnp.float32, name="position_embeddings",
                         embedding_init=self._position_init())(position_ids)
    if self.type_vocab_size:
      x = x + nn.Embed(self.type_vocab_size, self.embedding_size, dtype=self.dtype,
                       param_dtype=jnp.float32, name="token_type_embeddings",
                       embedding_init=normal_init(self.init_std, (None, "embed")))(token_type_ids)
    project = functools.partial(Dense, (self.projection_size,), ("embed", "mlp"),
                                self.projection_bias, self.init_std, self.dtype,
                                name="projection")
    if self.projection_size and self.project_before_norm:
      x = project()(x)
    if self.use_norm:
      x = LayerNorm(self.layer_norm_eps, self.norm_bias, self.dtype, name="norm")(x)
    x = Dropout(self.dropout_rate)(x, deterministic=deterministic)
    if self.projection_size and not self.project_before_norm:
      x = project()(x)
    return constrain(x, ("act_batch", "act_len", "act_embed"))

  def _position_init(self):
    if self.position_init == "normal":
      return normal_init(self.init_std, (None, "embed"))
    if self.position_init != "sinusoidal":
      raise ValueError(f"position_init={self.position_init!r}; use normal or sinusoidal")
    scale = self.init_std * 2.0 ** 0.5  # sin/cos entries have RMS 1/sqrt(2)

    def init(key, shape, dtype=jnp.float32):
      del key
      return (scale * sinusoidal_table(shape[0], shape[1])).astype(dtype)
    return nn.with_logical_partitioning(init, (None, "embed"))

  def attend(self, x: Array) -> Array:
    """Tied decoder: (..., E) -> (..., V) float32 logits against the word embedding table
    (operands in the compute dtype, float32 accumulation and output: MLM logits are never
    rounded to bfloat16 before the softmax)."""
    table = self.word_embeddings.embedding.astype(self.dtype)
    return jnp.einsum("...e,ve->...v", x.astype(self.dtype), table,
                      preferred_element_type=jnp.float32)


