"""EuroBERT (Boizard et al. 2025): MLM only, packed documents, grouped-query attention.

  python -m launch.pretrain --config configs/eurobert.py:tiny --workdir /tmp/eurobert_tiny
  python -m launch.pretrain --config configs/eurobert.py:210m --workdir gs://B/eurobert_210m
  python -m launch.aot --config configs/eurobert.py:610m --topology v5p:2x2x1 \\
      --global_batch 128 --seq 512

Variants: tiny (4 layers, H128, 4 query heads over 2 K/V heads; the CPU run), 210m, 610m
and 2.1b (the released sizes; 610m and 2.1b with 6 K/V heads for 18 query heads). From
the paper's recipe: MLM only with a 50% masking rate in pre-training (`mask_rate=`),
2,048-token packed rows, warmup-stable-decay. The model keeps the released configs'
rotary theta (250k, their 8k-context setting). Batch, learning rate, optimizer settings
and steps are this project's starting values, not the paper's; the tokenizer is trained
on the data (sentencepiece BPE) unless `tokenizer.kind` points at Llama-3's.
"""
from configs import common
from encoders import eurobert

VARIANTS = tuple(eurobert.VARIANTS)


def get_config(arg="210m"):
  a = common.parse_arg(arg, variant="210m", mask_rate=0.5)
  if a.variant not in VARIANTS:
    raise ValueError(f"unknown EuroBERT variant {a.variant!r}; choose from {list(VARIANTS)}")
  c = common.base_config()
  c.model = eurobert.defaults(a.variant)
  c.objective.name = "mlm"
  c.objective.mask_rate = a.mask_rate
  c.objective.max_predictions = -1  # auto: ceil(mask_rate * seq_len)
  c.data.packing = "documents"
  c.optimizer.schedule = "wsd"
  if a.variant == "tiny":
    common.tiny_recipe(c)
    return c.lock()
  c.tokenizer.model_type = "bpe"
  c.tokenizer.vocab_size = 128256
  c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = 0.9, 0.95, 1e-5
  c.optimizer.weight_decay = 0.1
  c.optimizer.learning_rate = 3e-4
  c.optimizer.warmup_steps = 2_000
  c.optimizer.decay_fraction = 0.1
  c.data.seq_len = 2048
  c.data.global_batch = 1024
  c.train.steps = 200_000
  c.train.log_every = 100
  c.train.eval_every = 5_000
  c.checkpoint.every = 2_500
  return c.lock()
