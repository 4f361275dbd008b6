"""encoders.pipelines against transformers' pipelines on the same exported model (structure
and values, 1e-4; question answering, which transformers v5 dropped, against its
documented scoring recomputed from the torch model), embeddings as a masked mean (sentence-transformers directories:
tests/encoders/test_sentence_dirs.py), and the length buckets that keep a stream of inputs from recompiling."""
import numpy as np
import pytest
import transformers as T

from encoders import pipelines
from tests.encoders import task_helpers as TH
from tests.launch import finetune_helpers as fh

TEXTS = ["the movie was really good", "john visited paris with mary .",
         "a plot", "the acting was quite awful and the plot was poor ."]
ATOL = 1e-4


def _dir(tmp_path, arch, **cfg):
  return fh.tiny_bert_dir(str(tmp_path / arch), seed=3, arch=arch, **cfg)


def _hf(task, path):
  return T.pipeline(task, model=path, device="cpu")


def test_fill_mask_matches_transformers(tmp_path):
  path = _dir(tmp_path, "BertForMaskedLM")
  texts = ["the movie was [MASK] good", "[MASK] visited paris ."]
  ours = pipelines.fill_mask(pipelines.load(path), texts, top_k=4)
  theirs = _hf("fill-mask", path)(texts, top_k=4)
  for o, t in zip(ours, theirs):
    assert [x["token"] for x in o] == [x["token"] for x in t]
    assert [x["token_str"] for x in o] == [x["token_str"] for x in t]
    assert [x["sequence"] for x in o] == [x["sequence"] for x in t]
    np.testing.assert_allclose([x["score"] for x in o], [x["score"] for x in t], atol=ATOL)


def test_classify_matches_transformers(tmp_path):
  path = _dir(tmp_path, "BertForSequenceClassification",
              id2label={0: "neg", 1: "neutral", 2: "pos"},
              label2id={"neg": 0, "neutral": 1, "pos": 2})
  p = pipelines.load(path)
  ours = pipelines.classify(p, TEXTS)
  theirs = _hf("text-classification", path)(TEXTS)
  assert [o["label"] for o in ours] == [t["label"] for t in theirs]
  np.testing.assert_allclose([o["score"] for o in ours], [t["score"] for t in theirs],
                             atol=ATOL)
  all_ours = pipelines.classify(p, TEXTS[:1], top_k=3)[0]
  all_theirs = _hf("text-classification", path)(TEXTS[:1], top_k=3)[0]
  assert [o["label"] for o in all_ours] == [t["label"] for t in all_theirs]


def test_tag_matches_transformers(tmp_path):
  labels = ["O", "B-PER", "I-PER", "B-LOC"]
  path = _dir(tmp_path, "BertForTokenClassification", id2label=dict(enumerate(labels)),
              label2id={n: i for i, n in enumerate(labels)})
  ours = pipelines.tag(pipelines.load(path), TEXTS)
  theirs = _hf("token-classification", path)(TEXTS)
  assert sum(len(t) for t in theirs) > 3  # the random model tags something
  for o, t in zip(ours, theirs):
    assert [(x["entity"], x["index"], x["word"], x["start"], x["end"]) for x in o] == \
        [(x["entity"], x["index"], x["word"], x["start"], x["end"]) for x in t]
    np.testing.assert_allclose([x["score"] for x in o], [float(x["score"]) for x in t],
                               atol=ATOL)


def _reference_answers(path, question, context, top_k, max_len, stride, max_answer_len):
  """transformers v5 has no question-answering pipeline; the reference is its documented
  scoring, brute force over every span, on the torch model's logits over windows that
  transformers' own tokenizer makes: per window softmax over context tokens and [CLS],
  [CLS] then dropped, score p(start) * p(end), spans of at most max_answer_len tokens."""
  import torch
  tok = T.AutoTokenizer.from_pretrained(path)
  model = T.AutoModelForQuestionAnswering.from_pretrained(path).eval()
  enc = tok(question, context, truncation="only_second", max_length=max_len, stride=stride,
            return_overflowing_tokens=True, return_offsets_mapping=True, padding=True,
            return_tensors="pt")
  with torch.no_grad():
    out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                token_type_ids=enc["token_type_ids"])
  cands = []
  for w in range(len(enc["input_ids"])):
    seq = enc.sequence_ids(w)
    allowed = np.array([s == 1 for s in seq])
    allowed[0] = True
    probs = []
    for logits in (out.start_logits[w].numpy(), out.end_logits[w].numpy()):
      x = np.where(allowed, logits.astype(np.float64), -np.inf)
      e = np.exp(x - x.max())
      probs.append(e / e.sum())
    offsets = enc["offset_mapping"][w].tolist()
    for i in range(1, len(seq)):
      for j in range(i, min(i + max_answer_len, len(seq))):
        if seq[i] == 1 and seq[j] == 1:
          a, b = offsets[i][0], offsets[j][1]
          cands.append((probs[0][i] * probs[1][j], a, b, context[a:b]))
  cands.sort(key=lambda c: -c[0])
  return cands[:top_k]


