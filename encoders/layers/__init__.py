"""Shared primitives every family composes, one seam per file:

  core.py        Dense, LayerNorm, RMSNorm (`make_norm` by kind), activations,
                 initialisers, logical constraints
  dropout.py     Dropout with a fused Threefry keep mask (64-bit counters)
  embeddings.py  token / position / type embeddings, sinusoidal tables, E -> D projection
  masks.py       attention masks (dense, SegmentMask) and the AttentionInputs struct
  kernels.py     attention kernels: einsum reference, CPU layout, Splash (TPU), rotary
  attention.py   MultiHeadAttention over the kernels (grouped-query when num_kv_heads < H)
  position_bias.py  a bucketed relative position bias shared by all layers (T5, MPNet)
  blocks.py      Mlp, EncoderBlock (post-LN / pre-LN), Sequence (a group of blocks)
  stack.py       the layer stack: per-layer, shared or scanned params; remat; the
                 CPU cotangent barrier between unrolled layers

Parameters carry logical axis names (`vocab`, `embed`, `heads`, `kv`, `mlp`); activations
are constrained with `act_*` names; one rules table maps them onto the mesh.
Shapes: B batch, T sequence, D hidden, E embedding, H heads, K head dim, F MLP width, V vocab.
"""
from encoders.layers.core import (NORM_KINDS, Array, Dense, Dtype, LayerNorm, RMSNorm,
                                  activation, constrain, dtype_from_name, gelu_erf,
                                  make_norm, normal_init, ones_init, round_cotangent,
                                  zeros_init)
from encoders.layers.dropout import Dropout, counters, random_bits, threefry2x32
from encoders.layers.embeddings import Embeddings, sinusoidal_table
from encoders.layers.masks import (AttentionInputs, SegmentMask, make_attention_mask,
                                   segment_mask)
from encoders.layers.kernels import (SPLASH_BLOCKS, attention_head_major,
                                     attention_scores_einsum, rotary, splash_attention)
from encoders.layers.attention import MultiHeadAttention
from encoders.layers.position_bias import RelativePositionBias, relative_position_bucket
from encoders.layers.blocks import EncoderBlock, Mlp, Sequence
from encoders.layers.stack import (SCANNED_LAYERS, Stack, cotangent_barrier, remat_block,
                                   stack_layer_params, unstack_layer_params)
