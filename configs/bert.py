"""BERT (Devlin et al. 2019): MLM + NSP on sentence pairs.

  python -m launch.pretrain --config configs/bert.py:tiny-mlm --workdir /tmp/bert_tiny
Variants: tiny (L2/H128), mini (L4/H256), small (L4/H512), medium (L8/H512) — the sizes of
Turc et al. 2019's compact BERTs — base (L12/H768), large (L24/H1024). `tiny-mlm` is the
README's main job: tiny's model and optimizer, MLM alone on packed documents, trained at a
30% masking rate and scored at BERT's 15% (`objective.eval_mask_rate`), 800 steps.

The sizes above tiny use the TPU recipe: attention_probs_dropout_prob = 0 (as ModernBERT
and MosaicBERT train), so `attention_impl: auto` can run the Splash kernel, which has no
attention-probability dropout; the embedding table padded to a multiple of 128 rows
(`vocab_pad_multiple`) so the tied MLM decoder tiles the TPU's matrix unit; `large` scans
its layers (`model.scan_layers`) to keep the TPU compile short (docs/benchmarks.md).
The tiny ones are CPU runs of a few minutes (docs/first_hour.md).
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
  recipes = list(VARIANTS) + ["tiny-mlm"]
  if a.variant not in recipes:
    raise ValueError(f"unknown BERT variant {a.variant!r}; choose from {recipes}")
  c = common.base_config()
  layers, hidden, heads = VARIANTS["tiny" if a.variant == "tiny-mlm" else a.variant]
  c.model.family = "bert"
  c.model.variant = a.variant
  c.model.num_hidden_layers = layers
  c.model.hidden_size = hidden
  c.model.num_attention_heads = heads
  c.model.intermediate_size = 4 * hidden
  c.model.heads = ("mlm", "nsp")
  c.objective.name = "mlm_nsp"
  c.objective.max_predictions = -1  # auto: ceil(0.15 * seq_len), BERT's 20 at length 128
  c.data.packing = "pairs"
  c.data.seq_len = 128
  if a.variant in ("tiny", "tiny-mlm"):
    mlm = a.variant == "tiny-mlm"
    # At width 128 BERT's N(0, 0.02) init leaves the attention uniform for hundreds of
    # steps: shorter rows, a larger init and sinusoidal-initialized (still learned)
    # positions let the model use word order early (docs/first_hour.md).
    common.tiny_recipe(c, steps=800 if mlm else 1000, seq_len=64, global_batch=64,
                       learning_rate=2e-3, dropout=not mlm)
    c.model.initializer_range = 0.06
    c.model.position_init = "sinusoidal"
    if mlm:
      # MLM alone on packed documents, masked at 30% in training (twice the targets a
      # step; Wettig et al. 2023) and at BERT's 15% when scored (docs/first_hour.md).
      c.model.heads = ("mlm",)
      c.objective.name = "mlm"
      c.data.packing = "documents"
      c.objective.mask_rate = 0.3
      c.objective.eval_mask_rate = 0.15
  else:
    # Devlin et al.: batch 256, lr 1e-4, 10k warmup steps, 1M steps (90% at length 128).
    c.model.attention_probs_dropout_prob = 0.0  # the TPU recipe: see the docstring
    c.model.vocab_pad_multiple = 128
    c.tokenizer.vocab_size = 30522
    c.data.global_batch = 256
    c.optimizer.learning_rate = 1e-4
    c.optimizer.warmup_steps = 10_000
    c.train.steps = 1_000_000
    c.train.log_every = 100
    c.train.eval_every = 10_000
    c.checkpoint.every = 5_000
    if a.variant == "large":
      c.model.scan_layers = True  # a shorter TPU compile (docs/benchmarks.md)
  return c.lock()
