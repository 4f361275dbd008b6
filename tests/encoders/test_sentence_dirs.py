"""sentence-transformers directories (encoders/sentence.py, pipelines.embed) against
`SentenceTransformer(dir).encode` itself: the real all-MiniLM-L6-v2 on mixed lengths with
texts past its max_seq_length of 256, and tiny random models saved by sentence-transformers
with every pooling mode, a Dense layer, Normalize, lower-casing, prompts and a prompt left
out of the pooling; our writer's directories load there with equal vectors; modules we do
not implement are refused by name."""
import json
import os

import numpy as np
import pytest
from tokenizers import BertWordPieceTokenizer

from encoders import pipelines, sentence
from tests.encoders.minilm_helpers import minilm_dir
from tests.launch import finetune_helpers as fh

WORDS = fh.WORDS


def _texts(n, seed=0, long_every=7, long_words=400):
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    k = long_words if i % long_every == 3 else int(rng.integers(1, 30))
    out.append(" ".join(rng.choice(WORDS, k)))
  return out


def _st_modules():
  import warnings  # why: sentence_transformers.models warns that its old path is deprecated
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from sentence_transformers.models import Dense, Normalize, Pooling, Transformer
  return Transformer, Pooling, Dense, Normalize


def _cased_bert(path, seed=0):
  """A tiny random BERT whose tokenizer does not lower-case (so do_lower_case matters)."""
  fh.tiny_bert_dir(path, seed=seed, max_position_embeddings=64)
  tok = BertWordPieceTokenizer(os.path.join(path, "vocab.txt"), lowercase=False)
  tok.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"do_lower_case": False, "tokenizer_class": "BertTokenizer",
               "model_max_length": 64}, f)
  return path


def _worst_cosine(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def test_minilm_mixed_lengths_past_max_seq_length_match_sentence_transformers():
  from sentence_transformers import SentenceTransformer
  path = minilm_dir()
  texts = _texts(14, long_words=700)  # every 7th text is ~700 words: past 256 tokens
  p = pipelines.load(path, batch_size=8)
  assert p.max_length == 256 and p.sentence_spec.normalize
  assert p.sentence_spec.pooling == ("mean",)
  assert max(len(e.ids) for e in p.encode(texts)) == 256  # the long ones are cut there
  ours = pipelines.embed(p, texts)
  theirs = SentenceTransformer(path, device="cpu").encode(texts, batch_size=8)
  assert _worst_cosine(ours, theirs) >= 0.99999
  np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=0)
  # order: embedding a shuffled list gives the same vectors, shuffled
  perm = np.random.default_rng(1).permutation(len(texts))
  np.testing.assert_allclose(pipelines.embed(p, [texts[i] for i in perm]), ours[perm],
                             atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def st_dirs(tmp_path_factory):
  """Two sentence-transformers directories saved by sentence-transformers itself."""
  import torch
  from sentence_transformers import SentenceTransformer
  Transformer, Pooling, Dense, Normalize = _st_modules()
  root = tmp_path_factory.mktemp("st")
  base = _cased_bert(str(root / "bert"))
  torch.manual_seed(0)
  # every mode at once (concatenated in sentence-transformers' order), a Dense with tanh,
  # Normalize, max_seq_length 20 and a default prompt. (Not do_lower_case: saved by
  # sentence-transformers 6.3, it reloads without it under transformers 5, whose tokenizer
  # follows tokenizer_config.json's do_lower_case over tokenizer.json's normalizer; our
  # writer's legacy file is tested for it below.)
  t = Transformer(base, max_seq_length=20)
  modes = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
  pool = Pooling(32, pooling_mode=modes)
  dense = Dense(6 * 32, 24, activation_function=torch.nn.Tanh())
  with torch.no_grad():
    dense.linear.bias.add_(0.3)
  model = SentenceTransformer(modules=[t, pool, dense, Normalize()], device="cpu",
                              prompts={"query": "who : ", "document": "the "},
                              default_prompt_name="query")
  all_modes = str(root / "all_modes")
  model.save(all_modes)
  # the prompt left out of mean and lasttoken pooling, no Normalize, a Dense without bias
  t2 = Transformer(base, max_seq_length=32)
  model2 = SentenceTransformer(
      modules=[t2, Pooling(32, pooling_mode=("mean", "lasttoken"), include_prompt=False),
               Dense(64, 16, bias=False, activation_function=torch.nn.Identity())],
      device="cpu", prompts={"query": "who did go where ? "})
  no_prompt = str(root / "no_prompt")
  model2.save(no_prompt)
  return {"all_modes": all_modes, "no_prompt": no_prompt}


def test_every_pooling_mode_dense_normalize_and_default_prompt(st_dirs):
  from sentence_transformers import SentenceTransformer
  path = st_dirs["all_modes"]
  spec = sentence.read(path)
  assert spec.pooling == ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean",
                          "lasttoken")
  assert len(spec.dense) == 1 and spec.dense[0].weight.shape == (24, 192)
  assert spec.normalize and spec.default_prompt_name == "query"
  # sentence-transformers 6 keeps max_seq_length in tokenizer_config.json and lower-cases
  # in the saved tokenizer's normalizer; older ones in sentence_bert_config.json (below)
  texts = _texts(12, long_every=5, long_words=40)
  p = pipelines.load(path, batch_size=4)
  assert p.max_length == 20
  theirs_model = SentenceTransformer(path, device="cpu")
  for kwargs in ({}, {"prompt_name": "document"}, {"prompt": "a "}):
    ours = pipelines.embed(p, texts, **kwargs)
    theirs = theirs_model.encode(texts, batch_size=4, **kwargs)
    assert ours.shape == (12, 24)
    np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=0, err_msg=str(kwargs))


