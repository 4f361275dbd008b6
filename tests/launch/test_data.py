"""Tests of the default corpus, the tokenizers and the pretraining input pipeline.

Pairs (NSP/SOP) are tested in tests/objectives/test_pairs.py, the default corpus's
held-out split in tests/launch/test_corpus_split.py.
"""
import collections
import json

import numpy as np
import pytest

from launch import data
from launch.data import corpus
from launch.data import tokenization
from launch.data import pairs
from tests.launch.data_helpers import (assert_batches_equal, build_tiny_tfds, epoch_rows,  # noqa: F401
                                       make_config, rows_of, spm, spm_config, spm_path, take)


# ------------------------------------------------------------------------------ corpus


def test_default_corpus_is_real_prose_and_code():
  docs = corpus.default_documents()
  assert len(docs) > 500
  total = sum(len(d) for d in docs)
  assert 3_000_000 < total < 12_000_000
  assert all(d.strip() for d in docs)
  assert len(set(docs)) == len(docs)
  prose = set(corpus.prose_documents())
  code = set(corpus.code_documents())
  assert sum(map(len, prose)) > 1_000_000 and sum(map(len, code)) > 1_000_000
  assert any('The "if" statement' in d for d in prose)
  assert any(d.startswith("Module json") for d in prose)
  assert all(any(w in d for w in ("def ", "class ", "import ", " = ")) for d in code)
  assert sum("def " in d for d in code) > 0.8 * len(code)
  head = docs[:40]
  assert any(d in prose for d in head) and any(d in code for d in head)
  assert corpus.default_documents() == docs
  assert corpus.default_documents(25) == docs[:25]


# -------------------------------------------------------------------------- tokenizers


def test_sentencepiece_train_caches_in_workdir(tmp_path):
  c = make_config(tokenizer_vocab_size=600, tokenizer_train_sentences=5000)
  docs = corpus.default_documents(40)
  tok = tokenization.make_tokenizer(c.tokenizer, str(tmp_path), lambda: docs)
  assert (tmp_path / "tokenizer" / "spm.model").exists()
  assert tok.vocab_size == 600
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert tok.word_start[[0, 1, 2, 3, 4]].all()
  assert tok.word_start.shape == (600,) and tok.word_start.dtype == bool
  for i in range(5, 600):
    assert tok.word_start[i] == tok.id_to_token(i).startswith("\u2581")
  ids = tok.encode("The for statement iterates over a sequence.")
  assert ids and all(5 <= i < 600 or i == tok.unk_id for i in ids)
  assert tok.decode(ids) == "The for statement iterates over a sequence."
  assert tok.encode_batch(["a b", "c"]) == [tok.encode("a b"), tok.encode("c")]

  def no_training():
    raise AssertionError("a resumed run must reuse the cached tokenizer")

  again = tokenization.make_tokenizer(c.tokenizer, str(tmp_path), no_training)
  assert again.fingerprint() == tok.fingerprint()
  c.tokenizer.vocab_size = 700
  with pytest.raises(ValueError, match="vocab_size"):
    tokenization.make_tokenizer(c.tokenizer, str(tmp_path), no_training)


def test_sentencepiece_load(spm, spm_path):
  c = spm_config(spm_path)
  tok = tokenization.make_tokenizer(c.tokenizer, None, lambda: [])
  assert tok.fingerprint() == spm.fingerprint()
  text = "Return the number of items in a container."
  assert tok.encode(text) == spm.encode(text)
  c.tokenizer.path = spm_path + ".missing"
  with pytest.raises(ValueError, match="missing"):
    tokenization.make_tokenizer(c.tokenizer, None, lambda: [])


