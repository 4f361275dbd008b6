"""The interface between an objective and the trainer (launch/train.py)."""
from typing import Callable, Dict, Tuple

import flax.linen as nn
import jax

_OBJECTIVES: Dict[str, Callable] = {}


def register_objective(*names):
  def wrap(cls):
    for n in names:
      _OBJECTIVES[n] = cls
    return cls
  return wrap


def get_objective(config, tokenizer):
  name = config.objective.name
  if name not in _OBJECTIVES:
    raise ValueError(f"unknown objective {name!r}; available: {sorted(_OBJECTIVES)}")
  return _OBJECTIVES[name](config, tokenizer)


class Objective:
  """What an objective gives the trainer.

  - `modules`: name -> Flax module it trains (ELECTRA: generator + discriminator);
  - `init(rng)`: boxed params {name: params} (logical partitioning kept for sharding);
  - `transform(batch, rng)`: the on-device batch transform (dynamic masking, generator
    sampling inputs, ...) applied to the whole global batch before any accumulation split,
    so the result does not depend on how the batch is split;
  - `loss(params, batch, rng, train)`: (scalar loss, dict of metric sums) on a transformed
    (micro-)batch; `rng` is for dropout;
  - `forward_flops(seq_len)`: FLOPs of one sequence's forward pass, for MFU;
  - `export(params, path)`: writes what users load elsewhere (an HF directory).
  """
  modules: Dict[str, nn.Module]

  def init(self, rng) -> Dict:
    raise NotImplementedError

  def transform(self, batch, rng) -> Dict:
    return batch

  def loss(self, params, batch, rng, train: bool) -> Tuple[jax.Array, Dict]:
    raise NotImplementedError

  def forward_flops(self, seq_len: int) -> float:
    raise NotImplementedError

  def export(self, params, path: str):
    raise NotImplementedError
