"""Defaults shared by every family's config: one place for each section.

Family files (`configs/<family>.py`) call `base_config()` and override what differs; their
`tiny` variants share `tiny_recipe`, the CPU-scale run.
Sections: model, objective, data, tokenizer, optimizer, train, mesh, checkpoint, logging.
"""
import ml_collections

import encoders
# Logical axis name -> mesh axis (or None = replicated): the table lives in encoders/
# (encoders/sharding_rules.py), so that encoders.from_hf(..., mesh=) can use it too.
from encoders.sharding_rules import DEFAULT_RULES


def parse_arg(arg, **defaults):
  """Parses `variant,key=value,...` (big_vision style) into a ConfigDict."""
  out = ml_collections.ConfigDict(defaults)
  if not arg:
    return out
  for i, part in enumerate(arg.split(",")):
    if "=" not in part:
      if i == 0 and "variant" in defaults:
        out.variant = part
        continue
      raise ValueError(f"config arg piece {part!r} is not key=value")
    key, value = part.split("=", 1)
    if key not in out:
      raise ValueError(f"unknown config arg {key!r}; known: {sorted(out.keys())}")
    kind = type(out[key])
    out[key] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
  return out


def model_defaults(family="bert"):
  """The model section: the family's own defaults (they live with the family in
  encoders/), named as in Hugging Face configs where they exist."""
  return encoders.family_defaults(family)


def tiny_recipe(c, *, steps=1000, eval_every=0, seq_len=128, global_batch=32,
                learning_rate=1e-3, dropout=True):
  """The CPU-scale run of a family's `tiny` variant, in config `c`: a trained 8k
  vocabulary, 100 warmup steps, a log line every 50 steps, a checkpoint halfway and at
  the end, a held-out evaluation every `eval_every` steps (0: a quarter of the run).
  `dropout=False` turns dropout off (a short run only slows down with it)."""
  c.tokenizer.vocab_size = 8000
  c.data.seq_len = seq_len
  c.data.global_batch = global_batch
  c.optimizer.learning_rate = learning_rate
  c.optimizer.warmup_steps = 100
  c.train.steps = steps
  c.train.log_every = 50
  c.train.eval_every = eval_every or steps // 4
  c.checkpoint.every = steps // 2
  if not dropout:
    c.model.hidden_dropout_prob = 0.0
    c.model.attention_probs_dropout_prob = 0.0
  return c


