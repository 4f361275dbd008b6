"""launch.finetune end to end on a tiny random BERT: it learns a synthetic task, keeps
the best epoch, writes predictions / an HF export transformers loads with id2label / a
confusion matrix; the readers, QA windowing and the metrics against scikit-learn/scipy."""
import json
import os

import numpy as np
import pytest
import transformers as T

from configs import finetune as finetune_configs
from launch import finetune
from launch.data import finetune_data as fd
from encoders.tasks import metrics as tm
from tests.launch import finetune_helpers as fh


def _config(task, d, **finetune_overrides):
  c = finetune_configs.get_config(task).unlock()
  c.init_from = fh.tiny_bert_dir(os.path.join(d, "bert"))
  c.data.seq_len, c.data.global_batch = 24, 16
  c.optimizer.learning_rate = 3e-3
  for k, v in finetune_overrides.items():
    c.finetune[k] = v
  return c


def test_sequence_classification_learns_and_exports(tmp_path):
  train = fh.write_jsonl(tmp_path / "train.jsonl", fh.sentiment_rows(192, seed=1))
  c = _config("sequence", str(tmp_path), train_file=str(train), epochs=8)
  r = finetune.run(c, str(tmp_path / "run"))
  best = r["best"]
  assert best["metrics"]["accuracy"] >= 0.9, r["history"]
  assert r["history"][0]["accuracy"] < best["metrics"]["accuracy"]  # it learned
  run = tmp_path / "run"
  for name in ("predictions.jsonl", "confusion_matrix.png", "results.json", "metrics.jsonl"):
    assert (run / name).is_file(), name
  preds = [json.loads(x) for x in open(run / "predictions.jsonl")]
  assert len(preds) == round(192 * 0.2)
  acc = np.mean([p["label"] == p["prediction"] for p in preds])
  assert acc == pytest.approx(best["metrics"]["accuracy"])
  hf, info = T.AutoModelForSequenceClassification.from_pretrained(str(run / "hf"),
                                                                  output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"]
  assert hf.config.id2label == {0: "neg", 1: "pos"}
  clf = T.pipeline("text-classification", model=str(run / "hf"), device="cpu")
  assert clf("the movie was really awful")[0]["label"] == "neg"
  assert clf("the movie was really great")[0]["label"] == "pos"


@pytest.mark.slow
def test_token_classification_learns_entities(tmp_path):
  train = fh.write_conll(tmp_path / "train.conll", fh.ner_sentences(160, seed=2))
  c = _config("token", str(tmp_path), train_file=str(train), epochs=6)
  r = finetune.run(c, str(tmp_path / "run"))
  assert r["best"]["metrics"]["entity_f1"] >= 0.9, r["history"]
  hf = T.AutoModelForTokenClassification.from_pretrained(str(tmp_path / "run" / "hf"))
  assert set(hf.config.id2label.values()) == {"B-LOC", "B-PER", "O"}


@pytest.mark.slow
def test_qa_learns_spans(tmp_path):
  train = fh.squad_file(tmp_path / "train.json", 160, seed=3)
  c = _config("qa", str(tmp_path), train_file=str(train), epochs=8, stride=4)
  r = finetune.run(c, str(tmp_path / "run"))
  assert r["best"]["metrics"]["exact_match"] >= 0.8, r["history"]


def test_qa_windows_cover_long_contexts_with_stride(tmp_path):
  tok = fd.load_tokenizer(fh.tiny_bert_dir(str(tmp_path / "bert")))
  ctx = " ".join(["the movie was good ."] * 6) + " john visited paris ."
  ex = {"id": "0", "question": "where did john go ?", "context": ctx,
        "answers": [{"text": "paris", "answer_start": ctx.index("paris")}]}
  arrays, meta = fd.encode_qa(tok, [ex], seq_len=16, pad_id=0, stride=4)
  assert len(meta) > 3  # several windows
  hits = [i for i in range(len(meta)) if arrays["start_positions"][i] > 0]
  assert hits and all(arrays["start_positions"][i] == 0 for i in range(len(meta))
                      if i not in hits)
  i = hits[0]
  a, b = meta[i]["offsets"][arrays["start_positions"][i]]
  assert ctx[a:b] == "paris"
  # n-best span search recovers it from one-hot logits, and respects max length
  s = np.full(16, -5.0)
  e = np.full(16, -5.0)
  s[arrays["start_positions"][i]] = e[arrays["end_positions"][i]] = 5.0
  spans, null = fd.best_spans(s, e, meta[i], ctx, n_best=5, max_answer_length=3)
  assert spans[0]["text"] == "paris" and spans[0]["score"] == 10.0 and null == -10.0
  with pytest.raises(ValueError, match="stride"):
    fd.encode_qa(tok, [ex], seq_len=16, pad_id=0, stride=8)


def test_token_labels_go_on_the_first_sub_token_only(tmp_path):
  tok = fd.load_tokenizer(fh.tiny_bert_dir(str(tmp_path / "bert")))
  arrays, firsts = fd.encode_tokens(tok, [(["movies", "paris"], ["O", "B-LOC"])], 8, 0,
                                    ("B-LOC", "O"))
  # [CLS] movie ##s paris [SEP]: "movies" is two pieces, only the first labelled
  assert firsts == [[1, 3]]
  np.testing.assert_array_equal(arrays["labels"][0, :5], [-100, 1, -100, 0, -100])


def test_readers_and_seeded_holdout(tmp_path):
  (tmp_path / "t.tsv").write_text("sentence\tother\tlabel\nhello there\tx\t1\nbye\ty\t0\n")
  rows = fd.read_table(str(tmp_path / "t.tsv"), "sentence", "other", "label")
  assert rows == [{"text": "hello there", "label": "1", "pair": "x"},
                  {"text": "bye", "label": "0", "pair": "y"}]
  with pytest.raises(ValueError, match="no column 'txt'"):
    fd.read_table(str(tmp_path / "t.tsv"), "txt")
  (tmp_path / "c.conll").write_text("-DOCSTART- O\n\nJohn B-PER\nran O\n\nParis B-LOC\n")
  assert fd.read_conll(str(tmp_path / "c.conll")) == [(["John", "ran"], ["B-PER", "O"]),
                                                      (["Paris"], ["B-LOC"])]
  a = fd.holdout(100, 0.2, seed=3)
  b = fd.holdout(100, 0.2, seed=3)
  assert len(a[1]) == 20 and not set(a[0]) & set(a[1])
  np.testing.assert_array_equal(a[1], b[1])


def test_classification_and_regression_metrics_match_sklearn_and_scipy():
  from scipy import stats
  from sklearn import metrics as skm
  rng = np.random.default_rng(0)
  y, p = rng.integers(0, 4, 200), rng.integers(0, 4, 200)
  p[:3] = 4  # a class only predicted
  got = tm.classification(y, p, 5)
  assert got["accuracy"] == pytest.approx(skm.accuracy_score(y, p))
  assert got["macro_f1"] == pytest.approx(skm.f1_score(y, p, average="macro"))
  a, b = rng.normal(size=50), rng.normal(size=50)
  b[:10] = b[0]  # ties
  r = tm.regression(a, b)
  assert r["pearson"] == pytest.approx(stats.pearsonr(a, b)[0])
  assert r["spearman"] == pytest.approx(stats.spearmanr(a, b)[0])


def test_entity_f1_follows_conlleval_chunks():
  gold = [["B-PER", "I-PER", "O", "B-LOC"], ["I-ORG", "I-ORG", "O", "B-MISC"]]
  pred = [["B-PER", "I-PER", "O", "B-PER"], ["B-ORG", "I-ORG", "O", "O"]]
  assert tm.entities(gold[1]) == [("ORG", 0, 1), ("MISC", 3, 3)]
  assert tm.entities(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 2)]
  m = tm.entity_f1(gold, pred)  # 2 of 3 predicted right, 2 of 4 gold found
  assert m["entity_precision"] == pytest.approx(2 / 3)
  assert m["entity_recall"] == pytest.approx(0.5)
  assert m["entity_f1"] == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5))