def test_prompt_left_out_of_pooling_and_dense_without_bias(st_dirs):
  from sentence_transformers import SentenceTransformer
  path = st_dirs["no_prompt"]
  p = pipelines.load(path)
  assert not p.sentence_spec.include_prompt and not p.sentence_spec.normalize
  texts = _texts(9, long_every=4, long_words=50)
  theirs_model = SentenceTransformer(path, device="cpu")
  ours = pipelines.embed(p, texts, prompt_name="query")
  theirs = theirs_model.encode(texts, prompt_name="query")
  np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=0)
  with_prompt = pipelines.embed(p, texts, prompt_name="query")
  plain = pipelines.embed(p, texts)
  assert np.abs(with_prompt - plain).max() > 1e-3  # the prompt still conditions the tokens
  with pytest.raises(ValueError, match="prompt name 'passage'"):
    pipelines.embed(p, texts, prompt_name="passage")


def test_our_writer_loads_in_sentence_transformers(tmp_path, st_dirs):
  """Our writer's legacy-format files (max_seq_length and do_lower_case in
  sentence_bert_config.json, read by every sentence-transformers version) over a cased
  tokenizer: lower-casing and the length limit come from those files alone."""
  from sentence_transformers import SentenceTransformer
  src = sentence.read(st_dirs["all_modes"])
  out = _cased_bert(str(tmp_path / "ours"))
  spec = sentence.Spec(pooling=("mean", "max"), dense=src.dense[:0] + (sentence.Dense(
      np.random.default_rng(0).normal(size=(8, 64)).astype(np.float32),
      np.linspace(-1, 1, 8).astype(np.float32), "Tanh"),), normalize=True,
      max_seq_length=12, do_lower_case=True, prompts={"query": "who : "})
  sentence.write(out, spec, hidden_size=32)
  back = sentence.read(out)
  assert (back.pooling, back.max_seq_length, back.do_lower_case, back.prompts) == \
      (spec.pooling, 12, True, spec.prompts)
  np.testing.assert_array_equal(back.dense[0].weight, spec.dense[0].weight)
  texts = [t.upper() for t in _texts(6, long_every=3, long_words=30)]
  theirs = SentenceTransformer(out, device="cpu").encode(texts, prompt_name="query")
  p = pipelines.load(out)
  assert p.max_length == 12
  # lower-casing is real: without it, upper-cased words are [UNK] for this tokenizer
  assert p.encode(["GOOD"])[0].ids == p.encode(["good"])[0].ids
  np.testing.assert_allclose(pipelines.embed(p, texts, prompt_name="query"), theirs,
                             atol=2e-5, rtol=0)


