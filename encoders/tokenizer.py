"""A model directory's `tokenizers.Tokenizer`, as fine-tuning and the pipelines use it.

    tok = encoders.tokenizer.load_tokenizer(hf_dir)   # tokenizer.json, else vocab.txt
"""
import os
from typing import Optional

from tokenizers import BertWordPieceTokenizer, Tokenizer


def load_tokenizer(path: str, lowercase: Optional[bool] = None) -> Tokenizer:
  """A `tokenizers.Tokenizer` from tokenizer.json (a file or a directory holding one),
  else a WordPiece tokenizer from vocab.txt. Padding and truncation settings cleared."""
  if os.path.isdir(path):
    for name in ("tokenizer.json", "vocab.txt"):
      if os.path.isfile(os.path.join(path, name)):
        path = os.path.join(path, name)
        break
  if path.endswith(".json"):
    tok = Tokenizer.from_file(path)
  elif path.endswith(".txt"):
    tok = BertWordPieceTokenizer(path, lowercase=bool(lowercase))._tokenizer
  else:
    raise ValueError(f"no tokenizer.json or vocab.txt at {path}")
  tok.no_padding()
  tok.no_truncation()
  return tok
