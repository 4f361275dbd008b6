"""BERT (Devlin et al. 2019): MLM + NSP on sentence pairs.

  python -m launch.pretrain --config configs/bert.py:tiny-mlm --workdir /tmp/bert_tiny
Variants: tiny (L2/H128), mini (L4/H256), small (L4/H512), medium (L8/H512) — the sizes of
Turc et al. 2019's compact BERTs — base (L12/H768), large (L24/H1024). `tiny-mlm` is the
README's main job: tiny's model and optimizer, MLM alone on packed documents, trained at a
30% masking rate and scored at BERT's 15% (`objective.eval_mask_rate`), 800 steps.

TPU recipe (every variant but the tiny ones): attention_probs_dropout_prob = 0, as
ModernBERT and MosaicBERT train, so `attention_impl: auto` can run the Splash kernel on TPU
(it has no attention-probability dropout; with dropout > 0 training would take the einsum
path and the run's log says so). Hidden dropout stays at BERT's 0.1. `tiny` (BERT's
MLM+NSP recipe at CPU scale) keeps BERT's dropout; `tiny-mlm` has none. Both are for a few
minutes on a CPU: rows of 64
tokens (batch 64), initializer_range 0.06 and sinusoidal-initialized learned positions
(`model.position_init`), lr 2e-3; the comment in get_config says why. The TPU recipe
also pads the embedding table to a multiple of 128 rows (vocab_pad_multiple; 30522 ->
30592, the padding never predicted) so the tied MLM decoder's vocabulary dimension tiles
the TPU's 128-wide matrix unit. `large` scans its 24 layers (`model.scan_layers`), for a
TPU compile under 5 minutes.
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
    # BERT's recipe (MLM + NSP) at CPU scale: ~6 minutes on an idle 2-core CPU on the
    # embedded default corpus. `tiny-mlm` (below) is the README's main job.
    c.tokenizer.vocab_size = 8000
    # Rows of 64 tokens, 64 a batch: the same 4,096 tokens a step as 32 x 128, slightly
    # fewer FLOPs (1.45e10 vs 1.53e10 a step). At width 128 BERT's N(0, 0.02) init leaves
    # the attention uniform and the position embeddings unmoved for hundreds of steps
    # (the model predicts from a bag of the row's words), so shorter rows, a larger init
    # (0.06, ~0.7/sqrt(hidden)) and sinusoidal-initialized (still learned) positions
    # each raise the held-out MLM accuracy; docs/first_hour.md has the probes.
    c.data.seq_len = 64
    c.data.global_batch = 64
    c.model.initializer_range = 0.06
    c.model.position_init = "sinusoidal"
    # 2e-3, not 1e-3 (10.8% vs 8.8% at step 1000 at 32 x 128); 5e-3 stays at the
    # most-frequent-token level (docs/first_hour.md).
    c.optimizer.learning_rate = 2e-3
    c.optimizer.warmup_steps = 100
    c.train.steps = 1000
    c.train.log_every = 50
    c.train.eval_every = 250
    c.checkpoint.every = 500
    if a.variant == "tiny-mlm":
      # The README's main job (~5 minutes on an idle 2-core CPU). MLM alone on packed
      # documents: no pair pipeline, every row full of one document's text. Dropout 0 (800
      # steps over 1.2 M tokens do not overfit). Masking 30% of the tokens in training
      # (Wettig et al. 2023 found 40% better than 15% for BERT-large) gives the head twice
      # the targets a step; the held-out batches stay masked at BERT's 15%, so the eval
      # accuracy means what BERT's does. docs/first_hour.md has the probes.
      c.model.heads = ("mlm",)
      c.objective.name = "mlm"
      c.data.packing = "documents"
      c.model.hidden_dropout_prob = 0.0
      c.model.attention_probs_dropout_prob = 0.0
      c.objective.mask_rate = 0.3
      c.objective.eval_mask_rate = 0.15
      c.train.steps = 800
      c.train.eval_every = 200
      c.checkpoint.every = 400
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
      # 24 layers as one scanned layer: the TPU compile of the unrolled step took 5.5 min
      # on a 2-core CPU (332 s, v5p:2x2x1, batch 128 x 512; the scanned one 171 s),
      # at ~2x the HBM (38 of 95 GiB per v5p chip); docs/benchmarks.md, issue 17
      c.model.scan_layers = True
  return c.lock()
