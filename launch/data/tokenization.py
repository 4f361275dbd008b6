"""Tokenizers behind one interface: sentencepiece (trained here or loaded) and Hugging Face.

`make_tokenizer(config.tokenizer, workdir, documents_fn)` picks the kind:

- `sentencepiece_train`: trains a sentencepiece model on the training documents, with the
  specials [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4, and stores it in
  `<workdir>/tokenizer/spm.model` (settings in `spm.json`) so that a resumed run reuses
  the same file. With several JAX processes, process 0 trains and broadcasts the model.
- `sentencepiece`: loads `tokenizer.path` (a `.model` file).
- `hf`: loads `tokenizer.path` through the `tokenizers` library: a `tokenizer.json`, a
  BERT WordPiece `vocab.txt`, or a directory holding one of them.

Every tokenizer encodes without adding special tokens; the data pipeline adds them.
"""
from __future__ import annotations

import abc
import hashlib
import io
import json
import logging
import os
from typing import Callable, Iterable, Sequence

import jax
import numpy as np
import sentencepiece as spm
from etils import epath
from jax.experimental import multihost_utils
from sentencepiece import sentencepiece_model_pb2
from tokenizers import (AddedToken, Regex, Tokenizer as HfTok, decoders, models, normalizers,
                        pre_tokenizers, processors)

KINDS = ("sentencepiece_train", "sentencepiece", "hf")
SPM_MODEL_TYPES = ("unigram", "bpe", "char", "word")
SP_WORD_MARK = "\u2581"  # '▁'
BYTE_LEVEL_WORD_MARK = "\u0120"  # 'Ġ'

