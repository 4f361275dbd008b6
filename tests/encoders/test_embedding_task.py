"""The embedding task (encoders/tasks/embedding.py): its loss is sentence-transformers'
MultipleNegativesRankingLoss (plain, hard negatives, symmetric, Matryoshka) in value and
gradient; its pooling is sentence-transformers' Pooling; a run on a tiny random BERT
trains, scores retrieval, and exports a directory `SentenceTransformer` loads with the
same vectors; bad pair files and settings are named."""
import json
import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import encoders
import objectives
from configs import finetune as finetune_configs
from encoders import tasks
from encoders.tasks import embedding
from encoders.tasks.data import DataError
from launch import finetune
from launch.data import badinput
from launch.data import finetune_data as fd
from launch.trainer import finetuning
from tests.launch import finetune_helpers as fh


def _st_loss(anchors, docs, symmetric=False, dims=(), weights=()):
  """sentence-transformers' loss of (B,D) anchors and (B,R,D) docs (positive first)."""
  from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
  kw = dict(directions=("query_to_doc", "doc_to_query"), partition_mode="per_direction") \
      if symmetric else {}
  mnrl = MultipleNegativesRankingLoss(None, **kw)
  a = torch.tensor(np.asarray(anchors), requires_grad=True)
  d = torch.tensor(np.asarray(docs), requires_grad=True)
  total = 0
  for dim, w in zip(dims or (a.shape[-1],), weights or (1.0,) * max(len(dims), 1)):
    total = total + w * mnrl.compute_loss_from_embeddings(
        [a[:, :dim]] + [d[:, r, :dim] for r in range(d.shape[1])], None)
  total.backward()
  return float(total.detach()), a.grad.numpy(), d.grad.numpy()


@pytest.mark.parametrize("negatives,symmetric,dims,weights", [
    (0, False, (), ()), (2, False, (), ()), (1, True, (), ()),
    (1, False, (16, 8, 4), (1.0, 0.5, 0.25))])
def test_the_loss_is_multiple_negatives_ranking_loss(negatives, symmetric, dims, weights):
  rng = np.random.default_rng(0)
  b, d = 6, 16
  anchors = rng.standard_normal((b, d)).astype(np.float32)
  docs = rng.standard_normal((b, 1 + negatives, d)).astype(np.float32)
  docs[:, 0] += 0.5 * anchors  # positives resemble their anchors
  want, want_ga, want_gd = _st_loss(anchors, docs, symmetric, dims, weights)
  unit = tasks.get("embedding").configured({"embedding": {
      "symmetric": symmetric, "matryoshka_dims": dims, "matryoshka_weights": weights}})
  # two filler rows (copies of row 0, weight 0, as an epoch's last batch has) change nothing
  reps = np.concatenate([anchors[:, None], docs], 1)
  reps = np.concatenate([reps, reps[:2]])
  weight = np.r_[np.ones(b), np.zeros(2)].astype(np.float32)

  def mean_loss(r):
    terms, _ = unit.loss(tasks.TaskOutput(None, pooled=r), {"example_weight": weight})
    return terms["task"] / b
  got, g = jax.jit(jax.value_and_grad(mean_loss))(jnp.asarray(reps))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(g[:b, 0], want_ga, atol=1e-6)
  np.testing.assert_allclose(g[:b, 1:], want_gd, atol=1e-6)
  assert np.all(g[b:] == 0)


@pytest.mark.parametrize("mode", embedding.POOLINGS)
def test_pooling_is_sentence_transformers_pooling(mode):
  from sentence_transformers.sentence_transformer.modules.pooling import Pooling
  rng = np.random.default_rng(1)
  h = rng.standard_normal((3, 7, 8)).astype(np.float32)
  mask = (np.arange(7)[None] < np.array([[7], [3], [1]])).astype(np.int64)
  st = Pooling(8, pooling_mode=mode)
  want = st({"token_embeddings": torch.tensor(h),
             "attention_mask": torch.tensor(mask)})["sentence_embedding"].numpy()
  np.testing.assert_allclose(embedding.pool(jnp.asarray(h), jnp.asarray(mask), mode), want,
                             atol=1e-6)


def test_retrieval_metrics_by_hand():
  q = np.eye(3)[:2]  # query 0 is nearest doc 0, query 1 nearest doc 1
  c = np.array([[1, 0, 0], [0, 1, 0], [0.9, 0, 0.1]])
  got, top = embedding.retrieval(q, c, [[2], [1, 2]])
  assert top[0, :3].tolist() == [0, 2, 1]
  # query 0: its one relevant doc ranks 2nd; query 1: docs 1 (1st) and 2 (3rd) relevant
  assert got == {"recall@1": (0 + 0.5) / 2, "recall@10": 1.0, "mrr@10": (0.5 + 1) / 2}