def test_squad_em_and_f1():
  m = tm.squad([["The Eiffel Tower"], ["Paris", "paris, France"], []],
               ["eiffel tower", "France", ""])
  assert m["exact_match"] == pytest.approx(2 / 3)  # articles/case ignored; no-answer right
  assert m["f1"] == pytest.approx((1 + 2 / 3 + 1) / 3)


def test_length_buckets_parse_and_reject():
  assert fd.length_buckets("auto", 128) == (16, 24, 32, 48, 64, 96, 128)
  assert fd.length_buckets("auto", 100) == (16, 24, 32, 48, 64, 96, 100)
  assert fd.length_buckets("auto", 40) == (16, 24, 32, 40)
  assert fd.length_buckets("off", 128) == (128,)
  assert fd.length_buckets("64, 32", 128) == (32, 64, 128)
  with pytest.raises(ValueError, match="length_buckets='8,300'.*seq_len=128"):
    fd.length_buckets("8,300", 128)
  with pytest.raises(ValueError, match="'auto', 'off' or widths"):
    fd.length_buckets("short", 128)


def test_batches_cut_only_padding_columns_and_keep_every_row():
  rng = np.random.default_rng(0)
  n, seq = 10, 64
  lengths = np.array([3, 20, 5, 7, 9, 2, 30, 4, 6, 8])
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  arrays = {"input_ids": rng.integers(5, 99, (n, seq)) * mask, "attention_mask": mask,
            "token_type_ids": np.zeros((n, seq), np.int32),
            "labels": np.where(mask > 0, 1, -100), "example_weight": np.ones(n, np.float32)}
  buckets = fd.length_buckets("auto", seq)
  full = list(fd.batches(arrays, 4, seed=1))
  cut = list(fd.batches(arrays, 4, seed=1, buckets=buckets))
  assert [b["input_ids"].shape[1] for b in full] == [64, 64, 64]
  for f, c in zip(full, cut):
    w = c["input_ids"].shape[1]
    longest = int(f["attention_mask"].sum(1).max())
    smaller = [b for b in buckets if b < w]
    assert w in buckets and w >= longest and (not smaller or smaller[-1] < longest)
    for k in ("input_ids", "attention_mask", "token_type_ids", "labels"):
      np.testing.assert_array_equal(c[k], f[k][:, :w])
      assert c[k].shape == (4, w)
    assert f["attention_mask"][:, w:].sum() == 0  # nothing real was cut
    np.testing.assert_array_equal(c["example_weight"], f["example_weight"])
  assert sum(b["example_weight"].sum() for b in cut) == n  # the last batch padded, weight 0