def test_hf_wordpiece_vocab_txt(tmp_path):
  words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox",
           "jump", "##s", "##es", ".", "over", "lazy", "dog", "\u211d"]
  (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
  c = make_config(tokenizer_kind="hf", tokenizer_path=str(tmp_path / "vocab.txt"))
  tok = tokenization.make_tokenizer(c.tokenizer, None, lambda: [])
  assert tok.vocab_size == len(words)
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  ids = tok.encode("The quick fox jumps over the lazy dogs.")  # uncased vocab: lower-cased
  assert [tok.id_to_token(i) for i in ids] == [
      "the", "quick", "fox", "jump", "##s", "over", "the", "lazy", "dog", "##s", "."]
  assert list(tok.word_start) == [not w.startswith("##") for w in words]
  assert tok.decode(ids) == "the quick fox jumps over the lazy dogs."
  from transformers import BertTokenizerFast
  reference = BertTokenizerFast(str(tmp_path / "vocab.txt"))
  for text in ["The quick fox jumps over the lazy dogs.", "Brown DOG, \u211d jumps!"]:
    assert tok.encode(text) == reference(text, add_special_tokens=False)["input_ids"]
  # A directory holding the vocabulary works too.
  c.tokenizer.path = str(tmp_path)
  assert tokenization.make_tokenizer(c.tokenizer, None, lambda: []).encode("fox") == [8]


def test_hf_byte_level_bpe_tokenizer_json(tmp_path):
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  hf = Tokenizer(models.BPE(unk_token="<unk>"))
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  hf.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[
      "<s>", "<pad>", "</s>", "<unk>", "<mask>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  hf.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 5, trainer)
  hf.save(str(tmp_path / "tokenizer.json"))
  c = make_config(tokenizer_kind="hf", tokenizer_path=str(tmp_path / "tokenizer.json"))
  tok = tokenization.make_tokenizer(c.tokenizer, None, lambda: [])
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)
  ids = tok.encode("the quick fox")
  assert tok.cls_id not in ids and tok.sep_id not in ids
  assert [tok.id_to_token(i) for i in ids] == ["the", "\u0120quick", "\u0120fox"]
  assert [bool(tok.word_start[i]) for i in ids] == [False, True, True]
  assert tok.word_start[:5].all()
  assert tok.decode(ids) == "the quick fox"


def test_saved_tokenizers_load_in_transformers(tmp_path, spm):
  from transformers import AutoTokenizer
  lines = [l for d in corpus.default_documents(30) for l in d.splitlines() if l.strip()][:300]
  spm.save(str(tmp_path / "spm"))
  hf = AutoTokenizer.from_pretrained(str(tmp_path / "spm"))
  same = sum(hf(l, add_special_tokens=False)["input_ids"] == spm.encode(l) for l in lines)
  assert same >= 0.98 * len(lines)
  assert (hf.cls_token_id, hf.sep_token_id, hf.pad_token_id, hf.mask_token_id) == (
      spm.cls_id, spm.sep_id, spm.pad_id, spm.mask_id)
  ids = hf("Hello there.")["input_ids"]
  assert ids == [spm.cls_id] + spm.encode("Hello there.") + [spm.sep_id]

  words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "fox", "jump", "##s"]
  (tmp_path / "vocab.txt").write_text("\n".join(words))
  wp = tokenization.load_hf(str(tmp_path / "vocab.txt"))
  wp.save(str(tmp_path / "wp"))
  hf = AutoTokenizer.from_pretrained(str(tmp_path / "wp"))
  assert hf("The fox jumps")["input_ids"] == [2, 5, 6, 7, 8, 3]


def test_hf_tokenizer_without_specials_is_rejected(tmp_path):
  from tokenizers import Tokenizer, models
  Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(
      str(tmp_path / "tokenizer.json"))
  c = make_config(tokenizer_kind="hf", tokenizer_path=str(tmp_path / "tokenizer.json"))
  with pytest.raises(ValueError, match="cls"):
    tokenization.make_tokenizer(c.tokenizer, None, lambda: [])


# ------------------------------------------------------------------------- bad config


@pytest.mark.parametrize("overrides, message", [
    ({"source": "hdfs"}, "data.source"),
    ({"packing": "greedy"}, "data.packing"),
    ({"tokenizer_kind": "bpe"}, "tokenizer.kind"),
    ({"seq_len": 2}, "seq_len"),
    ({"packing": "pairs", "seq_len": 4}, "seq_len"),
    ({"global_batch": 0}, "global_batch"),
    ({"eval_fraction": 1.5}, "eval_fraction"),
    ({"source": "text", "files": ""}, "data.files"),
    ({"source": "text", "files": "/nonexistent/*.txt"}, "/nonexistent"),
    ({"source": "default", "eval_split": "validation"}, "eval_split"),
    ({"source": "tfds", "tfds_name": ""}, "tfds_name"),
    ({"text_document": "paragraph"}, "text_document"),
    ({"packing": "pairs", "pair_task": "mlm"}, "data.pair_task"),
    ({"pair_task": "SOP"}, "data.pair_task"),
])
def test_bad_config_is_a_clear_error(overrides, message):
  with pytest.raises(ValueError, match=message):
    data.make_pipeline(make_config(**overrides), None, process_index=0, process_count=1)


