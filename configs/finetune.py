"""Fine-tuning: a task (encoders/tasks/<task>.py) on a pretrained HF directory.

  python -m launch.finetune --config configs/finetune.py:sequence \
      --config.init_from=DIR --workdir /tmp/ft \
      --config.finetune.train_file=train.csv [--config.finetune.eval_file=dev.csv]
  configs/finetune.py:token   CoNLL files;   configs/finetune.py:qa   SQuAD JSON
  configs/finetune.py:regression             a table with a numeric label column
  (the variant is finetune.task: any registered task, with its first data format)

The model section and the tokenizer come from `init_from` (as continued pretraining);
the training length is `finetune.epochs` epochs of the train rows (train.steps is set
from it); evaluation runs after every epoch, and the best epoch's weights are kept. Bad rows follow data.bad_data ("skip": counted in the
run summary; "error": stop, naming the file and line).
"""
from configs import common
from encoders import tasks


def get_config(arg="sequence"):
  a = common.parse_arg(arg, variant="sequence")
  task = tasks.get(a.variant)  # ValueError naming the registered tasks
  c = common.base_config()
  c.model.heads = ()
  c.model.dtype = "float32"
  c.objective.name = "finetune"
  f = c.finetune = common.ml_collections.ConfigDict()
  f.task = task.name  # sequence | regression | token | qa (encoders/tasks/)
  f.data_format = task.formats[0]  # table (csv/tsv/jsonl) | tfds | conll | squad
  f.encoding = "utf-8"  # of the input files (e.g. "latin-1", "utf-16")
  f.train_file = ""
  f.eval_file = ""  # empty: hold out eval_fraction of the train rows (seeded)
  f.eval_fraction = 0.2
  f.split_seed = 0
  f.text_column = "text"
  f.text_pair_column = ""
  f.label_column = "label"
  f.tfds_name = ""  # data_format=tfds, e.g. glue/sst2 (text_column=sentence)
  f.tfds_data_dir = ""  # may be gs://...
  f.tfds_train_split = "train"
  f.tfds_eval_split = ""
  # Label names (id order); empty: the distinct TRAINING labels (never the eval's), numbers
  # in numeric order (0, 1, ..., 10) then text. 1, "1", 1.0 and "1.0" are one class, "1".
  f.labels = ()
  # An eval row whose label (token task: a tag) is outside the label set: "error" (names
  # its file and line) | "skip" (the row is skipped and counted in the run summary).
  f.unknown_eval_labels = "error"
  f.num_labels = 2
  # The eval metric that picks the best epoch; "": the task's own (sequence: accuracy,
  # regression: pearson, token: entity_f1, qa: f1). Tagging without chunks (parts of
  # speech) reads better by "token_accuracy".
  f.selection_metric = ""
  f.epochs = 3
  f.stride = 64  # qa: context tokens shared by consecutive windows
  f.n_best = 20  # qa: candidate starts / ends per window
  f.max_answer_length = 30  # qa: tokens
  f.version_2 = False  # qa: allow "no answer" (SQuAD v2)
  f.null_threshold = 0.0  # qa v2: answer "" when null score - best span score > this
  f.max_train_rows = -1  # -1: all
  # Contrastive sentence embeddings (encoders/tasks/embedding.py, docs/embeddings.md).
  e = f.embedding = common.ml_collections.ConfigDict()
  e.anchor_column, e.positive_column = "anchor", "positive"
  e.negative_columns = ()  # hard-negative columns, e.g. ("negative",)
  e.query_prompt = ""  # prepended to anchors (queries)
  e.document_prompt = ""  # prepended to positives and negatives
  e.pooling = "mean"  # mean | cls | lasttoken | max
  e.scale = 20.0  # cosine similarity x scale (1 / temperature), as sentence-transformers
  e.symmetric = False  # also positive -> anchors (the mean of both directions)
  e.matryoshka_dims = ()  # e.g. (384, 256, 128, 64): the loss summed over truncations
  e.matryoshka_weights = ()  # one per dimension; empty: 1 each
  e.scored_pairs_file = ""  # sentence1, sentence2, score: Spearman after each epoch
  # Each batch cut to the smallest of these widths that holds its longest row (one
  # compiled step per width): "auto" = 16, 24, 32, 48, 64, 96, ... up to data.seq_len;
  # "off" = every batch at seq_len; or widths "32,64" (seq_len is always added).
  f.length_buckets = "auto"
  # True (sequence and token tasks): each training batch's global_batch examples are
  # packed several to a row of data.seq_len columns (segment ids keep them apart; the
  # same loss and gradients as unpacked), and the row count padded to a few sizes (one
  # compiled step each). Short texts then cost their own tokens, not a row's width.
  # Evaluation stays unpacked.
  f.packing = False
  # True: the architecture and tokenizer of init_from, its weights NOT loaded (a
  # from-scratch baseline for "what pretraining buys")
  f.random_init = False
  c.data.seq_len = 128
  c.data.global_batch = 32
  c.optimizer.learning_rate = 5e-5
  c.optimizer.weight_decay = 0.01
  c.optimizer.warmup_steps = 0
  c.optimizer.schedule = "linear"
  c.train.log_every = 20
  c.checkpoint.keep = 1
  # Checkpoints at every epoch end, on SIGTERM (with the place in the epoch: a restart
  # continues mid-epoch), and every this many steps mid-epoch (0: not mid-epoch).
  c.checkpoint.every = 0
  c.checkpoint.use_async = False
  c.logging.tensorboard = False
  return c.lock()
