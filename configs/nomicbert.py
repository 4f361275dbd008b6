"""NomicBERT (Nussbaum et al. 2024, nomic-embed-text's encoder): MLM at 30%, packed documents.

  python -m launch.pretrain --config configs/nomicbert.py:tiny --workdir /tmp/nomic_tiny
  python -m launch.pretrain --config configs/nomicbert.py:base --workdir gs://B/nomic_base

Variants: tiny (4 layers, H128; the CPU run at sequence length 128) and base (12 layers,
H768, SwiGLU 3072, rotary theta 1,000: nomic-bert-2048, the encoder nomic-embed-text is
contrastively trained from). base: MLM alone with 30% masking on 2,048-token packed rows
and a 30,528-entry vocabulary (sentencepiece trained on the data unless `tokenizer.kind`
points at BERT's WordPiece), as the Nomic Embed report describes nomic-bert-2048; the
optimizer settings (AdamW b2 0.98, eps 1e-6, weight decay 1e-5, peak lr 5e-4, linear
decay, 6% warmup) are our reading of it: check them before a real run.
"""
from configs import common
from encoders import nomicbert

VARIANTS = tuple(nomicbert.VARIANTS)


def get_config(arg="base"):
  a = common.parse_arg(arg, variant="base", mask_rate=0.3)
  if a.variant not in VARIANTS:
    raise ValueError(f"unknown NomicBERT variant {a.variant!r}; choose from {list(VARIANTS)}")
  c = common.base_config()
  c.model = nomicbert.defaults(a.variant)
  c.objective.name = "mlm"
  c.objective.mask_rate = a.mask_rate
  c.objective.max_predictions = -1  # auto: ceil(mask_rate * seq_len)
  c.data.packing = "documents"
  if a.variant == "tiny":
    common.tiny_recipe(c)
    return c.lock()
  c.tokenizer.vocab_size = 30528
  c.data.seq_len = 2048
  c.data.global_batch = 4096
  c.optimizer.b2, c.optimizer.eps, c.optimizer.weight_decay = 0.98, 1e-6, 1e-5
  c.optimizer.learning_rate = 5e-4
  c.train.steps = 100_000
  c.optimizer.warmup_steps = 6_000
  c.train.log_every = 100
  c.train.eval_every = 5_000
  c.checkpoint.every = 2_500
  return c.lock()