def base_config():
  c = ml_collections.ConfigDict()
  c.model = model_defaults()

  # Continued pretraining: an HF directory (config.json + weights + tokenizer) to start
  # from. The model section comes from it (keeping dtype, attention_impl, remat_policy,
  # scan_layers, vocab_pad_multiple and heads from here), its weights are loaded after
  # init (heads it lacks start fresh), and its tokenizer replaces the tokenizer section.
  c.init_from = ""

  c.objective = ml_collections.ConfigDict()
  # mlm | mlm_nsp (BERT; data.packing=pairs, data.pair_task=nsp) | mlm_sop (ALBERT;
  # data.packing=pairs, data.pair_task=sop)
  c.objective.name = "mlm"
  c.objective.mask_rate = 0.15
  # The rate held-out batches are masked at (eval step and baselines); 0 = mask_rate. A
  # recipe that trains at a higher rate can still be scored at BERT's 15%.
  c.objective.eval_mask_rate = 0.0
  c.objective.mask_token_prob = 0.8  # of the selected tokens: 80% [MASK]
  c.objective.random_token_prob = 0.1  # 10% random token, the rest unchanged
  c.objective.whole_word = False
  c.objective.nsp_prob = 0.5  # probability the second segment is a random one
  # The MLM head's positions per row (BERT's max_predictions_per_seq): -1 = auto,
  # ceil(mask_rate * seq_len) (20 at 128 and 15%), follows seq_len; >0 = an explicit cap
  # (an error if below ceil(mask_rate * seq_len)); 0 = the head runs on every position.
  c.objective.max_predictions = -1

  c.data = ml_collections.ConfigDict()
  c.data.source = "default"  # default | text | tfds | arrayrecord
  c.data.files = ""  # glob(s), comma separated, for source=text
  c.data.text_document = "blank_line"  # source=text: blank_line (BERT format) | file
  c.data.tfds_name = ""
  c.data.tfds_data_dir = ""  # may be gs://... on Cloud TPU
  c.data.train_split = "train"
  # empty: hold out eval_fraction of the documents (source=default: whole packages, and
  # no held-out paragraph shares a 13-word span with training)
  c.data.eval_split = ""
  c.data.eval_fraction = 0.02
  c.data.text_key = "text"
  c.data.seq_len = 128
  c.data.global_batch = 32
  # documents (rows packed, docs never attend across) | pairs ([CLS] A [SEP] B [SEP])
  c.data.packing = "documents"
  # packing=pairs: nsp (B random with prob objective.nsp_prob; next_sentence_label) |
  # sop (A, B consecutive, swapped with prob 0.5; sentence_order_label)
  c.data.pair_task = "nsp"
  c.data.shuffle_seed = 0
  c.data.num_epochs = -1  # -1: repeat forever
  c.data.worker_count = 0
  c.data.max_documents = -1
  # source=arrayrecord: the --out directory of `python -m launch.preprocess` (local or
  # gs:// through a gcsfuse mount); shards are read as written, nothing is tokenized.
  c.data.path = ""
  # Bad input (non-UTF-8 bytes, empty or over-long documents, corrupt shards or records):
  # skip | error. skip drops it with a counted warning; error stops, naming file and offset.
  c.data.bad_data = "skip"
  c.data.max_document_bytes = 8_000_000  # longer documents (e.g. one 50 MB line) are bad
  # A file (or record) whose decoded text has a smaller fraction of printable characters
  # is binary, hence bad (launch/data/badinput.py).
  c.data.min_printable_ratio = 0.9

  c.tokenizer = ml_collections.ConfigDict()
  c.tokenizer.kind = "sentencepiece_train"  # sentencepiece_train | sentencepiece | hf
  c.tokenizer.path = ""  # .model for sentencepiece; tokenizer.json / vocab.txt for hf
  c.tokenizer.vocab_size = 8000
  c.tokenizer.model_type = "unigram"  # unigram | bpe (sentencepiece_train only)
  c.tokenizer.lowercase = False
  c.tokenizer.train_sentences = 200_000

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = "adamw"  # adamw | lamb | stable_adamw
  c.optimizer.learning_rate = 1e-4
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-6
  c.optimizer.weight_decay = 0.01
  c.optimizer.schedule = "linear"  # linear | cosine | wsd | constant
  c.optimizer.warmup_steps = 100
  c.optimizer.decay_fraction = 0.1  # wsd: fraction of steps spent decaying
  c.optimizer.clip_norm = 1.0  # 0 disables
  c.optimizer.grad_accum_steps = 1

  c.train = ml_collections.ConfigDict()
  c.train.steps = 1000
  c.train.seed = 0
  c.train.log_every = 50
  c.train.eval_every = 500
  c.train.eval_batches = 8
  # A NaN/inf loss or gradient norm, or a gradient-norm spike (launch/trainer/guard.py):
  # stop (the update is not applied; the run stops with an error before the next
  # checkpoint) | skip (not applied, counted in skipped_nonfinite / skipped_spike) | off
  c.train.nonfinite_policy = "stop"
  c.train.grad_spike_factor = 0.0  # > 1: a norm above factor x its running mean is a spike
  c.train.grad_spike_warmup = 100  # accepted steps before spikes are looked for
  # nonfinite_policy=skip stops the run (an error, non-zero exit) after this many skipped
  # updates in a row: a healthy run skips rarely and never for long; 10 in a row means it
  # has diverged (or its input is bad), and going on only burns the job's time.
  c.train.max_consecutive_skips = 10
  # ... and at the end refuses to export a run that skipped more than this fraction of its
  # steps (a run that skipped 9 of 10 updates must not look finished). 1.0: no limit.
  c.train.max_skipped_fraction = 0.25
  # A resume checks the work directory's run_fingerprint.json (launch/trainer/
  # fingerprint.py: the model, tokenizer, data, objective and optimizer.name settings)
  # and refuses other settings, listing them. Comma-separated keys (or whole sections,
  # e.g. 'objective') that may differ on purpose: 'objective.mask_rate,data.files'.
  # A longer train.steps never needs it.
  c.train.allow_config_change = ""
  # JAX's persistent compilation cache: a restarted run reads its compiled programs back
  # instead of compiling again ("" off; launch/trainer/compile_cache.py).
  c.train.compilation_cache_dir = "{workdir}/compilation_cache"
  # TPU only: the on-chip vector memory (KiB) the compiler may give one op's tiles
  # (libtpu's xla_tpu_scoped_vmem_limit_kib; 0 = the compiler's own default; ignored off
  # TPU). MaxText's value for dense models: it lets the compiler tile BERT-base's matmuls
  # whole, at the cost of longer compiles (docs/benchmarks.md).
  c.train.tpu_scoped_vmem_kib = 98304

  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (-1, 1, 1)  # (data, fsdp, tensor); -1 takes the remaining devices
  c.mesh.rules = DEFAULT_RULES
  # ZeRO-style (Rajbhandari et al. 2020): the params' float32 master copy and their
  # optimizer state split over the data axis, gathered as the model reads them; the same
  # values as replicated, 1/data of the state on each replica (launch/trainer/sharding.py,
  # docs/benchmarks.md).
  c.mesh.shard_state_over_data = True

  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 500
  c.checkpoint.keep = 2
  c.checkpoint.use_async = True

  c.logging = ml_collections.ConfigDict()
  c.logging.tensorboard = True
  c.logging.plot = True
  return c