def test_batch_not_divisible_by_processes(spm_path):
  with pytest.raises(ValueError, match="divisible"):
    data.make_pipeline(spm_config(spm_path, global_batch=9), None,
                       process_index=0, process_count=2)


# -------------------------------------------------------------------- documents packing


def test_documents_packing_keeps_documents_apart(spm, spm_path):
  seq_len = 48
  c = spm_config(spm_path, seq_len=seq_len, global_batch=1, num_epochs=1)
  p = data.make_pipeline(c, None, process_index=0, process_count=1)
  rows = epoch_rows(p)
  assert len(rows) == p.num_train_rows == p.stats["train_rows"]

  body = seq_len - 2
  structural = {spm.cls_id, spm.sep_id, spm.pad_id, spm.mask_id}
  expected = collections.Counter()
  for doc in data.load_documents(c.data)[0]:
    ids = [spm.unk_id if i in structural else i for i in spm.encode(doc)]
    for k in range(0, len(ids), body):
      expected[tuple(ids[k:k + body])] += 1

  got = collections.Counter()
  for r in rows:
    ids, seg, pos = r["input_ids"], r["segment_ids"], r["position_ids"]
    assert ids.dtype == seg.dtype == pos.dtype == r["token_type_ids"].dtype == np.int32
    assert ids.shape == (seq_len,)
    assert not r["token_type_ids"].any()
    n_seg = seg.max()
    real = seg > 0
    assert n_seg >= 1 and real[0]
    # Segments are 1, 2, ... in order, padding (0) only at the end.
    assert (np.diff(seg[real]) >= 0).all() and set(seg[real]) == set(range(1, n_seg + 1))
    assert not real[real.sum():].any()
    assert (ids[~real] == spm.pad_id).all()
    special = np.zeros((seq_len,), bool)
    for s in range(1, n_seg + 1):
      where = np.flatnonzero(seg == s)
      np.testing.assert_array_equal(pos[where], np.arange(len(where)))
      assert ids[where[0]] == spm.cls_id and ids[where[-1]] == spm.sep_id
      content = ids[where[1:-1]]
      assert not np.isin(content, list(structural)).any()
      got[tuple(int(t) for t in content)] += 1
      special[where[0]] = special[where[-1]] = True
    special |= ~real
    np.testing.assert_array_equal(r["special_tokens_mask"], special)
    # Each token's word-start flag is the tokenizer's, and true right after a special.
    ws = spm.word_start[ids] | special
    ws[1:] |= special[:-1]
    np.testing.assert_array_equal(r["word_starts"], ws)
  # Every piece is a contiguous slice of exactly one document: no mixing, no loss.
  assert got == expected
  assert p.stats["fill"] > 0.9


# --------------------------------------------------- determinism, restore and sharding


PACKINGS = [("documents", "nsp"), ("pairs", "nsp"), ("pairs", "sop")]


@pytest.mark.parametrize("packing, pair_task", PACKINGS)
def test_same_seed_same_batches(spm_path, packing, pair_task):
  c = spm_config(spm_path, packing=packing, pair_task=pair_task)
  a = take(data.make_pipeline(c, None, process_index=0, process_count=1).train_iter(), 6)
  b = take(data.make_pipeline(c, None, process_index=0, process_count=1).train_iter(), 6)
  assert_batches_equal(a, b)
  c.data.shuffle_seed = 1
  d = take(data.make_pipeline(c, None, process_index=0, process_count=1).train_iter(), 6)
  assert not all(np.array_equal(x["input_ids"], y["input_ids"]) for x, y in zip(a, d))


