"""ModernBERT (Warner et al. 2024): MLM only, 30% masking, packed documents.

  python -m launch.pretrain --config configs/modernbert.py:tiny --workdir /tmp/mb_tiny
  python -m launch.pretrain --config configs/modernbert.py:base --workdir gs://B/mb_base
  python -m launch.pretrain \\
      --config configs/modernbert.py:base,phase=2,init_from=gs://B/mb_base/hf \\
      --workdir gs://B/mb_base_8k

Variants: tiny (4 layers, H128; the CPU run: global attention in layers 0 and 3, a 64-token
window in layers 1 and 2 at sequence length 128), base (22 layers, H768) and large (28
layers, H1024) with the paper's recipe (Section 2.2), as closely as this trainer allows:
- 30% masking (80/10/10), MLM only, sequence packing (documents never attend across);
- phase 1 at 1,024 tokens, then `phase=2` extends the context to 8,192 tokens (global
  rotary theta 160k, already the default) from the phase-1 export (`init_from`), at the
  paper's lower peak rate of 3e-4, with splash attention and the activation
  checkpointing of `remat=`: none (the default, which fits a v5p chip at 64 x 8,192),
  full, or between them dots_with_no_batch_dims_saveable (the layers' projection
  outputs kept, the rest recomputed) or dots_saveable; docs/modernbert.md has their
  memory and speed;
- optimizer: the paper's StableAdamW, `optimizer.name="stable_adamw"` (AdamW with
  AdaFactor-style update clipping per parameter tensor, Wortsman et al. 2023;
  launch/trainer/stable_adamw.py), in place of global gradient-norm clipping (off);
  b1 0.9, b2 0.98, eps 1e-6, weight decay 1e-5 (Warner et al.: 8e-4 base / 5e-4 large
  peak). tiny keeps plain AdamW (the CPU run its docs report);
- warmup-stable-decay (the paper's trapezoidal schedule): warmup, then constant, then a
  linear decay over the last `decay_fraction` of the steps (the paper decays 1-sqrt);
- batch: 4,096 rows of 1,024 tokens (~4.2M tokens; the paper warms the batch size up to
  4,608 x 1,024 for base), no batch-size warmup.
Steps: phase 1 ~1.7T tokens / 4.2M = 400k steps; phase 2 250B tokens / (512 x 8,192) ~ 60k.
The tokenizer is trained on the data (sentencepiece BPE, 50,368 entries) unless
`tokenizer.kind` points at the released one; the released ModernBERT uses OLMo's BPE.

Published ModernBERT-architecture sizes (HF model_type "modernbert"), with base's recipe
at each one's peak rate: mmbert-small and mmbert-base (mmBERT, arXiv 2509.06888: Gemma's
256,000-entry vocabulary, pad id 0, rotary theta 160k in global and local layers; the
numbers of JHU-CLSP/mmBERT's configs, peak rate ModernBERT-base's 8e-4) and ettin-17m ...
ettin-1b (Ettin, arXiv 2507.11412: ModernBERT's vocabulary; layers, widths and peak rates of
JHU-CLSP/ettin-encoder-vs-decoder's phase-1 configs, theta 160k global and local as in its
context-extension configs). docs/modernbert.md says what loads.
"""
from configs import common
from encoders import modernbert

# name -> layers, hidden, heads, MLP width, vocabulary, pad id, peak learning rate
PUBLISHED = {
    "mmbert-small": (22, 384, 6, 1152, 256_000, 0, 8e-4),
    "mmbert-base": (22, 768, 12, 1152, 256_000, 0, 8e-4),
    "ettin-17m": (7, 256, 4, 384, 50_368, 50_283, 3e-3),
    "ettin-32m": (10, 384, 6, 576, 50_368, 50_283, 3e-3),
    "ettin-68m": (19, 512, 8, 768, 50_368, 50_283, 3e-3),
    "ettin-150m": (22, 768, 12, 1152, 50_368, 50_283, 8e-4),
    "ettin-400m": (28, 1024, 16, 2624, 50_368, 50_283, 5e-4),
    "ettin-1b": (28, 1792, 28, 3840, 50_368, 50_283, 5e-4),
}
VARIANTS = tuple(modernbert.VARIANTS) + tuple(PUBLISHED)


def published_model(name):
  """The model section of a PUBLISHED size: ModernBERT-base's settings with its shape,
  vocabulary, pad id and rotary thetas."""
  n_layers, hidden, heads, ffn, vocab, pad, _ = PUBLISHED[name]
  m = modernbert.defaults("base")
  m.variant = name
  m.num_hidden_layers, m.hidden_size, m.num_attention_heads = n_layers, hidden, heads
  m.intermediate_size, m.vocab_size, m.pad_token_id = ffn, vocab, pad
  m.global_rope_theta = m.local_rope_theta = 160_000.0
  return m


def get_config(arg="base"):
  a = common.parse_arg(arg, variant="base", phase=1, init_from="", every_n=0,
                       mask_rate=0.3, remat="none")
  if a.variant not in VARIANTS:
    raise ValueError(f"unknown ModernBERT variant {a.variant!r}; choose from {list(VARIANTS)}")
  if a.phase not in (1, 2):
    raise ValueError(f"phase={a.phase}: 1 (1,024 tokens) or 2 (8,192-token extension)")
  c = common.base_config()
  published = a.variant in PUBLISHED
  c.model = published_model(a.variant) if published else modernbert.defaults(a.variant)
  if a.every_n:
    c.model.global_attn_every_n_layers = a.every_n
  c.objective.name = "mlm"
  c.objective.mask_rate = a.mask_rate
  c.objective.max_predictions = -1  # auto: ceil(mask_rate * seq_len)
  c.data.packing = "documents"
  if a.variant == "tiny":
    c.model.local_attention = 64  # so the window matters at 128 tokens
    common.tiny_recipe(c)
    c.optimizer.schedule = "wsd"
    c.optimizer.weight_decay = 1e-5
    return c.lock()
  c.tokenizer.model_type = "bpe"
  c.tokenizer.vocab_size = c.model.vocab_size
  c.optimizer.name = "stable_adamw"
  c.optimizer.b1, c.optimizer.b2, c.optimizer.eps = 0.9, 0.98, 1e-6
  c.optimizer.weight_decay = 1e-5
  c.optimizer.schedule = "wsd"
  c.optimizer.clip_norm = 0.0  # StableAdamW clips each tensor's update instead
  c.train.log_every = 100
  c.train.eval_every = 5_000
  c.checkpoint.every = 2_500
  if a.phase == 1:
    c.data.seq_len = 1024
    c.data.global_batch = 4096
    c.optimizer.learning_rate = (PUBLISHED[a.variant][-1] if published
                                 else 8e-4 if a.variant == "base" else 5e-4)
    c.optimizer.warmup_steps = 3_000
    c.optimizer.decay_fraction = 0.1
    c.train.steps = 400_000
  else:
    c.init_from = a.init_from
    c.data.seq_len = 8192
    c.data.global_batch = 512
    c.model.attention_impl = "splash"
    c.model.remat_policy = a.remat
    c.optimizer.learning_rate = 3e-4
    c.optimizer.warmup_steps = 500
    c.optimizer.decay_fraction = 0.2
    c.train.steps = 60_000
  return c.lock()
