"""Fine-tuning data: labelled files -> fixed-length numpy rows for encoders/tasks.py heads.

Readers (`finetune.data_format`):
  table   CSV / TSV / JSONL (by extension) with a text column, an optional text-pair
          column and a label column (names, or numbers for regression);
  conll   CoNLL-style token/tag files: one token per line, the token first and the tag
          last (whitespace separated), sentences separated by blank lines;
          -DOCSTART- lines are skipped;
  squad   SQuAD-format JSON (v1.1, or v2.0 with is_impossible / empty answers);
  tfds    a TFDS dataset (`tfds_name`, `tfds_data_dir` may be gs://): text, pair and
          label features by name (e.g. glue/sst2: sentence, label).
Splits: the given eval file / split, else a seeded held-out fraction of the train rows.

Encoders (a `tokenizers.Tokenizer`, the checkpoint's own):
  sequence  [CLS] text [SEP] (pair [SEP]) truncated to seq_len; label id or float;
  token     words pre-tokenized; the FIRST sub-token of each word carries its tag, the
            other sub-tokens, special tokens and padding -100; words cut off by the
            length limit are predicted "O" when scored;
  qa        question + context in windows of seq_len tokens that overlap by `stride`
            tokens of context; the answer's first and last token in a window that holds
            it whole, else 0 (the [CLS] position: "no answer here").
Rows are padded to seq_len with the model's pad id (on the right); `example_weight` is 1
for real rows. `batches` cuts each batch to a length bucket (`length_buckets`).
"""
import csv
import json
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

IGNORE = -100


# ---- tokenizer --------------------------------------------------------------------------

def load_tokenizer(path: str, lowercase: Optional[bool] = None):
  """A `tokenizers.Tokenizer` from tokenizer.json (a file or a directory holding one),
  else a WordPiece tokenizer from vocab.txt. Padding and truncation settings cleared."""
  from tokenizers import Tokenizer
  if os.path.isdir(path):
    for name in ("tokenizer.json", "vocab.txt"):
      if os.path.isfile(os.path.join(path, name)):
        path = os.path.join(path, name)
        break
  if path.endswith(".json"):
    tok = Tokenizer.from_file(path)
  elif path.endswith(".txt"):
    from tokenizers import BertWordPieceTokenizer
    tok = BertWordPieceTokenizer(path, lowercase=bool(lowercase))._tokenizer
  else:
    raise ValueError(f"no tokenizer.json or vocab.txt at {path}")
  tok.no_padding()
  tok.no_truncation()
  return tok


# ---- readers ----------------------------------------------------------------------------

def read_table(path: str, text: str = "text", pair: str = "", label: str = "label"
               ) -> List[Dict]:
  """Rows {"text", "pair"?, "label"} of a .csv / .tsv / .jsonl file."""
  ext = os.path.splitext(path.removesuffix(".bz2").removesuffix(".gz"))[1].lower()
  opener = open
  if path.endswith(".bz2"):
    import bz2
    opener = bz2.open
  elif path.endswith(".gz"):
    import gzip
    opener = gzip.open
  with opener(path, "rt", encoding="utf-8", newline="") as f:
    if ext in (".jsonl", ".json"):
      raw = [json.loads(line) for line in f if line.strip()]
    elif ext in (".csv", ".tsv"):
      raw = list(csv.DictReader(f, delimiter="\t" if ext == ".tsv" else ","))
    else:
      raise ValueError(f"{path}: unknown table format {ext!r}; use .csv, .tsv or .jsonl")
  rows = []
  for i, r in enumerate(raw):
    for col in (text, label) + ((pair,) if pair else ()):
      if col not in r:
        raise ValueError(f"{path}: row {i} has no column {col!r} (it has {sorted(r)})")
    row = {"text": str(r[text]), "label": r[label]}
    if pair:
      row["pair"] = str(r[pair])
    rows.append(row)
  return rows


def read_conll(path: str) -> List[Tuple[List[str], List[str]]]:
  """(words, tags) per sentence."""
  out, words, tags = [], [], []
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      parts = line.split()
      if not parts:
        if words:
          out.append((words, tags))
        words, tags = [], []
        continue
      if parts[0] == "-DOCSTART-":
        continue
      if len(parts) < 2:
        raise ValueError(f"{path}:{n}: expected 'token ... tag', got {line.strip()!r}")
      words.append(parts[0])
      tags.append(parts[-1])
  if words:
    out.append((words, tags))
  return out