# Candidate spellings of each special token, BERT style first, then RoBERTa/ALBERT style.
SPECIAL_CANDIDATES = {
    "cls": ("[CLS]", "<s>", "<cls>"),
    "sep": ("[SEP]", "</s>", "<sep>"),
    "pad": ("[PAD]", "<pad>"),
    "mask": ("[MASK]", "<mask>"),
    "unk": ("[UNK]", "<unk>"),
}
log = logging.getLogger(__name__)
BERT_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class Tokenizer(abc.ABC):
  """A tokenizer with the special ids and word-start table the pipeline needs.

  Attributes:
    kind: which kind of tokenizer this is (one of `KINDS`, "sentencepiece" when loaded).
    vocab_size: number of ids; every id is in [0, vocab_size).
    cls_id, sep_id, pad_id, mask_id, unk_id: ids of the special tokens.
    word_start: bool (vocab_size,): True where a token begins a new word (specials too).
    special: bool (vocab_size,): True for control / special tokens.
  """

  kind: str
  vocab_size: int
  cls_id: int
  sep_id: int
  pad_id: int
  mask_id: int
  unk_id: int
  word_start: np.ndarray
  special: np.ndarray

  def _resolve_specials(self, lookup: Callable[[str], int | None], where: str) -> None:
    for name, candidates in SPECIAL_CANDIDATES.items():
      found = None
      for piece in candidates:
        found = lookup(piece)
        if found is not None:
          break
      if found is None:
        raise ValueError(
            f"{where}: no {name} token in the vocabulary (looked for {', '.join(candidates)})")
      setattr(self, f"{name}_id", int(found))

  @property
  def special_ids(self) -> tuple[int, ...]:
    return (self.cls_id, self.sep_id, self.pad_id, self.mask_id, self.unk_id)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, no special tokens added."""
    return self.encode_batch([text])[0]

  @abc.abstractmethod
  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, no special tokens added (parallel where the backend is)."""

  def _prep(self, text: str) -> str:
    """Lower-cases when the tokenizer is uncased (subclasses set `_lowercase`)."""
    return text.lower() if getattr(self, "_lowercase", False) else text

  @abc.abstractmethod
  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids`; padding ids are dropped."""

  @abc.abstractmethod
  def id_to_token(self, index: int) -> str:
    """The vocabulary entry of one id."""

  @abc.abstractmethod
  def fingerprint(self) -> str:
    """A hash that changes whenever the token ids of some text may change."""

  @abc.abstractmethod
  def save(self, directory: str) -> None:
    """Writes the tokenizer's files (for `AutoTokenizer.from_pretrained` where possible)."""

  def __repr__(self):
    return (f"{type(self).__name__}(kind={self.kind!r}, vocab_size={self.vocab_size}, "
            f"cls={self.cls_id}, sep={self.sep_id}, pad={self.pad_id}, "
            f"mask={self.mask_id}, unk={self.unk_id})")


class SentencePieceTokenizer(Tokenizer):
  """A sentencepiece model; word starts are pieces beginning with '▁'."""

  def __init__(self, model_proto: bytes, lowercase: bool = False,
               kind: str = "sentencepiece", where: str = "sentencepiece model"):
    self.kind = kind
    self._proto = bytes(model_proto)
    self._lowercase = bool(lowercase)
    self._sp = spm.SentencePieceProcessor()
    try:
      self._sp.LoadFromSerializedProto(self._proto)
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(f"{where} is not a valid sentencepiece model: {e}") from e
    self.vocab_size = int(self._sp.GetPieceSize())
    pieces = [self._sp.IdToPiece(i) for i in range(self.vocab_size)]
    index = {p: i for i, p in enumerate(pieces)}
    self._resolve_specials(index.get, where)
    special = np.array([self._sp.IsControl(i) or self._sp.IsUnknown(i) for i in
                        range(self.vocab_size)], dtype=bool)
    special[list(self.special_ids)] = True
    self.special = special
    self.word_start = np.array([p.startswith(SP_WORD_MARK) for p in pieces], bool) | special

  @property
  def model_proto(self) -> bytes:
    return self._proto

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    texts = [self._prep(t) for t in texts]
    if not texts:
      return []
    return self._sp.Encode(texts, num_threads=os.cpu_count() or 1)

  def decode(self, ids: Iterable[int]) -> str:
    return self._sp.Decode([int(i) for i in ids if int(i) != self.pad_id])

  def id_to_token(self, index: int) -> str:
    return self._sp.IdToPiece(int(index))

  def fingerprint(self) -> str:
    h = hashlib.sha256(self._proto)
    h.update(b"lower" if self._lowercase else b"cased")
    return h.hexdigest()

  def to_hf(self):
    """The same tokenizer as a `tokenizers.Tokenizer` (unigram models only), or None."""
    m = sentencepiece_model_pb2.ModelProto()
    m.ParseFromString(self._proto)
    if m.trainer_spec.model_type != sentencepiece_model_pb2.TrainerSpec.UNIGRAM:
      return None
    tok = HfTok(models.Unigram([(p.piece, p.score) for p in m.pieces], unk_id=self.unk_id,
                               byte_fallback=m.trainer_spec.byte_fallback))
    norms = []
    if m.normalizer_spec.precompiled_charsmap:
      norms.append(normalizers.Precompiled(m.normalizer_spec.precompiled_charsmap))
    if self._lowercase:
      norms.append(normalizers.Lowercase())
    if m.normalizer_spec.remove_extra_whitespaces:
      # Right strip only: the normalizer runs on each piece between special tokens, and a
      # left strip would glue the word after "[MASK]" to it ("[MASK]statement").
      norms += [normalizers.Strip(left=False, right=True),
                normalizers.Replace(Regex(" {2,}"), " ")]
    tok.normalizer = normalizers.Sequence(norms)
    # "first": the word mark is prepended to the text's first piece only, not again after
    # each special token (which made "[MASK]," into "[MASK] ▁ ,").
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SP_WORD_MARK,
                                                 prepend_scheme="first")
    # [MASK] stands for a whole word, its leading space included (the ▁ of the masked
    # piece): it takes the space on its left (lstrip) and gives it back when decoded.
    mask = self.id_to_token(self.mask_id)
    tok.decoder = decoders.Sequence([
        decoders.Replace(mask, SP_WORD_MARK + mask),
        decoders.Metaspace(replacement=SP_WORD_MARK, prepend_scheme="first")])
    tok.add_special_tokens([AddedToken(self.id_to_token(i), special=True, normalized=False,
                                       lstrip=i == self.mask_id)
                            for i in sorted(set(self.special_ids))])
    return tok

  def save(self, directory: str) -> None:
    """Writes `spm.model` and, for unigram models, files for `AutoTokenizer.from_pretrained`."""
    d = epath.Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "spm.model").write_bytes(self._proto)
    tok = self.to_hf()
    if tok is None:
      log.warning("only unigram sentencepiece models are exported as tokenizer.json; "
                      "wrote %s/spm.model alone", directory)
      return
    _write_hf_files(self, tok, d)


class HFTokenizer(Tokenizer):
  """A `tokenizers.Tokenizer` (tokenizer.json or a WordPiece vocab.txt)."""

  def __init__(self, tok, lowercase: bool = False, where: str = "tokenizer"):
    self.kind = "hf"
    self._tok = tok
    self._tok.no_padding()
    self._tok.no_truncation()
    if hasattr(self._tok, "encode_special_tokens"):
      self._tok.encode_special_tokens = True  # "[SEP]" inside a text is text, not a special
    self._lowercase = bool(lowercase)
    self.vocab_size = int(tok.get_vocab_size(with_added_tokens=True))
    self._resolve_specials(tok.token_to_id, where)
    tokens = [tok.id_to_token(i) or "" for i in range(self.vocab_size)]
    special = np.zeros((self.vocab_size,), bool)
    for i, added in tok.get_added_tokens_decoder().items():
      if added.special and i < self.vocab_size:
        special[i] = True
    special[list(self.special_ids)] = True
    self.special = special
    self.word_start = _hf_word_starts(json.loads(tok.to_str()), tokens) | special

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    texts = [self._prep(t) for t in texts]
    if not texts:
      return []
    encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
    return [e.ids for e in encode(texts, add_special_tokens=False)]

  def decode(self, ids: Iterable[int]) -> str:
    return self._tok.decode([int(i) for i in ids if int(i) != self.pad_id],
                            skip_special_tokens=False)

  def id_to_token(self, index: int) -> str:
    return self._tok.id_to_token(int(index))

  def fingerprint(self) -> str:
    h = hashlib.sha256(self._tok.to_str().encode())
    h.update(b"lower" if self._lowercase else b"cased")
    return h.hexdigest()

  def save(self, directory: str) -> None:
    """Writes tokenizer.json and tokenizer_config.json for `AutoTokenizer.from_pretrained`."""
    tok = HfTok.from_str(self._tok.to_str())
    if self._lowercase:
      tok.normalizer = (normalizers.Sequence([normalizers.Lowercase(), tok.normalizer])
                        if tok.normalizer is not None else normalizers.Lowercase())
    d = epath.Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _write_hf_files(self, tok, d)


def _write_hf_files(owner: Tokenizer, tok, directory) -> None:
  """tokenizer.json (with a [CLS] A [SEP] (B [SEP]) post-processor when it has none) and
  tokenizer_config.json naming the special tokens."""
  names = {k: owner.id_to_token(getattr(owner, f"{k}_id")) for k in SPECIAL_CANDIDATES}
  if tok.post_processor is None:
    cls, sep = names["cls"], names["sep"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, owner.cls_id), (sep, owner.sep_id)])
  tok.save(str(directory / "tokenizer.json"))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
  config.update({f"{k}_token": v for k, v in names.items()})
  (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def _components(node) -> list[dict]:
  """Flattens a tokenizer.json normalizer / pre_tokenizer / decoder (Sequence or single)."""
  if not isinstance(node, dict):
    return []
  out = [node]
  for key in ("pretokenizers", "normalizers", "decoders"):
    for child in node.get(key) or ():
      out.extend(_components(child))
  return out


def _hf_word_starts(spec: dict, tokens: list[str]) -> np.ndarray:
  """Which tokens begin a word, from the tokenizer.json's model and pre-tokenizer.

  WordPiece (and BPE with a continuing-subword prefix): tokens without the prefix ('##').
  Byte-level BPE: tokens starting with 'Ġ'. Metaspace (sentencepiece-converted): '▁'.
  Otherwise every token counts as a word start (whole-word masking becomes token masking).
  """
  model = spec.get("model") or {}
  prefix = model.get("continuing_subword_prefix")
  if model.get("type") == "WordPiece":
    prefix = prefix or "##"
  if prefix:
    return np.array([not t.startswith(prefix) for t in tokens], bool)
  parts = _components(spec.get("pre_tokenizer")) + _components(spec.get("decoder"))
  types = {p.get("type") for p in parts}
  if "ByteLevel" in types:
    return np.array([t.startswith(BYTE_LEVEL_WORD_MARK) for t in tokens], bool)
  if "Metaspace" in types:
    mark = next((p.get("replacement") for p in parts if p.get("type") == "Metaspace"),
                SP_WORD_MARK) or SP_WORD_MARK
    return np.array([t.startswith(mark) for t in tokens], bool)
  log.warning("tokenizer.json: cannot tell word boundaries from model %r; every token "
                  "counts as a word start", model.get("type"))
  return np.ones((len(tokens),), bool)


def load_sentencepiece(path: str, lowercase: bool = False) -> SentencePieceTokenizer:
  """Loads a sentencepiece `.model` file (local or any etils.epath path)."""
  p = epath.Path(path)
  if not path or not p.exists() or p.is_dir():
    raise ValueError(f"tokenizer.path={path!r}: no sentencepiece .model file there")
  return SentencePieceTokenizer(p.read_bytes(), lowercase=lowercase,
                                where=f"sentencepiece model {path}")


def _wordpiece_from_vocab(text: str, lowercase: bool):
  vocab = {}
  for line in text.splitlines():
    token = line.rstrip("\r\n")
    if token and token not in vocab:
      vocab[token] = len(vocab)
  unk = next((t for t in SPECIAL_CANDIDATES["unk"] if t in vocab), None)
  if unk is None:
    raise ValueError("vocab.txt has no [UNK] token")
  tok = HfTok(models.WordPiece(vocab, unk_token=unk, continuing_subword_prefix="##",
                               max_input_chars_per_word=100))
  tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                              strip_accents=None, lowercase=lowercase)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece(prefix="##")
  specials = [t for group in SPECIAL_CANDIDATES.values() for t in group if t in vocab]
  tok.add_special_tokens(specials)
  return tok


def _is_uncased(text: str) -> bool:
  for line in text.splitlines():
    token = line.strip()
    if token.startswith(("[", "<")) and token.endswith(("]", ">")):
      continue
    if any("A" <= c <= "Z" for c in token):
      return False
  return True


def load_hf(path: str, lowercase: bool = False) -> HFTokenizer:
  """Loads a `tokenizer.json`, a WordPiece `vocab.txt`, or a directory with either.

  A `vocab.txt` without any token holding an ASCII capital is an uncased vocabulary: its
  text is lower-cased and accents stripped (as BERT-uncased does) even when `lowercase`
  is False.
  """
  p = epath.Path(path)
  if path and p.is_dir():
    for name in ("tokenizer.json", "vocab.txt"):
      if (p / name).exists():
        p = p / name
        break
    else:
      raise ValueError(f"tokenizer.path={path!r}: directory has no tokenizer.json or vocab.txt")
  if not path or not p.exists():
    raise ValueError(f"tokenizer.path={path!r}: no such tokenizer.json / vocab.txt file")
  text = p.read_text()
  if p.name.endswith(".json"):
    try:
      tok = HfTok.from_str(text)
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(f"{path} is not a valid tokenizer.json: {e}") from e
    return HFTokenizer(tok, lowercase=lowercase, where=str(path))
  if p.name.endswith(".txt"):
    if not lowercase and _is_uncased(text):
      log.info("%s looks uncased; lower-casing input text", path)
      lowercase = True
    return HFTokenizer(_wordpiece_from_vocab(text, lowercase), where=str(path))
  raise ValueError(f"tokenizer.path={path!r}: expected a tokenizer.json or a vocab.txt")


def training_sentences(documents: Sequence[str], max_sentences: int, lowercase: bool = False,
                       max_chars: int = 8192, seed: int = 0) -> list[str]:
  """Non-empty lines of `documents` (at most `max_sentences`, a seeded sample, in order)."""
  lines = [s for d in documents for s in (l.strip() for l in d.splitlines())
           if s and len(s) <= max_chars]
  if max_sentences and 0 < max_sentences < len(lines):
    keep = np.random.default_rng(seed).choice(len(lines), max_sentences, replace=False)
    lines = [lines[i] for i in np.sort(keep)]
  return [l.lower() for l in lines] if lowercase else lines


def train_sentencepiece(documents: Sequence[str], vocab_size: int, model_type: str = "unigram",
                        lowercase: bool = False, max_sentences: int = 200_000) -> bytes:
  """Trains a sentencepiece model on lines of `documents`; returns the serialized model.

  Ids: [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4, then the learned pieces.
  """
  if model_type not in SPM_MODEL_TYPES:
    raise ValueError(f"tokenizer.model_type={model_type!r}; expected one of {SPM_MODEL_TYPES}")
  if vocab_size <= len(BERT_SPECIALS):
    raise ValueError(f"tokenizer.vocab_size={vocab_size} is too small")
  sentences = training_sentences(documents, max_sentences, lowercase)
  if not sentences:
    raise ValueError("no text to train the sentencepiece tokenizer on")
  buf = io.BytesIO()
  try:
    spm.SentencePieceTrainer.Train(
        sentence_iterator=iter(sentences), model_writer=buf, vocab_size=vocab_size,
        model_type=model_type, character_coverage=0.9995,
        pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece="[PAD]", unk_piece="[UNK]",
        user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"], max_sentence_length=16384,
        shuffle_input_sentence=False, num_threads=os.cpu_count() or 1, minloglevel=2)
  except RuntimeError as e:
    raise ValueError(f"sentencepiece training failed (vocab_size={vocab_size}, "
                     f"{len(sentences)} sentences): {e}") from e
  return buf.getvalue()


def _broadcast_bytes(data: bytes | None) -> bytes:
  """Process 0's `data` on every JAX process (identity with one process)."""
  if jax.process_count() == 1:
    return data
  n = np.array(len(data) if data is not None else 0, np.int64)
  n = int(multihost_utils.broadcast_one_to_all(n))
  buf = np.zeros((n,), np.uint8)
  if jax.process_index() == 0:
    buf[:] = np.frombuffer(data, np.uint8)
  return np.asarray(multihost_utils.broadcast_one_to_all(buf)).tobytes()


def _spm_settings(tok_config) -> dict:
  return {"vocab_size": int(tok_config.vocab_size), "model_type": str(tok_config.model_type),
          "lowercase": bool(tok_config.lowercase)}


def _trained_sentencepiece(tok_config, workdir, documents_fn,
                           multihost: bool = True) -> SentencePieceTokenizer:
  settings = _spm_settings(tok_config)
  if multihost:
    is_chief = jax.process_index() == 0
  else:
    is_chief = True
  proto = None
  if is_chief:
    model_file = meta_file = None
    if workdir:
      tok_dir = epath.Path(workdir) / "tokenizer"
      model_file, meta_file = tok_dir / "spm.model", tok_dir / "spm.json"
    if model_file is not None and model_file.exists():
      if meta_file.exists():
        saved = json.loads(meta_file.read_text())
        diff = {k: (saved.get(k), v) for k, v in settings.items() if saved.get(k) != v}
        if diff:
          raise ValueError(
              f"{model_file} was trained with different settings (saved, config): {diff}; "
              "use a fresh workdir or delete that tokenizer directory")
      proto = model_file.read_bytes()
    else:
      proto = train_sentencepiece(
          documents_fn(), settings["vocab_size"], settings["model_type"],
          settings["lowercase"], int(tok_config.get("train_sentences", 200_000)))
      if model_file is not None:
        model_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = model_file.parent / "spm.model.tmp"
        tmp.write_bytes(proto)
        tmp.rename(model_file)
        meta_file.write_text(json.dumps(settings, indent=2))
  if multihost:
    proto = _broadcast_bytes(proto)
  tok = SentencePieceTokenizer(proto, lowercase=settings["lowercase"],
                               kind="sentencepiece_train", where="trained sentencepiece model")
  if tok.vocab_size != settings["vocab_size"]:
    raise ValueError(f"trained tokenizer has {tok.vocab_size} ids, config asks for "
                     f"{settings['vocab_size']}")
  return tok


def make_tokenizer(tok_config, workdir: str | None,
                   documents_fn: Callable[[], Sequence[str]],
                   multihost: bool = True) -> Tokenizer:
  """Builds the tokenizer that `tok_config` (the config's `tokenizer` section) names.

  Args:
    tok_config: `kind`, `path`, `vocab_size`, `model_type`, `lowercase`, `train_sentences`.
    workdir: run directory; `sentencepiece_train` caches its model in
      `<workdir>/tokenizer/`. None or "" trains in memory every time.
    documents_fn: returns the training documents; called only when a tokenizer must be
      trained (and then only on JAX process 0).
    multihost: True (training): process 0 trains and every JAX process gets its model,
      which starts JAX's backend. False: this process alone, JAX never touched (for
      launch.preprocess: on a TPU VM a backend would claim the chips, which a training
      job may hold).

  Returns:
    A `Tokenizer`.
  """
  kind = tok_config.kind
  lowercase = bool(tok_config.get("lowercase", False))
  if kind == "sentencepiece_train":
    return _trained_sentencepiece(tok_config, workdir, documents_fn, multihost)
  if kind == "sentencepiece":
    return load_sentencepiece(tok_config.path, lowercase)
  if kind == "hf":
    return load_hf(tok_config.path, lowercase)
  raise ValueError(f"tokenizer.kind={kind!r}; expected one of {KINDS}")
