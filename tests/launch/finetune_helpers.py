"""A tiny BERT HF directory with a WordPiece tokenizer, and small synthetic labelled
files for each fine-tuning task (learnable in a few epochs on the CPU)."""
import json
import os

import numpy as np

WORDS = ["good", "great", "fine", "bad", "awful", "poor", "the", "movie", "was", "a",
         "plot", "and", "acting", "really", "quite", "paris", "london", "john", "mary",
         "visited", "met", "in", "with", "who", "where", "did", "go", "?", "."]


def tiny_bert_dir(path, seed=0, max_position_embeddings=64, arch="BertModel", **config):
  """A random tiny BERT (`arch`, e.g. BertForSequenceClassification; `config` adds
  BertConfig fields such as id2label) + tokenizer.json (+ vocab.txt) in `path`."""
  import torch
  import transformers as T
  from tokenizers import BertWordPieceTokenizer
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + [f"##{c}" for c in "s"]
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "vocab.txt"), "w") as f:
    f.write("\n".join(vocab) + "\n")
  tok = BertWordPieceTokenizer(os.path.join(path, "vocab.txt"), lowercase=True)
  tok.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer",
               "model_max_length": max_position_embeddings}, f)
  torch.manual_seed(seed)
  cfg = T.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64,
                     max_position_embeddings=max_position_embeddings, **config)
  model = getattr(T, arch)(cfg).eval()
  with torch.no_grad():  # non-zero biases, so every tensor's mapping matters
    for name, p in model.named_parameters():
      if name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(path)
  return path


def sentiment_rows(n, seed=0):
  rng = np.random.default_rng(seed)
  pos, neg, filler = WORDS[:3], WORDS[3:6], WORDS[6:15]
  rows = []
  for _ in range(n):
    label = int(rng.integers(2))
    words = list(rng.choice(filler, 5)) + [rng.choice(pos if label else neg)]
    rng.shuffle(words)
    rows.append({"text": " ".join(words), "label": "pos" if label else "neg"})
  return rows


def write_jsonl(path, rows):
  with open(path, "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  return path


def ner_sentences(n, seed=0):
  rng = np.random.default_rng(seed)
  names, places = ["john", "mary"], ["paris", "london"]
  out = []
  for _ in range(n):
    who, where = rng.choice(names), rng.choice(places)
    words = [who, "visited", where, "with", "mary"] if rng.random() < 0.5 else \
            ["the", "movie", "in", where, "was", "good"]
    tags = ["B-PER" if w in names else "B-LOC" if w in places else "O" for w in words]
    out.append((words, tags))
  return out


def write_conll(path, sentences):
  with open(path, "w") as f:
    for words, tags in sentences:
      for w, t in zip(words, tags):
        f.write(f"{w} {t}\n")
      f.write("\n")
  return path


def squad_file(path, n, seed=0):
  rng = np.random.default_rng(seed)
  paras = []
  for i in range(n):
    who, where = rng.choice(["john", "mary"]), rng.choice(["paris", "london"])
    ctx = f"the movie was good . {who} visited {where} with a plot ."
    paras.append({"context": ctx, "qas": [{
        "id": str(i), "question": f"where did {who} go ?",
        "answers": [{"text": where, "answer_start": ctx.index(where)}]}]})
  with open(path, "w") as f:
    json.dump({"data": [{"title": "t", "paragraphs": paras}]}, f)
  return path
