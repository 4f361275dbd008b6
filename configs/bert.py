"""BERT (Devlin et al. 2019): MLM + NSP on sentence pairs.

  python -m launch.pretrain --config configs/bert.py:tiny --workdir /tmp/bert_tiny
Variants: tiny (L2/H128), mini (L4/H256), small (L4/H512), medium (L8/H512) — the sizes of
Turc et al. 2019's compact BERTs — base (L12/H768), large (L24/H1024).
"""
from configs import common

VARIANTS = {  # layers, hidden, heads
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}


def get_config(arg="base"):
  a = common.parse_arg(arg, variant="base")
  if a.variant not in VARIANTS:
    raise ValueError(f"unknown BERT variant {a.variant!r}; choose from {list(VARIANTS)}")
  c = common.base_config()
  layers, hidden, heads = VARIANTS[a.variant]
  c.model.family = "bert"
  c.model.variant = a.variant
  c.model.num_hidden_layers = layers
  c.model.hidden_size = hidden
  c.model.num_attention_heads = heads
  c.model.intermediate_size = 4 * hidden
  c.model.heads = ("mlm", "nsp")
  c.objective.name = "mlm_nsp"
  c.data.packing = "pairs"
  return c.lock()
