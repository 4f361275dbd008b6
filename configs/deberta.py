"""DeBERTa-v3 architecture (He, Gao and Chen 2023): plain MLM, or the DeBERTaV3 recipe
(replaced-token detection with gradient-disentangled embedding sharing).

  python -m launch.pretrain --config configs/deberta.py:tiny --workdir /tmp/deberta_tiny
  python -m launch.pretrain --config configs/deberta.py:base --workdir gs://BUCKET/deberta
  python -m launch.pretrain --config configs/deberta.py:v3-tiny --workdir /tmp/debv3_tiny
  python -m launch.pretrain --config configs/deberta.py:v3-base --workdir gs://BUCKET/debv3

Sizes: tiny (L2/H128, the CPU run), and the released v3 sizes xsmall (L12/H384), small
(L6/H768), base (L12/H768), large (L24/H1024): shared attention keys, 256 log buckets,
LayerNorm-ed relative embeddings, no absolute positions, 128k vocabulary.

`<size>`: plain MLM on packed documents, the recipe of DeBERTa v1/v2 (He et al. 2021,
Table 9 of the appendix: batch 2k, learning rate 2e-4, 10k warmup steps, 1M steps, length
512, Adam eps 1e-6, weight decay 0.01).

The MLM recipes (`<size>`, `v1-<size>`) decode with the enhanced mask decoder
(`enhanced_mask_decoder`, encoders/deberta.py): two more passes of the last layer with
absolute positions in the queries, as the released pretraining code does; the RTD recipe
has no MLM head on the discriminator and keeps it off.

`v1-<size>` (tiny, base, large, xlarge): the same MLM recipe on the DeBERTa v1 architecture
(family "deberta", transformers' `Deberta*`: no buckets, distances clipped at
max_position_embeddings, separate position projections, no key biases; a 50k vocabulary
for the released sizes), e.g. to continue from microsoft/deberta-base.

TPU recipe (every size but tiny): attention_probs_dropout_prob = 0 (the papers use 0.1), as
BERT's TPU recipe, ModernBERT and MosaicBERT train, so `relative_impl: auto` runs the fused
relative-attention Pallas kernel on TPU (encoders/layers/relative_kernel.py: it never forms
the attention probabilities, so it has no dropout on them). For the papers' setting pass
`--config.model.attention_probs_dropout_prob=0.1`; the run's first lines then say that
the shift formulation was taken instead, and why.

`v3-<size>`: the DeBERTaV3 recipe (objectives/rtd.py): a DeBERTa-v3 generator of the
discriminator's width and half its depth (the paper's Section 5: "same width, half the
depth"), GDES embedding sharing (`sharing=gdes|tied|none` to change it), RTD loss weight
50, masking 15% (85% [MASK], 15% kept, no random tokens: configs/electra.py); the pre-training
settings of the paper's appendix: batch 8k, 500k steps, 10k warmup steps, learning rate 3e-4 (large) /
6e-4 (xsmall, small, base), Adam betas (0.9, 0.98), eps 1e-6, weight decay 0.01, gradient
clipping 1.0, length 512. v3-tiny is the CPU run (the ELECTRA tiny's data, batch and
schedule); it reports held-out discriminator precision / recall / AUC
(`python -m launch.rtd_eval --workdir DIR`) and the generator's MLM accuracy.
"""
from configs import common, electra
from encoders import deberta

SIZES = tuple(deberta.VARIANTS)
V1_SIZES = tuple(deberta.V1_VARIANTS)
VARIANTS = SIZES + tuple(f"v3-{s}" for s in SIZES) + tuple(f"v1-{s}" for s in V1_SIZES)
V3_LR = {"xsmall": 6e-4, "small": 6e-4, "base": 6e-4, "large": 3e-4}


def get_config(arg="base"):
  a = common.parse_arg(arg, variant="base", sharing="gdes")
  if a.variant not in VARIANTS:
    raise ValueError(f"unknown DeBERTa variant {a.variant!r}; choose from {list(VARIANTS)}")
  v3, v1 = a.variant.startswith("v3-"), a.variant.startswith("v1-")
  size = a.variant[3:] if v3 or v1 else a.variant
  c = common.base_config()
  c.model = deberta.defaults_v1(size) if v1 else deberta.defaults(size)
  c.objective.name = "mlm"
  c.objective.max_predictions = -1  # auto: ceil(0.15 * seq_len)
  c.data.packing = "documents"
  # the MLM recipes decode with the enhanced mask decoder, as the papers' pretraining does
  c.model.enhanced_mask_decoder = not v3
  if v3:
    electra.rtd_objective(c, a.sharing, width=1.0, depth=0.5)
    c.model.heads = ("rtd",)  # the discriminator's; the generator gets "mlm"
  elif a.sharing != "gdes":
    raise ValueError("sharing= applies to the v3-* (RTD) variants only")
  if size == "tiny":
    if v3:  # configs/electra.py:tiny's run: length 64, 800 steps, temperature 2
      common.tiny_recipe(c, steps=800, eval_every=400, seq_len=64, dropout=False)
      c.model.position_buckets = 32
      c.objective.temperature = 2.0  # why: configs/electra.py (tiny) and docs/electra.md
    else:
      common.tiny_recipe(c)
      if not v1:  # v1 has no buckets: its distances clip at max_position_embeddings
        c.model.position_buckets = 64
  elif v3:
    c.model.attention_probs_dropout_prob = 0.0  # the TPU recipe: see the docstring
    c.data.seq_len = 512
    c.data.global_batch = 8192
    c.tokenizer.vocab_size = 128000
    c.optimizer.learning_rate = V3_LR[size]
    c.optimizer.warmup_steps = 10_000
    c.optimizer.b2 = 0.98
    c.optimizer.eps = 1e-6
    c.optimizer.weight_decay = 0.01
    c.optimizer.clip_norm = 1.0
    c.train.steps = 500_000
    c.train.log_every = 100
    c.train.eval_every = 10_000
    c.checkpoint.every = 5_000
  else:
    c.model.attention_probs_dropout_prob = 0.0  # the TPU recipe: see the docstring
    c.data.seq_len = 512
    c.data.global_batch = 2048
    c.tokenizer.vocab_size = 50265 if v1 else 128000
    c.optimizer.learning_rate = 2e-4
    c.optimizer.warmup_steps = 10_000
    c.optimizer.eps = 1e-6
    c.optimizer.weight_decay = 0.01
    c.train.steps = 1_000_000
    c.train.log_every = 100
    c.train.eval_every = 10_000
    c.checkpoint.every = 5_000
  return c.lock()
