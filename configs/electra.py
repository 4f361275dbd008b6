"""ELECTRA (Clark et al. 2020): replaced-token detection, a generator and a discriminator.

  python -m launch.pretrain --config configs/electra.py:tiny --workdir /tmp/electra_tiny
  python -m launch.pretrain --config configs/electra.py:base --workdir gs://BUCKET/electra
  python -m launch.pretrain --config configs/electra.py:small,sharing=gdes --workdir ...

The model section is the discriminator; the generator is the same family scaled by
objective.generator_width (hidden, FFN and heads) and generator_depth (layers).
Variants small, base and large follow the paper's Table 6 (as written down here from the
paper: generator 1/4, 1/3, 1/4 of the width; disc loss weight 50; learning rate 5e-4,
2e-4, 2e-4; batch 128, 256, 2048; 1M, 766k, 400k steps; 10k warmup steps; mask 15%, 15%,
25%; sequence length 128 for Small, 512 otherwise; Adam eps 1e-6, weight decay 0.01,
clip 1.0, linear decay) with tied token/position/type embeddings (the paper's sharing).
The masked positions are [MASK] 85% of the time and kept 15% (no random tokens: the
generator supplies the replacements).
Arguments: `sharing=none|tied|gdes` (gdes: DeBERTaV3's gradient-disentangled sharing).
Departures from the paper for the TPU, as configs/bert.py's recipe: attention-probability
dropout 0 (so `attention_impl: auto` runs the Splash kernel, which has none) and the
embedding table padded to a multiple of 128 rows (padded ids are never predicted or
sampled). `--config.model.attention_probs_dropout_prob=0.1` restores the paper's.

tiny is the CPU run: a 2-layer H128 discriminator with an H32 generator on the default
corpus, sequences of 64, learning rate 1e-3, 800 steps, sampling temperature 2 (the one
departure from the paper, see the comment below); it reports held-out discriminator
precision and recall against the never-flag baseline.
"""
from configs import common
from encoders import electra

VARIANTS = tuple(electra.VARIANTS)

# variant -> (generator width, lr, batch, steps, mask rate, seq_len)
RECIPES = {
    "small": (0.25, 5e-4, 128, 1_000_000, 0.15, 128),
    "base": (1 / 3, 2e-4, 256, 766_000, 0.15, 512),
    "large": (0.25, 2e-4, 2048, 400_000, 0.25, 512),
}


def rtd_objective(c, sharing="tied", width=0.25, depth=1.0):
  """The rtd objective's settings in config `c` (any family's model section)."""
  o = c.objective
  o.name = "rtd"
  o.mask_rate = 0.15
  o.mask_token_prob = 0.85
  o.random_token_prob = 0.0
  o.max_predictions = -1
  o.generator_width = width  # generator hidden/FFN/heads as a fraction of the disc's
  o.generator_depth = depth  # generator layers as a fraction of the disc's
  o.temperature = 1.0  # sampling temperature of the generator's softmax
  o.disc_weight = 50.0  # lambda: loss = MLM + disc_weight * discriminator BCE
  o.sharing = sharing  # none | tied | gdes
  o.rtd_positions = "all"  # all real tokens | masked (ELECTRA 15%)
  return c


def get_config(arg="base"):
  a = common.parse_arg(arg, variant="base", sharing="tied")
  if a.variant not in VARIANTS:
    raise ValueError(f"unknown ELECTRA variant {a.variant!r}; choose from {list(VARIANTS)}")
  c = common.base_config()
  c.model = electra.defaults(a.variant)
  c.data.packing = "documents"
  c.tokenizer.lowercase = True  # the released ELECTRA vocabularies are uncased
  if a.variant == "tiny":
    rtd_objective(c, a.sharing, width=0.25)
    # At temperature 1 the replacements are too plausible for a 2-layer discriminator to
    # learn to spot within a CPU run; at 2 it learns in minutes (docs/electra.md).
    c.objective.temperature = 2.0
    common.tiny_recipe(c, steps=800, eval_every=400, seq_len=64, dropout=False)
  else:
    width, lr, batch, steps, mask_rate, seq_len = RECIPES[a.variant]
    rtd_objective(c, a.sharing, width=width)
    c.objective.mask_rate = mask_rate
    c.data.seq_len = seq_len
    c.data.global_batch = batch
    c.tokenizer.vocab_size = 30522
    c.model.attention_probs_dropout_prob = 0.0  # BERT's TPU recipe: see the docstring
    c.model.vocab_pad_multiple = 128
    c.optimizer.learning_rate = lr
    c.optimizer.warmup_steps = 10_000
    c.optimizer.eps = 1e-6
    c.optimizer.weight_decay = 0.01
    c.optimizer.clip_norm = 1.0
    c.train.steps = steps
    c.train.log_every = 100
    c.train.eval_every = 10_000
    c.checkpoint.every = 5_000
  return c.lock()