def read_squad(path: str) -> List[Dict]:
  """Examples {"id", "question", "context", "answers": [{"text", "answer_start"}]}."""
  with open(path, encoding="utf-8") as f:
    data = json.load(f)
  out = []
  for article in data["data"]:
    for para in article["paragraphs"]:
      for qa in para["qas"]:
        answers = [] if qa.get("is_impossible") else list(qa.get("answers", []))
        for a in answers:
          if para["context"][a["answer_start"]:a["answer_start"] + len(a["text"])] != a["text"]:
            raise ValueError(f"{path}: question {qa['id']}: answer {a['text']!r} is not at "
                             f"answer_start {a['answer_start']}")
        out.append({"id": qa["id"], "question": qa["question"], "context": para["context"],
                    "answers": answers})
  return out


def read_tfds(name: str, split: str, data_dir: str = "", text: str = "sentence",
              pair: str = "", label: str = "label") -> List[Dict]:
  """Rows of a TFDS dataset (data_dir may be gs://). With TensorFlow installed, any
  prepared format (tfds.load); without it, datasets prepared as array_record
  (tfds.data_source, which needs no TensorFlow)."""
  import importlib.util
  import tensorflow_datasets as tfds
  if importlib.util.find_spec("tensorflow") is not None:
    examples = tfds.as_numpy(tfds.load(name, split=split, data_dir=data_dir or None))
  else:
    try:
      source = tfds.data_source(name, split=split, data_dir=data_dir or None)
    except NotImplementedError as e:  # e.g. a tfrecord-only dataset
      raise ValueError(f"TFDS dataset {name!r}: TensorFlow is not installed, and without "
                       f"it only array_record datasets can be read ({e})") from e
    examples = (source[i] for i in range(len(source)))
  rows = []
  for ex in examples:
    dec = lambda v: v.decode() if isinstance(v, bytes) else v
    row = {"text": dec(ex[text]), "label": dec(ex[label]).item() if hasattr(
        ex[label], "item") else dec(ex[label])}
    if pair:
      row["pair"] = dec(ex[pair])
    rows.append(row)
  return rows


def holdout(n: int, fraction: float, seed: int) -> Tuple[np.ndarray, np.ndarray]:
  """(train, eval) indices: a seeded random `fraction` of range(n) held out."""
  if not 0 < fraction < 1:
    raise ValueError(f"eval fraction must be in (0, 1), got {fraction}")
  perm = np.random.default_rng(seed).permutation(n)
  k = max(1, int(round(n * fraction)))
  return np.sort(perm[k:]), np.sort(perm[:k])


def label_names(values: Sequence, given: Sequence[str] = ()) -> Tuple[str, ...]:
  """The label vocabulary: `given`, else the sorted distinct values."""
  if given:
    return tuple(given)
  return tuple(sorted({str(v) for v in values}))


# ---- encoders -----------------------------------------------------------------------------

def _pad(seqs: Sequence[Sequence[int]], seq_len: int, value: int) -> np.ndarray:
  out = np.full((len(seqs), seq_len), value, np.int32)
  for i, s in enumerate(seqs):
    out[i, :len(s)] = s[:seq_len]
  return out


def encode_sequence(tok, rows: Sequence[Dict], seq_len: int, pad_id: int,
                    labels: Sequence[str] = (), regression: bool = False) -> Dict:
  tok.enable_truncation(max_length=seq_len)
  inputs = [(r["text"], r["pair"]) if "pair" in r else r["text"] for r in rows]
  encs = tok.encode_batch(inputs)
  tok.no_truncation()
  index = {name: i for i, name in enumerate(labels)}
  if regression:
    y = np.asarray([float(r["label"]) for r in rows], np.float32)
  else:
    unknown = sorted({str(r["label"]) for r in rows} - set(index))
    if unknown:
      raise ValueError(f"labels {unknown[:5]} are not among the model's labels {list(labels)}")
    y = np.asarray([index[str(r["label"])] for r in rows], np.int32)
  return {"input_ids": _pad([e.ids for e in encs], seq_len, pad_id),
          "attention_mask": _pad([e.attention_mask for e in encs], seq_len, 0),
          "token_type_ids": _pad([e.type_ids for e in encs], seq_len, 0),
          "labels": y, "example_weight": np.ones(len(rows), np.float32)}


