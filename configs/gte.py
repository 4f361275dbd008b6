"""GTE v1.5's encoder (Zhang et al. 2024, mGTE): MLM at 30%, packed documents.

  python -m launch.pretrain --config configs/gte.py:tiny --workdir /tmp/gte_tiny
  python -m launch.pretrain --config configs/gte.py:base --workdir gs://B/gte_base

Variants: tiny (4 layers, H128; the CPU run at sequence length 128), base (12 layers, H768,
rotary theta 500k: gte-base-en-v1.5), large (24 layers, H1024, theta 160k:
gte-large-en-v1.5) and multilingual-base (gte-multilingual-base's 250k vocabulary). base
and large are a first MLM stage at 30% masking on 2,048-token packed rows; the optimizer
settings (AdamW b2 0.98, weight decay 0.01, peak lr 5e-4, 5% warmup) are this project's
starting point, not a published recipe. hidden_dropout_prob is 0.1 as released.
"""
from configs import common
from encoders import gte

VARIANTS = tuple(gte.VARIANTS)


def get_config(arg="base"):
  a = common.parse_arg(arg, variant="base", mask_rate=0.3)
  if a.variant not in VARIANTS:
    raise ValueError(f"unknown GTE variant {a.variant!r}; choose from {list(VARIANTS)}")
  c = common.base_config()
  c.model = gte.defaults(a.variant)
  c.objective.name = "mlm"
  c.objective.mask_rate = a.mask_rate
  c.objective.max_predictions = -1  # auto: ceil(mask_rate * seq_len)
  c.data.packing = "documents"
  if a.variant == "tiny":
    common.tiny_recipe(c)
    return c.lock()
  c.tokenizer.vocab_size = c.model.vocab_size
  c.data.seq_len = 2048
  c.data.global_batch = 4096
  c.optimizer.b2 = 0.98
  c.optimizer.learning_rate = 5e-4
  c.train.steps = 100_000
  c.optimizer.warmup_steps = 5_000
  c.train.log_every = 100
  c.train.eval_every = 5_000
  c.checkpoint.every = 2_500
  return c.lock()