@pytest.mark.parametrize("packing, pair_task", PACKINGS)
def test_iterator_state_resumes_the_same_stream(tmp_path, spm_path, packing, pair_task):
  c = spm_config(spm_path, packing=packing, pair_task=pair_task, global_batch=16)
  p = data.make_pipeline(c, str(tmp_path), process_index=0, process_count=1)
  # Run past the end of an epoch, so the restore also crosses an epoch boundary.
  skip = p.steps_per_epoch - 2
  it = p.train_iter()
  take(it, skip)
  state = json.loads(json.dumps(data.iterator_state(it)))
  expected = take(it, 5)
  assert_batches_equal(take(data.restore_iterator(p, state), 5), expected)
  # A fresh process: rebuilt pipeline (now from the data cache), same stream.
  p2 = data.make_pipeline(c, str(tmp_path), process_index=0, process_count=1)
  assert p2.stats["cached"]
  assert_batches_equal(take(p2.train_iter(start_state=state), 5), expected)
  # A state of another stream is refused.
  c.data.shuffle_seed = 7
  other = data.make_pipeline(c, str(tmp_path), process_index=0, process_count=1)
  with pytest.raises(ValueError, match="different data pipeline"):
    other.train_iter(start_state=state)


def test_processes_read_disjoint_shards(spm_path):
  c = spm_config(spm_path, seq_len=32, global_batch=2, num_epochs=1)
  key = lambda r: r["input_ids"].tobytes()
  full = collections.Counter(key(r) for r in epoch_rows(
      data.make_pipeline(c, None, process_index=0, process_count=1)))
  shards = []
  for index in range(2):
    p = data.make_pipeline(c, None, process_index=index, process_count=2)
    assert p.batch_size == 1
    rows = epoch_rows(p)
    assert len(rows) == p.rows_per_process == p.num_train_rows // 2
    shards.append(collections.Counter(key(r) for r in rows))
  # Together the shards are the epoch's rows, none read twice (as multisets: identical
  # rows, e.g. license headers of several files, may legitimately occur more than once).
  union = shards[0] + shards[1]
  assert not union - full
  assert sum(union.values()) == sum(full.values()) - sum(full.values()) % 2


@pytest.mark.parametrize("packing, pair_task", PACKINGS)
def test_eval_batches_are_fixed(spm_path, packing, pair_task):
  c = spm_config(spm_path, packing=packing, pair_task=pair_task, eval_fraction=0.1)
  p = data.make_pipeline(c, None, process_index=0, process_count=1)
  a, b = p.eval_batches(3), p.eval_batches(3)
  assert 1 <= len(a) <= 3
  assert a[0]["input_ids"].shape == (8, 64)
  assert_batches_equal(a, b)
  assert a[0].keys() == next(p.train_iter()).keys()
  train, held_out = data.load_documents(c.data)
  assert held_out and not set(train) & set(held_out)
  c.data.eval_fraction = 0.0
  assert data.make_pipeline(c, None, process_index=0, process_count=1).eval_batches(3) == []


def _is_padding_row(r):
  return not r["segment_ids"].any()


def _assert_padding_row(r, pad_id, label_key):
  assert (r["input_ids"] == pad_id).all()
  assert not r["segment_ids"].any() and not r["position_ids"].any()
  assert not r["token_type_ids"].any()
  assert r["special_tokens_mask"].all() and not r["word_starts"].any()
  if label_key:
    assert int(r[label_key]) == -1


def _all_eval_rows(p):
  """Every held-out row of the pipeline, built directly (all processes together)."""
  return [p._eval_row(i) for i in range(len(p._eval_rows))]  # pylint: disable=protected-access