@pytest.mark.parametrize("max_len,stride", [(64, 16), (24, 8)])
def test_answer_matches_transformers_scoring(tmp_path, max_len, stride):
  path = _dir(tmp_path, "BertForQuestionAnswering")
  context = ("the movie was good . john visited paris with mary . the plot was poor . "
             "mary met john in london .")
  question = "where did john go ?"
  ours = pipelines.answer(pipelines.load(path), question, context, top_k=3,
                          max_seq_len=max_len, doc_stride=stride, max_answer_len=4)
  theirs = _reference_answers(path, question, context, 3, max_len, stride, 4)
  assert [(o["answer"], o["start"], o["end"]) for o in ours] == \
      [(t[3], t[1], t[2]) for t in theirs]
  np.testing.assert_allclose([o["score"] for o in ours], [t[0] for t in theirs], atol=ATOL)


@pytest.mark.parametrize("model_type", TH.MODEL_TYPES)
def test_classify_and_tag_match_transformers_for_every_family(tmp_path, model_type):
  """Every mapped HF model type (tests/encoders/test_task_heads.py's tiny task models,
  with this file's WordPiece tokenizer), against transformers' pipelines."""
  for task, name, fn in (("sequence", "text-classification", pipelines.classify),
                         ("token", "token-classification", pipelines.tag)):
    path = str(tmp_path / task)
    TH.tiny_task_model(model_type, task, seed=5, vocab_size=len(fh.VOCAB)).save_pretrained(
        path)
    fh.write_tokenizer(path)
    ours = fn(pipelines.load(path), TEXTS)
    theirs = _hf(name, path)(TEXTS)
    if task == "sequence":
      ours, theirs = [[o] for o in ours], [[t] for t in theirs]
    else:
      assert sum(len(t) for t in theirs) > 0
    for o, t in zip(ours, theirs):
      assert [{k: v for k, v in x.items() if k != "score"} for x in o] == \
          [{k: v for k, v in x.items() if k != "score"} for x in t], (model_type, task)
      np.testing.assert_allclose([x["score"] for x in o], [float(x["score"]) for x in t],
                                 atol=ATOL, err_msg=f"{model_type} {task}")


def test_embed_and_search_match_mean_pooling_and_buckets_reuse_programs(tmp_path):
  import torch
  path = _dir(tmp_path, "BertModel")
  p = pipelines.load(path, batch_size=4)
  ours = pipelines.embed(p, TEXTS, normalize=False)
  tok = T.AutoTokenizer.from_pretrained(path)
  model = T.AutoModel.from_pretrained(path).eval()
  enc = tok(TEXTS, padding=True, return_tensors="pt")
  with torch.no_grad():
    h = model(**enc).last_hidden_state.numpy()
  m = enc["attention_mask"].numpy()[..., None]
  np.testing.assert_allclose(ours, (h * m).sum(1) / m.sum(1), atol=1e-5)
  widths = lambda: sorted(k[-1] for k in p._fns if k[0][0] == "embed")  # noqa: E731
  assert widths() == [16]  # the four texts (<= 14 tokens) pad to one width: one program
  pipelines.embed(p, [" ".join(["good"] * 20)], normalize=False)
  assert widths() == [16, 24]  # 22 tokens
  from sentence_transformers import util
  q = pipelines.embed(p, ["paris with john"])
  c = pipelines.embed(p, TEXTS)
  want = util.semantic_search(torch.tensor(q), torch.tensor(c), top_k=2)[0]
  got = pipelines.search(p, ["paris with john"], TEXTS, top_k=2)[0]
  assert [g["corpus_id"] for g in got] == [w["corpus_id"] for w in want]
  np.testing.assert_allclose([g["score"] for g in got], [w["score"] for w in want], atol=1e-5)


def test_wrong_model_for_the_helper_is_an_error(tmp_path):
  p = pipelines.load(_dir(tmp_path, "BertModel"))
  with pytest.raises(ValueError, match="sequence-classification"):
    pipelines.classify(p, TEXTS)
  with pytest.raises(ValueError, match="MLM head"):
    pipelines.fill_mask(p, ["a [MASK] plot"])