def _pairs(n, seed=0):
  """Anchor: two content words; positive: those words among filler words; negative:
  filler only. Distinct anchors, so each query has one relevant document."""
  rng = np.random.default_rng(seed)
  content, filler = fh.WORDS[:6] + fh.WORDS[15:24], fh.WORDS[6:15]
  rows, seen = [], set()
  while len(rows) < n:
    a, b = (str(x) for x in rng.choice(content, 2, replace=False))
    if (a, b) not in seen:
      seen.add((a, b))
      pos = [str(x) for x in rng.choice(filler, 4)] + [a, b]
      rng.shuffle(pos)
      rows.append({"anchor": f"{a} {b}", "positive": " ".join(pos),
                   "negative": " ".join(str(x) for x in rng.choice(filler, 5))})
  return rows


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
  return fh.tiny_bert_dir(str(tmp_path_factory.mktemp("bert") / "bert"),
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def _ours(hf_dir, texts, f, pooling="mean"):
  """Our vectors of `texts` from an exported directory: the encoder, the task's pooling,
  unit length."""
  model, params = encoders.from_hf(hf_dir, heads=())
  arrays = embedding.Embedding().encode(fd.load_tokenizer(hf_dir), [{"text": t} for t in texts],
                                        f, 16, 0, ())[0]
  h = model.apply({"params": params}, arrays["input_ids"],
                  arrays["attention_mask"]).last_hidden_state
  return embedding.normalize(embedding.pool(h, arrays["attention_mask"], pooling))


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_the_export_loads_in_sentence_transformers_with_our_vectors(tmp_path, bert_dir,
                                                                    pooling):
  from sentence_transformers import SentenceTransformer
  c = finetune_configs.get_config("embedding").unlock()
  c.init_from, c.data.seq_len = bert_dir, 16
  c.finetune.embedding.pooling = pooling
  c.finetune.embedding.query_prompt = "who "
  objectives.prepare_config(c)
  objective = objectives.get_objective(c, None)
  params = nn.unbox(objective.init(jax.random.PRNGKey(0)))  # random: every tensor matters
  out = str(tmp_path / "st")
  objective.export(params, out)
  for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(bert_dir, name), out)
  st = SentenceTransformer(out, device="cpu")
  assert st.prompts.get("query") == "who " and st.max_seq_length == 16
  texts = ["the movie was really good in london", "paris", "mary met john ."]
  np.testing.assert_allclose(_ours(out, texts, c.finetune, pooling), st.encode(texts),
                             atol=1e-5)


@pytest.mark.slow  # ~45 s on 2 shared cores
def test_a_run_trains_scores_retrieval_and_exports_for_sentence_transformers(tmp_path,
                                                                             bert_dir):
  from sentence_transformers import SentenceTransformer
  train = fh.write_jsonl(str(tmp_path / "pairs.jsonl"), _pairs(120))
  scored = tmp_path / "scored.tsv"
  scored.write_text("sentence1\tsentence2\tscore\n" + "".join(
      f"{r['anchor']}\t{r['positive']}\t1\n{r['anchor']}\t{r['negative']}\t0\n"
      for r in _pairs(10, seed=5)))
  c = finetune_configs.get_config("embedding").unlock()
  c.init_from, c.finetune.train_file, c.finetune.epochs = bert_dir, train, 2
  e = c.finetune.embedding
  e.negative_columns, e.query_prompt, e.scored_pairs_file = ("negative",), "who ", str(scored)
  c.data.seq_len, c.data.global_batch = 16, 16
  c.finetune.length_buckets = "off"  # one compiled step
  c.optimizer.learning_rate = 2e-3
  r = finetune.run(c, str(tmp_path / "run"))
  best = r["best"]["metrics"]
  assert set(best) == set(embedding.METRICS) and r["best"]["selection_metric"] == "mrr@10"
  assert best["recall@1"] > 0.2  # 24 held-out queries over 48 documents: chance ~0.04
  assert best["spearman"] > 0
  records = [json.loads(x) for x in open(tmp_path / "run" / "predictions.jsonl")]
  assert len(records) == 24 and records[0]["query"].startswith("who ")
  hf_dir = str(tmp_path / "run" / "hf")
  assert sorted(m["type"].rsplit(".", 1)[1] for m in json.load(
      open(os.path.join(hf_dir, "modules.json")))) == ["Normalize", "Pooling", "Transformer"]
  st = SentenceTransformer(hf_dir, device="cpu")
  texts = [records[0]["query"], "the movie was good", "paris"]
  want = st.encode(texts)
  assert st.prompts.get("query") == "who "
  np.testing.assert_allclose(_ours(hf_dir, texts, c.finetune), want, atol=1e-5)


def test_bad_pair_files_and_settings_are_named(tmp_path, bert_dir):
  bad = badinput.BadData()
  path = tmp_path / "p.csv"
  path.write_text("anchor,positive\nparis,the movie in paris\nx,y,z\nlondon,\n")
  rows = embedding.read_pairs(str(path), ("anchor", "positive"), bad=bad)
  assert [r["anchor"] for r in rows] == ["paris"]
  assert bad.counts["empty"] == 1 and bad.counts["corrupt_record"] == 1
  with pytest.raises(DataError, match="no column 'negative'"):
    embedding.read_pairs(str(path), ("anchor", "positive", "negative"), bad=bad)
  c = finetune_configs.get_config("embedding").unlock()
  c.init_from, c.finetune.train_file = bert_dir, str(path)
  c.finetune.embedding.pooling = "first"
  c.finetune.embedding.matryoshka_dims = (16, 8)
  c.finetune.embedding.matryoshka_weights = (1.0,)
  c.finetune.selection_metric = "spearman"
  with pytest.raises(ValueError) as e:
    finetuning.validate(c)
  for part in ("embedding.pooling='first'", "one weight per dimension",
               "'spearman' needs finetune.embedding.scored_pairs_file"):
    assert part in str(e.value)


