"""ALBERT (Lan et al. 2020): MLM + sentence-order prediction (SOP), factorized embeddings,
all layers sharing one parameter group.

  python -m launch.pretrain --config configs/albert.py:tiny --workdir /tmp/albert_tiny
  python -m launch.pretrain --config configs/albert.py:base --workdir gs://BUCKET/albert_base

Variants: tiny (4 layer applications of one shared layer, H128, E64; the CPU run), and the
paper's base, large, xlarge and xxlarge (Table 1), which use the paper's recipe unchanged
(Section 4.1): LAMB, batch 4096, learning rate 0.00176, 125k steps, sequence length 512,
sentencepiece vocabulary of 30k, SOP pairs (two consecutive segments of one document,
swapped half the time). Differences from the paper, on purpose: masked positions per row
follow seq_len (77 at 512, the 15% the paper states; its released data used 20) and
masking is per token (the paper's n-gram masking up to 3 is not implemented here).
"""
from configs import common
from encoders import albert

VARIANTS = tuple(albert.VARIANTS)


def get_config(arg="base"):
  a = common.parse_arg(arg, variant="base")
  if a.variant not in VARIANTS:
    raise ValueError(f"unknown ALBERT variant {a.variant!r}; choose from {list(VARIANTS)}")
  c = common.base_config()
  c.model = albert.defaults(a.variant)
  c.objective.name = "mlm_sop"
  c.objective.max_predictions = -1  # auto: ceil(0.15 * seq_len)
  c.data.packing = "pairs"
  c.data.pair_task = "sop"
  c.tokenizer.lowercase = True  # the released ALBERT vocabularies are uncased
  if a.variant == "tiny":
    c.model.num_hidden_layers = 4
    common.tiny_recipe(c)
  else:
    c.data.seq_len = 512
    c.data.global_batch = 4096
    c.tokenizer.vocab_size = 30000
    c.optimizer.name = "lamb"
    c.optimizer.learning_rate = 0.00176
    c.optimizer.warmup_steps = 3125
    c.optimizer.weight_decay = 0.01
    c.train.steps = 125_000
    c.train.log_every = 100
    c.train.eval_every = 5_000
    c.checkpoint.every = 2_500
  return c.lock()