@pytest.mark.parametrize("packing, pair_task", PACKINGS)
@pytest.mark.parametrize("global_batch", [8, 128])
def test_eval_batches_hold_every_row_once(spm_path, packing, pair_task, global_batch):
  # 128 rows per batch is more than all held-out rows (~80: one partial batch); with 8
  # the last batch is partial unless the count happens to divide.
  c = spm_config(spm_path, packing=packing, pair_task=pair_task, eval_fraction=0.05,
                 global_batch=global_batch)
  p = data.make_pipeline(c, None, process_index=0, process_count=1)
  label_key = p.label_key
  assert label_key == {"documents": None, "pairs": pairs.LABEL_KEYS[pair_task]}[packing]
  expected = collections.Counter(r["input_ids"].tobytes() for r in _all_eval_rows(p))
  n = sum(expected.values())
  assert n == p.num_eval_rows > 0
  batches = p.eval_batches(1000)
  assert len(batches) == -(-n // global_batch)
  if global_batch == 128:
    assert n < global_batch and len(batches) == 1
  rows = rows_of(batches)
  real = [r for r in rows if not _is_padding_row(r)]
  for r in rows[len(real):]:
    _assert_padding_row(r, p.tokenizer.pad_id, label_key)
  assert len(real) == n and len(rows) - n < global_batch  # padding only at the end
  assert collections.Counter(r["input_ids"].tobytes() for r in real) == expected
  if label_key:
    assert all(int(r[label_key]) in (0, 1) for r in real)
  # Fewer batches than rows: a prefix of the same rows, still none twice.
  if len(batches) > 1:
    assert_batches_equal(p.eval_batches(1), batches[:1])


def test_eval_batches_split_rows_between_processes(spm_path):
  c = spm_config(spm_path, packing="pairs", eval_fraction=0.05, global_batch=16)
  whole = data.make_pipeline(c, None, process_index=0, process_count=1)
  expected = collections.Counter(r["input_ids"].tobytes() for r in _all_eval_rows(whole))
  shards = [data.make_pipeline(c, None, process_index=i, process_count=2).eval_batches(100)
            for i in range(2)]
  assert len(shards[0]) == len(shards[1]) >= 1  # same count, or a multi-host eval hangs
  got = collections.Counter()
  for batches in shards:
    assert batches[0]["input_ids"].shape == (8, 64)
    for r in rows_of(batches):
      if _is_padding_row(r):
        _assert_padding_row(r, whole.tokenizer.pad_id, "next_sentence_label")
      else:
        got[r["input_ids"].tobytes()] += 1
  assert got == expected


# ---------------------------------------------------------------------------- sources


def test_text_source(tmp_path, spm_path):
  (tmp_path / "a.txt").write_text("First doc line one.\nLine two.\n\n\nSecond doc.\n")
  (tmp_path / "b.txt").write_text("Third doc.\n  \nFourth doc.")
  with open(tmp_path / "c.jsonl", "w") as f:
    f.write(json.dumps({"body": "Fifth doc."}) + "\n\n" + json.dumps({"body": "Sixth."}))
  (tmp_path / "eval.txt").write_text("Held out.\n\nAlso held out.")
  files = f"{tmp_path}/*.txt,{tmp_path}/c.jsonl"
  c = spm_config(spm_path, source="text", files=f"{tmp_path}/[ab].txt,{tmp_path}/c.jsonl",
                 text_key="body", eval_split=str(tmp_path / "eval.txt"))
  train, held_out = data.load_documents(c.data)
  assert train == ["First doc line one.\nLine two.", "Second doc.", "Third doc.",
                   "Fourth doc.", "Fifth doc.", "Sixth."]
  assert held_out == ["Held out.", "Also held out."]
  c.data.text_document = "file"
  c.data.files = files
  c.data.eval_split = ""
  c.data.eval_fraction = 0.0
  train, held_out = data.load_documents(c.data)
  assert len(train) == 5 and held_out == []
  c.data.global_batch, c.data.num_epochs = 1, 1
  p = data.make_pipeline(c, None, process_index=0, process_count=1)
  assert p.stats["train_documents"] == 5
  text = " ".join(p.tokenizer.decode(b["input_ids"][0]) for b in p.train_iter())
  for doc in train:
    for word in doc.split():
      assert word in text


def test_tfds_source_reads_array_record_without_tensorflow(tmp_path, spm_path):
  name = build_tiny_tfds(str(tmp_path))
  assert list(tmp_path.rglob("*.array_record*"))
  c = spm_config(spm_path, source="tfds", tfds_name=name, tfds_data_dir=str(tmp_path),
                 eval_split="validation", global_batch=2, max_documents=-1)
  train, held_out = data.load_documents(c.data)
  assert sorted(train) == sorted(f"Document {i} of the tiny set.\nIt says that {i} plus one "
                                 f"is {i + 1}." for i in range(30))
  assert len(held_out) == 4 and all("Document 10" in d for d in held_out)
  p = data.make_pipeline(c, None, process_index=0, process_count=1)
  assert p.stats["train_documents"] == 30 and p.stats["eval_documents"] == 4
  text = p.tokenizer.decode(next(p.train_iter())["input_ids"].ravel())
  assert "tiny set" in text
  assert p.eval_batches(1)
  c.data.text_key = "body"
  with pytest.raises(ValueError, match="body"):
    data.load_documents(c.data)
  c.data.text_key, c.data.train_split = "text", "test"
  with pytest.raises(ValueError, match="test"):
    data.load_documents(c.data)
