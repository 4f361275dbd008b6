"""MPNet (Song et al. 2020): BERT's layers with a relative position bias shared by all
layers, trained here by MLM on packed documents.

  python -m launch.pretrain --config configs/mpnet.py:tiny --workdir /tmp/mpnet_tiny
  python -m launch.aot --config configs/mpnet.py:base --topology v5p:2x2x1 \\
      --global_batch 128 --seq 512

Variants: tiny (L2/H128, the CPU run: BERT tiny-mlm's recipe, docs/mpnet.md) and base
(L12/H768, microsoft/mpnet-base's shape, the model of all-mpnet-base-v2). MPNet's own
objective, masked and permuted language modeling, is not implemented: base takes the
paper's optimisation (RoBERTa's: batch 8,192 x 512 tokens, 500k steps, peak lr 6e-4,
Adam b2 0.98, eps 1e-6, weight decay 0.01) with the MLM objective. The bias is an
additive score term, so attention runs on XLA, not Splash (docs/mpnet.md).
"""
from configs import common
from encoders import mpnet

VARIANTS = tuple(mpnet.VARIANTS)


def get_config(arg="base"):
  a = common.parse_arg(arg, variant="base")
  if a.variant not in VARIANTS:
    raise ValueError(f"unknown MPNet variant {a.variant!r}; choose from {list(VARIANTS)}")
  c = common.base_config()
  c.model = mpnet.defaults(a.variant)
  c.objective.name = "mlm"
  c.objective.max_predictions = -1  # auto: ceil(mask_rate * seq_len)
  c.data.packing = "documents"
  if a.variant == "tiny":
    # BERT tiny-mlm's recipe (configs/bert.py): a larger init and sinusoidal-initialized
    # positions at width 128, 30% masking in training and BERT's 15% when scored.
    common.tiny_recipe(c, steps=800, seq_len=64, global_batch=64, learning_rate=2e-3,
                       dropout=False)
    c.model.initializer_range = 0.06
    c.model.position_init = "sinusoidal"
    c.objective.mask_rate = 0.3
    c.objective.eval_mask_rate = 0.15
    return c.lock()
  c.model.vocab_pad_multiple = 128  # the tied decoder tiles the TPU's matrix unit
  c.tokenizer.vocab_size = 30527
  c.data.seq_len = 512
  c.data.global_batch = 8192
  c.optimizer.b2 = 0.98
  c.optimizer.learning_rate = 6e-4
  c.optimizer.warmup_steps = 24_000
  c.optimizer.weight_decay = 0.01
  c.train.steps = 500_000
  c.train.log_every = 100
  c.train.eval_every = 10_000
  c.checkpoint.every = 5_000
  return c.lock()
