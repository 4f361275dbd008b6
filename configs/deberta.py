"""DeBERTa-v3 architecture (He, Gao and Chen 2023) trained with masked language modelling.

  python -m launch.pretrain --config configs/deberta.py:tiny --workdir /tmp/deberta_tiny
  python -m launch.pretrain --config configs/deberta.py:base --workdir gs://BUCKET/deberta

Variants: tiny (L2/H128, the CPU run), and the released v3 sizes xsmall (L12/H384), small
(L6/H768), base (L12/H768), large (L24/H1024): shared attention keys, 256 log buckets,
LayerNorm-ed relative embeddings, no absolute positions, 128k vocabulary.

Objective: plain MLM on packed documents, the recipe of DeBERTa v1/v2 (He et al. 2021,
Table 9 of the appendix: batch 2k, learning rate 2e-4, 10k warmup steps, 1M steps, length
512, Adam eps 1e-6, weight decay 0.01). DeBERTaV3's own recipe, replaced-token detection
with gradient-disentangled embedding sharing, needs the RTD objective (the ELECTRA issue)
and is not here yet.
"""
from configs import common
from encoders import deberta

VARIANTS = tuple(deberta.VARIANTS)


def get_config(arg="base"):
  a = common.parse_arg(arg, variant="base")
  if a.variant not in VARIANTS:
    raise ValueError(f"unknown DeBERTa variant {a.variant!r}; choose from {list(VARIANTS)}")
  c = common.base_config()
  c.model = deberta.defaults(a.variant)
  c.objective.name = "mlm"
  c.objective.max_predictions = -1  # auto: ceil(0.15 * seq_len)
  c.data.packing = "documents"
  if a.variant == "tiny":
    # A CPU run beside BERT tiny's (same data size, batch, schedule and steps).
    c.model.position_buckets = 64
    c.data.seq_len = 128
    c.data.global_batch = 32
    c.tokenizer.vocab_size = 8000
    c.optimizer.learning_rate = 1e-3
    c.optimizer.warmup_steps = 100
    c.train.steps = 1000
    c.train.log_every = 50
    c.train.eval_every = 250
    c.checkpoint.every = 500
  else:
    c.data.seq_len = 512
    c.data.global_batch = 2048
    c.tokenizer.vocab_size = 128000
    c.optimizer.learning_rate = 2e-4
    c.optimizer.warmup_steps = 10_000
    c.optimizer.eps = 1e-6
    c.optimizer.weight_decay = 0.01
    c.train.steps = 1_000_000
    c.train.log_every = 100
    c.train.eval_every = 10_000
    c.checkpoint.every = 5_000
  return c.lock()