def _edit(path, name, fn):
  f = os.path.join(path, name)
  with open(f) as fh_:
    data = json.load(fh_)
  with open(f, "w") as fh_:
    json.dump(fn(data), fh_)


def test_unsupported_modules_are_refused_by_name(tmp_path, st_dirs):
  import shutil
  d = str(tmp_path / "d")
  shutil.copytree(st_dirs["no_prompt"], d)
  _edit(d, "modules.json", lambda m: m + [{"idx": 9, "name": "9", "path": "9_LSTM",
                                             "type": "sentence_transformers.models.LSTM"}])
  with pytest.raises(ValueError, match="sentence_transformers.models.LSTM"):
    pipelines.load(d)
  _edit(d, "modules.json", lambda m: [x for x in m if x["idx"] != 9 and "Pooling" not in x["type"]])
  with pytest.raises(ValueError, match="Dense module before Pooling"):
    sentence.read(d)
  _edit(d, "modules.json", lambda m: [x for x in m if "Dense" not in x["type"]])
  with pytest.raises(ValueError, match="no Pooling module"):
    sentence.read(d)
  e = str(tmp_path / "e")
  shutil.copytree(st_dirs["no_prompt"], e)
  _edit(e, "1_Pooling/config.json", lambda c: {**c, "pooling_mode": "median"})
  with pytest.raises(ValueError, match="unknown pooling mode 'median'"):
    sentence.read(e)


def test_length_steps_bound_padding_and_programs():
  widths = sorted({pipelines.length_step(n) for n in range(1, 257)})
  assert len(widths) == 16 and widths[-1] == 256
  for n in range(1, 1025):
    w = pipelines.length_step(n)
    assert n <= w and (w - n) <= max(7, n // 4), n


def test_chunked_tokenizing_keeps_input_order(st_dirs):
  """Texts in several tokenizing chunks (batch 2: chunks of 16) come back in input order,
  equal to one big batch and to sentence-transformers."""
  from sentence_transformers import SentenceTransformer
  path = st_dirs["no_prompt"]
  texts = _texts(37, long_every=6, long_words=20)
  small = pipelines.embed(pipelines.load(path, batch_size=2), texts)
  big = pipelines.embed(pipelines.load(path, batch_size=64), texts)
  np.testing.assert_allclose(small, big, atol=1e-5, rtol=0)
  theirs = SentenceTransformer(path, device="cpu").encode(texts)
  np.testing.assert_allclose(small, theirs, atol=2e-5, rtol=0)


def test_base_model_of_a_checkpoint_naming_a_head(tmp_path):
  """all-mpnet-base-v2's layout: base-model weights under a config naming
  MPNetForMaskedLM. sentence-transformers runs the base model; so does embed (the heads
  loaded are those the file holds exactly: here the pooler)."""
  import torch
  import transformers as T
  from sentence_transformers import SentenceTransformer
  Transformer, Pooling, _, Normalize = _st_modules()
  src = str(tmp_path / "mpnet")
  fh.write_tokenizer(src)
  torch.manual_seed(0)
  cfg = T.MPNetConfig(vocab_size=len(fh.VOCAB), hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=48, max_position_embeddings=70)
  T.MPNetModel(cfg).eval().save_pretrained(src)
  with open(os.path.join(src, "config.json")) as f:
    hf_cfg = json.load(f)
  hf_cfg["architectures"] = ["MPNetForMaskedLM"]
  with open(os.path.join(src, "config.json"), "w") as f:
    json.dump(hf_cfg, f)
  out = str(tmp_path / "st")
  SentenceTransformer(modules=[Transformer(src, max_seq_length=24), Pooling(32), Normalize()],
                      device="cpu").save(out)
  texts = _texts(5, long_every=2, long_words=40)
  theirs = SentenceTransformer(out, device="cpu").encode(texts)
  np.testing.assert_allclose(pipelines.embed(pipelines.load(out), texts), theirs, atol=2e-5,
                             rtol=0)
