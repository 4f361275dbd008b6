"""RoBERTa (Liu et al. 2019): MLM only (no NSP), full-sentence packing, one token type,
positions numbered past the padding index.

  python -m launch.pretrain --config configs/roberta.py:base --workdir /tmp/roberta
"""
from configs import common

VARIANTS = {"base": (12, 768, 12), "large": (24, 1024, 16)}


def get_config(arg="base"):
  a = common.parse_arg(arg, variant="base")
  if a.variant not in VARIANTS:
    raise ValueError(f"unknown RoBERTa variant {a.variant!r}; choose from {list(VARIANTS)}")
  c = common.base_config()
  layers, hidden, heads = VARIANTS[a.variant]
  c.model.family = "bert"
  c.model.variant = a.variant
  c.model.vocab_size = 50265
  c.model.num_hidden_layers = layers
  c.model.hidden_size = hidden
  c.model.num_attention_heads = heads
  c.model.intermediate_size = 4 * hidden
  c.model.max_position_embeddings = 514
  c.model.type_vocab_size = 1
  c.model.layer_norm_eps = 1e-5
  c.model.pad_token_id = 1
  c.model.position_style = "roberta"
  c.model.heads = ("mlm",)
  c.objective.name = "mlm"
  c.objective.max_predictions = -1  # auto: ceil(0.15 * seq_len), 77 at length 512
  c.data.packing = "documents"
  c.data.seq_len = 512
  c.data.global_batch = 8192
  c.tokenizer.vocab_size = 50265
  c.tokenizer.model_type = "bpe"
  c.optimizer.b2 = 0.98
  c.optimizer.learning_rate = 6e-4 if a.variant == "base" else 4e-4
  c.optimizer.warmup_steps = 24_000 if a.variant == "base" else 30_000
  c.optimizer.weight_decay = 0.01
  c.train.steps = 500_000
  c.train.log_every = 100
  c.train.eval_every = 10_000
  c.checkpoint.every = 5_000
  return c.lock()