def encode_tokens(tok, sentences: Sequence[Tuple[List[str], List[str]]], seq_len: int,
                  pad_id: int, labels: Sequence[str]) -> Tuple[Dict, List[List[int]]]:
  """-> (arrays, per sentence the row position of each word's first sub-token, -1 for
  words cut off by the length limit)."""
  index = {name: i for i, name in enumerate(labels)}
  tok.enable_truncation(max_length=seq_len)
  encs = tok.encode_batch([list(w) for w, _ in sentences], is_pretokenized=True)
  tok.no_truncation()
  y = np.full((len(sentences), seq_len), IGNORE, np.int32)
  firsts = []
  for i, (enc, (words, tags)) in enumerate(zip(encs, sentences)):
    first = [-1] * len(words)
    for pos, w in enumerate(enc.word_ids):
      if w is not None and first[w] < 0:
        first[w] = pos
        if tags[w] not in index:
          raise ValueError(f"tag {tags[w]!r} is not among the labels {list(labels)}")
        y[i, pos] = index[tags[w]]
    firsts.append(first)
  arrays = {"input_ids": _pad([e.ids for e in encs], seq_len, pad_id),
            "attention_mask": _pad([e.attention_mask for e in encs], seq_len, 0),
            "token_type_ids": _pad([e.type_ids for e in encs], seq_len, 0),
            "labels": y, "example_weight": np.ones(len(sentences), np.float32)}
  return arrays, firsts


def encode_qa(tok, examples: Sequence[Dict], seq_len: int, pad_id: int, stride: int = 128
              ) -> Tuple[Dict, List[Dict]]:
  """-> (arrays, one meta dict per window: example index, token char offsets, and which
  positions are context)."""
  if stride >= seq_len // 2:
    raise ValueError(f"stride {stride} must be below half of seq_len {seq_len}")
  tok.enable_truncation(max_length=seq_len, stride=stride, strategy="only_second")
  rows, meta = {"input_ids": [], "attention_mask": [], "token_type_ids": [],
                "start_positions": [], "end_positions": []}, []
  for ei, ex in enumerate(examples):
    enc = tok.encode(ex["question"], ex["context"])
    for w in [enc] + list(enc.overflowing):
      seq = w.sequence_ids
      ctx = [j for j, s in enumerate(seq) if s == 1]
      start = end = 0
      if ex["answers"] and ctx:
        a = ex["answers"][0]
        s_char, e_char = a["answer_start"], a["answer_start"] + len(a["text"])
        lo, hi = w.offsets[ctx[0]][0], w.offsets[ctx[-1]][1]
        if lo <= s_char and e_char <= hi:
          start = next(j for j in ctx if w.offsets[j][1] > s_char)
          end = max(j for j in ctx if w.offsets[j][0] < e_char)
      for k, v in (("input_ids", w.ids), ("attention_mask", w.attention_mask),
                   ("token_type_ids", w.type_ids)):
        rows[k].append(v)
      rows["start_positions"].append(start)
      rows["end_positions"].append(end)
      meta.append({"example": ei, "offsets": list(w.offsets),
                   "context": [s == 1 for s in seq]})
  tok.no_truncation()
  arrays = {k: _pad(rows[k], seq_len, pad_id if k == "input_ids" else 0)
            for k in ("input_ids", "attention_mask", "token_type_ids")}
  arrays["start_positions"] = np.asarray(rows["start_positions"], np.int32)
  arrays["end_positions"] = np.asarray(rows["end_positions"], np.int32)
  arrays["example_weight"] = np.ones(len(meta), np.float32)
  return arrays, meta


def best_spans(start_logits, end_logits, meta: Dict, context: str, n_best: int = 20,
               max_answer_length: int = 30) -> Tuple[List[Dict], float]:
  """The n-best answer spans of one window (text, char start/end, score = start + end
  logit), best first, and its no-answer score (start + end logit at position 0)."""
  ctx = np.asarray(meta["context"] + [False] * (len(start_logits) - len(meta["context"])))
  s_idx = np.argsort(start_logits)[::-1][:n_best]
  e_idx = np.argsort(end_logits)[::-1][:n_best]
  spans = []
  for s in s_idx:
    for e in e_idx:
      if not (ctx[s] and ctx[e]) or e < s or e - s + 1 > max_answer_length:
        continue
      a, b = meta["offsets"][s][0], meta["offsets"][e][1]
      spans.append({"text": context[a:b], "start": int(a), "end": int(b),
                    "score": float(start_logits[s] + end_logits[e])})
  spans.sort(key=lambda x: -x["score"])
  return spans[:n_best], float(start_logits[0] + end_logits[0])