def test_bucketed_batch_gives_the_full_width_loss_and_gradients(tmp_path):
  """The invariant bucketing rests on: cutting padding columns changes no loss term,
  metric or gradient (eval mode, float32)."""
  import jax
  import objectives
  from objectives import finetune as ft
  rows = fh.sentiment_rows(8, seed=2)
  c = _config("sequence", str(tmp_path))
  c.finetune.labels = ("neg", "pos")
  c.data.seq_len = 48
  objectives.prepare_config(c)
  tok = fd.load_tokenizer(c.init_from)
  arrays = fd.encode_sequence(tok, rows, 48, 0, ("neg", "pos"))
  (full,) = fd.batches(arrays, 8)
  (cut,) = fd.batches(arrays, 8, buckets=fd.length_buckets("auto", 48))
  assert cut["input_ids"].shape[1] < 48
  obj = ft.Finetune(c)
  params = obj.init(jax.random.PRNGKey(0))

  def loss(p, b):
    terms, metrics = obj.loss(p, b, None, False)
    return terms["task"], metrics

  grad_fn = jax.jit(jax.value_and_grad(loss, has_aux=True))  # one compile per width
  (lf, mf), gf = grad_fn(params, full)
  (lc, mc), gc = grad_fn(params, cut)
  np.testing.assert_allclose(lc, lf, rtol=1e-5)
  for k in mf:
    np.testing.assert_allclose(mc[k], mf[k], rtol=1e-5, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), gc, gf)