def test_queries_and_documents_are_cut_each_to_their_own_width():
  rows = 4
  mask = lambda n: (np.arange(64)[None] < n).repeat(rows, 0).astype(np.int32)
  batch = {"input_ids": mask(5), "attention_mask": mask(5), "token_type_ids": 0 * mask(5),
           "positive_input_ids": mask(40), "positive_attention_mask": mask(40),
           "positive_token_type_ids": 0 * mask(40),
           "negative_attention_mask": mask(20)[:, None].repeat(2, 1),
           "negative_input_ids": mask(20)[:, None].repeat(2, 1),
           "example_weight": np.ones(rows, np.float32)}
  buckets = fd.length_buckets("auto", 64)
  # without groups, every role at the longest text's width
  out = fd.trim_to_bucket(batch, buckets)
  assert out["input_ids"].shape == out["token_type_ids"].shape == (rows, 48)
  assert out["positive_input_ids"].shape == out["positive_attention_mask"].shape == (rows, 48)
  assert out["negative_input_ids"].shape == (rows, 2, 48)
  np.testing.assert_array_equal(out["positive_attention_mask"], batch[
      "positive_attention_mask"][:, :48])  # only padding columns go
  # the embedding task's groups: the queries at their own width (5 -> 16), the positives
  # and negatives together at the longest document's (40 -> 48)
  task = embedding.Embedding().configured(finetune_configs.get_config("embedding").finetune)
  task.num_negatives = 2
  out = fd.trim_to_bucket(batch, buckets, task.width_groups)
  assert out["input_ids"].shape == out["attention_mask"].shape == (rows, 16)
  assert out["positive_input_ids"].shape == (rows, 48)
  assert out["negative_input_ids"].shape == out["negative_attention_mask"].shape == (rows, 2, 48)
  np.testing.assert_array_equal(out["attention_mask"], batch["attention_mask"][:, :16])
  np.testing.assert_array_equal(out["negative_input_ids"], batch["negative_input_ids"][..., :48])
  # the task's batch spec accepts the two widths, and still refuses a document role whose
  # width differs from the other document role's
  from objectives.spec import BatchSpec, Field
  spec = BatchSpec({k: Field(shape, dt) for k, (shape, dt) in task.batch_fields().items()},
                   None)
  full = dict(out, token_type_ids=out["input_ids"] * 0,
              positive_token_type_ids=out["positive_input_ids"] * 0,
              negative_token_type_ids=out["negative_input_ids"] * 0)
  spec.check(full)
  with pytest.raises(ValueError, match="negative_input_ids"):
    spec.check(dict(full, negative_input_ids=full["negative_input_ids"][..., :40]))
  with pytest.raises(ValueError, match="in no width group"):
    fd.trim_to_bucket(batch, buckets, (("",), ("positive_",)))


def test_cutting_each_role_to_its_width_keeps_the_loss_and_gradients(bert_dir):
  """The trainer's gradients of a batch at the full width and of the same batch with the
  queries and the documents cut each to its own bucket: equal (padding columns only)."""
  from launch.trainer import state as state_lib
  from launch.trainer import step as step_lib
  c = finetune_configs.get_config("embedding").unlock()
  c.init_from = bert_dir
  c.finetune.embedding.negative_columns = ("negative",)
  c.data.seq_len, c.data.global_batch = 64, 8
  objectives.prepare_config(c)
  setup = state_lib.build(c, None, jax.devices()[:1])
  state = setup.init_state()
  spec = setup.objective.batch_spec()
  rng = np.random.RandomState(0)
  short = spec.synthesize([[int(n)] for n in rng.randint(3, 9, 7)] + [[]], 64, seed=1)
  long = spec.synthesize([[int(n)] for n in rng.randint(20, 40, 7)] + [[]], 64, seed=2)
  full = {k: (long[k] if k.startswith(("positive_", "negative_")) else short[k])
          for k in short}
  cut = fd.trim_to_bucket(full, fd.length_buckets("auto", 64),
                          setup.objective.unit.width_groups)
  assert cut["input_ids"].shape == (8, 16) and cut["positive_input_ids"].shape == (8, 48)

  @jax.jit
  def grads(params, frozen, b):
    return step_lib.gradients(setup.objective, params, frozen, b, jax.random.PRNGKey(3), 1)
  want, want_sums = grads(state.params, state.frozen, full)
  got, got_sums = grads(state.params, state.frozen, cut)
  np.testing.assert_allclose(got_sums["task_loss_sum"], want_sums["task_loss_sum"], rtol=1e-6)
  assert got_sums["task_weight_sum"] == 7
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(x, y, atol=1e-5, rtol=1e-4)  # float32 sums of other lengths
