"""DistilBERT (Sanh et al. 2019): the model, and knowledge distillation into it.

  # distil the README's main job (configs/bert.py:tiny-mlm in runs/bert_tiny) into 2 layers
  python -m launch.pretrain --config configs/distilbert.py:tiny \\
      --config.objective.teacher=runs/bert_tiny --workdir runs/distil_tiny
  # the same student from scratch with MLM only (the comparison)
  python -m launch.pretrain --config configs/distilbert.py:tiny_mlm --workdir runs/mlm_tiny
  # DistilBERT's recipe from a bert-base-uncased HF directory
  python -m launch.pretrain --config configs/distilbert.py:paper \\
      --config.objective.teacher=/path/to/bert-base-uncased --workdir gs://BUCKET/distilbert

Variants:
  tiny      distillation: student DistilBERT L2/H128, teacher the main job's BERT
            (configs/bert.py:tiny-mlm, L2/H128; its architecture and tokenizer come from
            `objective.teacher`, a finished work directory or an HF directory); the
            student takes the main job's data, batch, schedule, masking and init.
  tiny_mlm  the same student, same data and schedule, trained from scratch with MLM.
  base      DistilBERT-base (L6/H768, 66M) trained with MLM: the model that
            `launch.bench --compare-hf` measures against transformers' DistilBERT.
  paper     DistilBERT's recipe: teacher bert-base (set objective.teacher), student
            6 layers of width 768 initialised from teacher layers 0,2,4,7,9,11 (the
            authors' extraction script; "every_other" would take 0,2,...,10), loss
            5 KL(T=2) + 2 MLM + 1 cosine, dynamic masking, no NSP, batches of 4096
            sequences of up to 512 tokens (the paper's "up to 4K examples per batch"),
            Adam lr 5e-4 with 5% warmup, eps 1e-6, no weight decay, gradient clipping 5
            (the authors' training-script defaults). The paper states no step count; 25k
            steps of 4096 x 512 tokens is ~3 passes over a 16GB (~3.3B-token) corpus,
            the three epochs of the authors' script.

Objective settings (`objective.*`, see objectives/distill.py): teacher, teacher_model
(used only without a teacher directory: a random teacher, for aot/bench/tests),
temperature, alpha_ce, alpha_mlm, alpha_cos, alpha_mse, ce_positions (all | masked),
student_init (every_other | random | "0,2,4").
"""
import ml_collections

from configs import bert as bert_configs
from configs import common
from encoders import distilbert

VARIANTS = ("tiny", "tiny_mlm", "base", "paper")


def add_distillation(c, teacher_model):
  """The distillation objective's settings (DistilBERT's defaults)."""
  c.objective.name = "distill"
  c.objective.teacher = ""
  c.objective.teacher_model = ml_collections.ConfigDict(teacher_model.to_dict())
  c.objective.temperature = 2.0
  c.objective.alpha_ce = 5.0
  c.objective.alpha_mlm = 2.0
  c.objective.alpha_cos = 1.0
  c.objective.alpha_mse = 0.0
  c.objective.ce_positions = "all"
  c.objective.student_init = "every_other"
  return c


def get_config(arg="base"):
  a = common.parse_arg(arg, variant="base")
  if a.variant not in VARIANTS:
    raise ValueError(f"unknown DistilBERT variant {a.variant!r}; choose from {VARIANTS}")
  c = common.base_config()
  size = "tiny" if a.variant.startswith("tiny") else "base"
  c.model = distilbert.defaults(size)
  c.objective.name = "mlm"
  c.objective.max_predictions = -1  # auto: ceil(0.15 * seq_len)
  c.data.packing = "documents"  # no sentence pairs: DistilBERT drops NSP
  if size == "tiny":
    # The README's main job (configs/bert.py:tiny-mlm) is the teacher, and the student
    # takes its whole recipe: data, batch, schedule, masking (30% trained, 15% held out),
    # dropout 0 and the init that lets a width-128 model use positions (initializer_range
    # 0.06, sinusoidal-initialised learned positions; with BERT's 0.02 the student learns
    # a bag of words, docs/first_hour.md). Only the objective differs between the arms.
    teacher = bert_configs.get_config("tiny-mlm")
    c.tokenizer = ml_collections.ConfigDict(teacher.tokenizer.to_dict())
    for section in ("optimizer", "train", "checkpoint"):
      c[section] = ml_collections.ConfigDict(teacher[section].to_dict())
    c.data.seq_len = teacher.data.seq_len
    c.data.global_batch = teacher.data.global_batch
    for k in ("initializer_range", "position_init", "hidden_dropout_prob",
              "attention_probs_dropout_prob"):
      c.model[k] = teacher.model[k]
    c.objective.mask_rate = teacher.objective.mask_rate
    c.objective.eval_mask_rate = teacher.objective.eval_mask_rate
    if a.variant == "tiny":
      tm = teacher.model.unlock()
      tm.heads = ("mlm",)
      add_distillation(c, tm)
  else:  # BERT's TPU recipe (configs/bert.py): Splash has no attention-probs dropout
    c.model.attention_probs_dropout_prob = 0.0
    c.model.vocab_pad_multiple = 128
  if a.variant == "base":
    c.data.seq_len = 128
    c.data.global_batch = 256
    c.tokenizer.vocab_size = 30522
    c.optimizer.learning_rate = 1e-4
    c.optimizer.warmup_steps = 10_000
    c.train.steps = 1_000_000
    c.train.log_every = 100
    c.train.eval_every = 10_000
    c.checkpoint.every = 5_000
  elif a.variant == "paper":
    tm = bert_configs.get_config("base").model.unlock()
    tm.heads = ("mlm",)
    tm.vocab_size = 30522
    add_distillation(c, tm)
    c.objective.student_init = "0,2,4,7,9,11"
    c.tokenizer.vocab_size = 30522
    c.tokenizer.lowercase = True  # bert-base-uncased; the teacher's tokenizer replaces it
    c.data.seq_len = 512
    c.data.global_batch = 4096
    c.optimizer.learning_rate = 5e-4
    c.optimizer.eps = 1e-6
    c.optimizer.weight_decay = 0.0
    c.optimizer.clip_norm = 5.0
    c.train.steps = 25_000
    c.optimizer.warmup_steps = 1_250  # 5%
    c.train.log_every = 100
    c.train.eval_every = 2_500
    c.checkpoint.every = 1_000
  return c.lock()