def length_buckets(spec, seq_len: int) -> Tuple[int, ...]:
  """The row widths batches are trimmed to (`finetune.length_buckets`), ascending, the
  last = seq_len: "auto" (16, 24, 32, 48, 64, 96, ... below seq_len, then seq_len), "off" (seq_len
  only: every batch full width), or comma-separated widths ("32,64"; seq_len is added)."""
  spec = str(spec).strip().lower()
  if spec == "off":
    return (seq_len,)
  if spec == "auto":  # 16, 24, 32, 48, 64, 96, ...: at most a third of a batch is padding
    widths, w = [], 16
    while w < seq_len:
      widths.append(w)
      if w + w // 2 < seq_len:
        widths.append(w + w // 2)
      w *= 2
    return tuple(widths) + (seq_len,)
  try:
    widths = sorted({int(x) for x in spec.split(",") if x.strip()})
  except ValueError:
    raise ValueError(f"finetune.length_buckets={spec!r}: use 'auto', 'off' or widths "
                     "like '32,64,128'") from None
  if any(w < 1 or w > seq_len for w in widths):
    raise ValueError(f"finetune.length_buckets={spec!r}: every width must be in "
                     f"[1, seq_len={seq_len}]")
  return tuple(w for w in widths if w < seq_len) + (seq_len,)


def trim_to_bucket(batch: Dict[str, np.ndarray], buckets: Sequence[int]) -> Dict:
  """The batch's (rows, seq_len) arrays cut to the smallest bucket that holds every
  column any row attends to, so only padding columns (attention_mask 0 in every row)
  go."""
  mask = batch["attention_mask"]
  seq_len = mask.shape[1]
  longest = int(mask.any(0).nonzero()[0].max()) + 1 if mask.any() else 1
  width = next(w for w in buckets if w >= longest)
  if width >= seq_len:
    return batch
  return {k: (v[:, :width] if v.ndim == 2 and v.shape[1] == seq_len else v)
          for k, v in batch.items()}


def row_buckets(batch_size: int, unit: int = 1) -> Tuple[int, ...]:
  """The row counts packed batches are padded to: multiples of `unit` (what the batch
  must split into: data-parallel shards x micro-batches), k * unit for k = 1, 2, ..., 8,
  then 10, 12, 14, 16, 20, 24, 28, 32, 40, ... (at most a quarter more than needed), up
  to `batch_size` rounded up to `unit` (one example per row: the most a batch can need)."""
  top = -(-batch_size // unit) * unit
  counts, k = [], 1
  while k * unit < top:
    counts.append(k * unit)
    k += max(1, 2 ** (k.bit_length() - 1) // 4)
  return tuple(counts) + (top,)


def pack_rows(batch: Dict[str, np.ndarray], task: str, rows: Sequence[int],
              pad_id: int = 0, seen: Optional[set] = None) -> Dict[str, np.ndarray]:
  """One batch of examples (rows padded on the right, `example_weight` 0 on filler rows)
  -> the same examples packed several to a row of the batch's width, first-fit by
  decreasing length (`finetune.packing`).

  Each example keeps its tokens, token types and labels; `segment_ids` numbers the
  examples of a row 1, 2, ... (0 = padding), so the encoder attends within an example
  only and restarts its positions there. Labels become per token: `labels` (rows, width)
  with IGNORE where nothing is scored (a sequence example's label sits on its first
  token) and `label_weight` (rows, width) 1 where a label is scored. Filler examples
  (weight 0) are dropped; the row count is padded up to the first of `rows` (ascending)
  that holds them, with empty rows (segment 0, weight 0). `seen` (a set the caller keeps
  across batches: the row counts already used, i.e. compiled): a batch with filler rows
  (an epoch's last, short batch) takes the smallest count already compiled that holds it
  instead, as one padded step costs less than a compile."""
  if task not in ("sequence", "token"):
    raise ValueError(f"packing supports the sequence and token tasks, not {task!r}")
  mask = np.asarray(batch["attention_mask"])
  width = mask.shape[1]
  lengths = mask.sum(1).astype(np.int64)
  if (mask.cumsum(1) != np.minimum(np.arange(1, width + 1)[None], lengths[:, None])).any():
    raise ValueError("packing needs right-padded rows (attention_mask 1...1 0...0)")
  keep = [i for i in np.argsort(-lengths, kind="stable") if batch["example_weight"][i] > 0]
  if lengths[keep].max(initial=0) > width:
    raise ValueError(f"an example of {lengths[keep].max()} tokens does not fit a packed "
                     f"row of {width}")
  fill, placed = [], []  # per row: used columns; per example: (row, start column)
  for i in keep:
    r = next((j for j, used in enumerate(fill) if used + lengths[i] <= width), len(fill))
    if r == len(fill):
      fill.append(0)
    placed.append((i, r, fill[r]))
    fill[r] += int(lengths[i])
  fits = [r for r in rows if r >= len(fill)]
  if not fits:
    raise ValueError(f"{len(fill)} packed rows exceed the largest row count {rows[-1]}")
  n_rows = fits[0]
  if seen is not None:
    if len(keep) < len(lengths):  # a short batch: reuse a compiled count if one fits
      n_rows = min((r for r in seen if r >= len(fill)), default=n_rows)
    seen.add(n_rows)
  regression = task == "sequence" and np.issubdtype(batch["labels"].dtype, np.floating)
  out = {"input_ids": np.full((n_rows, width), pad_id, np.int32),
         "attention_mask": np.zeros((n_rows, width), np.int32),
         "token_type_ids": np.zeros((n_rows, width), np.int32),
         "segment_ids": np.zeros((n_rows, width), np.int32),
         "labels": np.full((n_rows, width), 0.0 if regression else IGNORE,
                           np.float32 if regression else np.int32),
         "label_weight": np.zeros((n_rows, width), np.float32)}
  segment = np.zeros(n_rows, np.int32)
  for i, r, start in placed:
    n, cols = int(lengths[i]), slice(start, start + int(lengths[i]))
    segment[r] += 1
    out["input_ids"][r, cols] = batch["input_ids"][i, :n]
    out["attention_mask"][r, cols] = 1
    out["token_type_ids"][r, cols] = batch["token_type_ids"][i, :n]
    out["segment_ids"][r, cols] = segment[r]
    if task == "sequence":
      out["labels"][r, start] = batch["labels"][i]
      out["label_weight"][r, start] = 1.0
    else:
      out["labels"][r, cols] = batch["labels"][i, :n]
      out["label_weight"][r, cols] = (batch["labels"][i, :n] != IGNORE)
  return out


def batches(arrays: Dict[str, np.ndarray], batch_size: int, seed: Optional[int] = None,
            buckets: Optional[Sequence[int]] = None, pack: Optional[Dict] = None):
  """Batches of `batch_size` rows (shuffled by `seed` when given); the last is padded
  with copies of row 0 at example_weight 0, so every batch has `batch_size` rows. With
  `buckets` (length_buckets), each batch's sequence arrays are cut to the smallest
  width that holds its longest row: a few shapes (one compiled step each) instead of
  computing every row at full seq_len. With `pack` (pack_rows' task, rows, pad_id,
  seen), each batch's `batch_size` examples are packed into rows of the arrays' width
  instead (no cut: the rows are full, their count adapts)."""
  n = len(arrays["example_weight"])
  order = np.arange(n) if seed is None else np.random.default_rng(seed).permutation(n)
  for lo in range(0, n, batch_size):
    idx = order[lo:lo + batch_size]
    fill = batch_size - len(idx)
    take = np.concatenate([idx, np.zeros(fill, np.int64)]) if fill else idx
    b = {k: v[take] for k, v in arrays.items()}
    if fill:
      b["example_weight"] = b["example_weight"].copy()
      b["example_weight"][len(idx):] = 0.0
    if pack is not None:  # rows filled to the width: the row count adapts instead
      yield pack_rows(b, **pack)
    else:
      yield trim_to_bucket(b, buckets) if buckets else b