def _rows(lengths, seq, rng, token_labels=False):
  n = len(lengths)
  mask = (np.arange(seq)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
  arrays = {"input_ids": (rng.integers(5, 30, (n, seq)) * mask).astype(np.int32),  # vocab 35
            "attention_mask": mask,
            "token_type_ids": ((np.arange(seq)[None] >= 2) * mask).astype(np.int32),
            "example_weight": np.ones(n, np.float32)}
  if token_labels:
    arrays["labels"] = np.where(mask > 0, rng.integers(0, 3, (n, seq)), -100).astype(np.int32)
    arrays["labels"][:, 0] = -100
  else:
    arrays["labels"] = rng.integers(0, 2, n).astype(np.int32)
  return arrays


def test_row_buckets_are_multiples_of_the_unit_up_to_the_batch():
  assert fd.row_buckets(32) == (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32)
  assert fd.row_buckets(64, 4) == (4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64)
  assert fd.row_buckets(30, 4) == (4, 8, 12, 16, 20, 24, 28, 32)  # 30 rounds up to 32
  assert fd.row_buckets(3, 8) == (8,)
  for batch, unit in ((32, 1), (256, 8), (100, 4)):
    b = fd.row_buckets(batch, unit)
    assert all(r % unit == 0 for r in b) and b[-1] >= batch
    assert all(hi <= max(lo + unit, 1.25 * lo) for lo, hi in zip(b, b[1:]))  # <= 25% more


def test_a_short_last_batch_reuses_a_compiled_row_count():
  rng = np.random.default_rng(0)
  full = _rows([8] * 6, 8, rng)  # 6 examples filling 6 rows of 8
  seen = {8, 12}
  assert fd.pack_rows(full, "sequence", rows=(5, 6, 7, 8), seen=seen)["input_ids"].shape[0] == 6
  assert seen == {6, 8, 12}  # a full batch: its own count, compiled from now on
  short = dict(full, example_weight=np.array([1, 1, 1, 0, 0, 0], np.float32))
  seen = {2, 5, 8}
  p = fd.pack_rows(short, "sequence", rows=(1, 2, 3, 4, 5, 6), seen=seen)
  assert p["input_ids"].shape[0] == 5 and seen == {2, 5, 8}  # 3 rows needed, 5 compiled
  assert p["label_weight"].sum() == 3 and p["attention_mask"][3:].sum() == 0


@pytest.mark.parametrize("task", ["sequence", "token"])
def test_pack_rows_keeps_every_example_once_apart_and_labelled(task):
  rng = np.random.default_rng(0)
  seq = 16
  lengths = [16, 3, 9, 5, 7, 2, 12, 4]
  arrays = _rows(lengths, seq, rng, token_labels=task == "token")
  (b,) = fd.batches(arrays, 10, seed=3)  # 8 real examples + 2 filler rows (weight 0)
  p = fd.pack_rows(b, task, rows=(2, 5, 10), pad_id=0)
  # 58 tokens: first-fit decreasing fills 4 rows of 16 (16 | 12 4 | 9 7 | 5 3 2), padded
  # to the row count 5 with an empty row
  assert p["input_ids"].shape == (5, seq)
  assert p["attention_mask"].sum() == sum(lengths)
  assert (p["segment_ids"] > 0).sum() == sum(lengths) and (p["segment_ids"][4] == 0).all()
  assert p["attention_mask"][:4].all(1).sum() == 3
  found = []
  for r in range(p["input_ids"].shape[0]):
    seg = p["segment_ids"][r]
    for s in range(1, seg.max() + 1):
      cols = np.nonzero(seg == s)[0]
      assert (np.diff(cols) == 1).all()  # contiguous
      toks = p["input_ids"][r, cols]
      match = [i for i in range(8) if lengths[i] == len(cols)
               and (arrays["input_ids"][i, :len(cols)] == toks).all()]
      assert len(match) == 1
      i = match[0]
      found.append(i)
      np.testing.assert_array_equal(p["token_type_ids"][r, cols],
                                    arrays["token_type_ids"][i, :len(cols)])
      if task == "sequence":
        assert p["labels"][r, cols[0]] == arrays["labels"][i]
        assert p["label_weight"][r, cols].tolist() == [1.0] + [0.0] * (len(cols) - 1)
      else:
        np.testing.assert_array_equal(p["labels"][r, cols], arrays["labels"][i, :len(cols)])
        np.testing.assert_array_equal(p["label_weight"][r, cols],
                                      arrays["labels"][i, :len(cols)] != -100)
  assert sorted(found) == list(range(8))  # each real example once, the fillers dropped
  assert p["label_weight"][p["segment_ids"] == 0].sum() == 0


def test_pack_rows_errors_name_the_problem():
  rng = np.random.default_rng(0)
  b = _rows([4, 6], 8, rng)
  with pytest.raises(ValueError, match="packing supports .*, not 'qa'"):
    fd.pack_rows(b, "qa", rows=(2,))
  left = dict(b, attention_mask=b["attention_mask"][:, ::-1].copy())
  with pytest.raises(ValueError, match="right-padded"):
    fd.pack_rows(left, "sequence", rows=(2,))
  with pytest.raises(ValueError, match="2 packed rows exceed the largest row count 1"):
    fd.pack_rows(b, "sequence", rows=(1,))


@pytest.mark.parametrize("task,regression", [("sequence", False), ("regression", True),
                                             ("token", False)])
def test_packed_batch_gives_the_unpacked_loss_and_gradients(tmp_path, task, regression):
  """The invariant packing rests on: the same examples packed several to a row give the
  unpacked batch's loss sums, normalizer, metrics and gradients (eval mode, float32)."""
  import jax
  import objectives
  from objectives import finetune as ft
  c = _config(task, str(tmp_path))
  c.finetune.labels = () if regression else ("a", "b", "c")
  c.data.seq_len = 24
  objectives.prepare_config(c)
  rng = np.random.default_rng(1)
  arrays = _rows([24, 5, 11, 3, 8, 17, 2, 6, 9, 4], 24, rng, token_labels=task == "token")
  if regression:
    arrays["labels"] = rng.normal(size=10).astype(np.float32)
  (full,) = fd.batches(arrays, 12)  # 10 examples + 2 fillers
  (packed,) = fd.batches(arrays, 12, pack={"task": task, "rows": fd.row_buckets(12),
                                           "pad_id": 0})
  assert packed["input_ids"].shape[0] < 12
  obj = ft.Finetune(c)
  c.finetune.packing = True
  obj_packed = ft.Finetune(c)
  assert set(obj_packed.batch_spec().fields) == set(packed)
  params = obj.init(jax.random.PRNGKey(0))

  def loss(o):
    def f(p, b):
      terms, metrics = o.loss(p, b, None, False)
      return terms["task"], (metrics, o.normalizers(b)["task"])
    return jax.jit(jax.value_and_grad(f, has_aux=True))

  (lf, (mf, nf)), gf = loss(obj)(params, full)
  (lp, (mp, n_p)), gp = loss(obj_packed)(params, packed)
  assert float(nf) == float(n_p) == (10 if task != "token" else (arrays["labels"] != -100).sum())
  np.testing.assert_allclose(lp, lf, rtol=1e-5)
  assert set(mp) == set(mf)
  for k in mf:
    np.testing.assert_allclose(mp[k], mf[k], rtol=1e-5, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), gp, gf)
  assert max(float(np.abs(np.asarray(x)).max()) for x in jax.tree.leaves(gf)) > 1e-4


