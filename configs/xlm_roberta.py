"""XLM-RoBERTa (Conneau et al. 2020): RoBERTa's MLM on packed documents over a 250,002
entry SentencePiece unigram vocabulary, padded to 1,024-row multiples so it shards evenly
(encoders/xlm_roberta.py).

  python -m launch.pretrain --config configs/xlm_roberta.py:tiny --workdir /tmp/xlmr_tiny
  python -m launch.aot --config configs/xlm_roberta.py:base --topology v5p:2x2x1 \\
      --global_batch 128 --seq 512

Variants: tiny (L2/H128, the CPU run on the default corpus with a trained 8k vocabulary),
base (L12/H768) and large (L24/H1024). The optimizer settings above tiny are RoBERTa's
(configs/roberta.py), not a reproduction of XLM-R's multilingual CC-100 run; start from
a released checkpoint with `init_from=DIR` (its tokenizer.json comes along).
"""
from configs import common
from encoders import xlm_roberta

VARIANTS = tuple(xlm_roberta.VARIANTS)


def get_config(arg="base"):
  a = common.parse_arg(arg, variant="base", init_from="")
  if a.variant not in VARIANTS:
    raise ValueError(f"unknown XLM-RoBERTa variant {a.variant!r}; choose from "
                     f"{list(VARIANTS)}")
  c = common.base_config()
  c.model = xlm_roberta.defaults(a.variant)
  c.init_from = a.init_from
  c.objective.name = "mlm"
  c.objective.max_predictions = -1  # auto: ceil(0.15 * seq_len), 77 at length 512
  c.data.packing = "documents"
  c.tokenizer.model_type = "unigram"
  if a.variant == "tiny":
    # the tiny BERT's recipe (configs/bert.py:tiny-mlm): a larger init and sin/cos
    # initialised (learned) positions so word order is used early on this small run
    common.tiny_recipe(c, steps=800, seq_len=64, global_batch=64, learning_rate=2e-3,
                       dropout=False)
    c.model.initializer_range = 0.06
    c.model.position_init = "sinusoidal"
    c.objective.mask_rate = 0.3
    c.objective.eval_mask_rate = 0.15
    return c.lock()
  c.model.attention_probs_dropout_prob = 0.0  # the TPU recipe: Splash has no probs dropout
  c.tokenizer.vocab_size = xlm_roberta.VOCAB_SIZE
  c.data.seq_len = 512
  c.data.global_batch = 8192
  c.optimizer.b2 = 0.98
  c.optimizer.learning_rate = 6e-4 if a.variant == "base" else 4e-4
  c.optimizer.warmup_steps = 24_000 if a.variant == "base" else 30_000
  c.optimizer.weight_decay = 0.01
  c.train.steps = 500_000
  c.train.log_every = 100
  c.train.eval_every = 10_000
  c.checkpoint.every = 5_000
  if a.variant == "large":
    c.model.scan_layers = True  # a shorter TPU compile, as configs/bert.py:large
  return c.lock()
