"""A model directory's `tokenizers.Tokenizer`, as fine-tuning and the pipelines use it.

    tok = encoders.tokenizer.load_tokenizer(hf_dir)   # tokenizer.json, else vocab.txt,
                                                      # else sentencepiece.bpe.model
"""
import os
from typing import Optional

from tokenizers import BertWordPieceTokenizer, Tokenizer

SPM_FILE = "sentencepiece.bpe.model"  # XLM-R's SentencePiece model in HF directories


def load_tokenizer(path: str, lowercase: Optional[bool] = None) -> Tokenizer:
  """A `tokenizers.Tokenizer` from tokenizer.json (a file or a directory holding one),
  else a WordPiece tokenizer from vocab.txt, else (a directory with XLM-R's SentencePiece
  file only) transformers' conversion of `sentencepiece.bpe.model`, with XLM-R's ids
  (<s> <pad> </s> <unk> first, <mask> last). Padding and truncation settings cleared."""
  if os.path.isdir(path):
    for name in ("tokenizer.json", "vocab.txt", SPM_FILE):
      if os.path.isfile(os.path.join(path, name)):
        path = os.path.join(path, name)
        break
  if os.path.basename(path) == SPM_FILE:
    # transformers, optional: it alone builds XLM-R's id layout over the pieces
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(os.path.dirname(path) or ".").backend_tokenizer
  elif path.endswith(".json"):
    tok = Tokenizer.from_file(path)
  elif path.endswith(".txt"):
    tok = BertWordPieceTokenizer(path, lowercase=bool(lowercase))._tokenizer
  else:
    raise ValueError(f"no tokenizer.json, vocab.txt or {SPM_FILE} at {path}")
  tok.no_padding()
  tok.no_truncation()
  return tok