@pytest.mark.slow  # default-suite time (~18 s); the packed loss/gradient test stays default
def test_packed_finetuning_learns_and_counts_the_same_tokens(tmp_path):
  train = fh.write_jsonl(tmp_path / "train.jsonl", fh.sentiment_rows(192, seed=1))
  c = _config("sequence", str(tmp_path), train_file=str(train), epochs=8, packing=True)
  r = finetune.run(c, str(tmp_path / "run"))
  assert r["best"]["metrics"]["accuracy"] >= 0.9, r["history"]
  assert r["history"][0]["accuracy"] < r["best"]["metrics"]["accuracy"]
  tok = fd.load_tokenizer(c.init_from)
  rows = fh.sentiment_rows(192, seed=1)
  tr, _ = fd.holdout(len(rows), c.finetune.eval_fraction, c.finetune.split_seed)
  real = sum(len(tok.encode(rows[i]["text"]).ids) for i in tr)
  assert r["train_tokens"] == real * 8  # every example's tokens, every epoch


def test_packing_is_refused_for_qa_before_reading_data(tmp_path):
  c = _config("qa", str(tmp_path), train_file=str(tmp_path / "missing.json"), packing=True)
  with pytest.raises(ValueError, match="packing.*not 'qa'"):
    finetune.run(c, str(tmp_path / "run"))
