"""XLM-RoBERTa: parity with transformers in float32 on padded batches (base model, MLM
head, sequence / token classification and QA heads) on tiny random models with odd shapes,
exports that transformers loads with no missing or unexpected keys (from a padded
vocabulary too), parameter counts of base and large, the 250k vocabulary splitting evenly
over the mesh, and XLM-R tokenizer directories (tokenizer.json, or SentencePiece alone)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm
import torch
import transformers as T
from flax import linen as nn
from jax.sharding import Mesh
from sentencepiece import sentencepiece_model_pb2

import encoders
from configs import xlm_roberta as xlmr_configs
from encoders import base, tokenizer
from encoders import xlm_roberta as xlmr
from encoders.hf import tasks as tasks_hf
from encoders.hf import xlm_roberta as xlmr_hf
from encoders.sharding_rules import DEFAULT_RULES
from launch.data import tokenization
from launch.trainer import sharding as shard_lib

ATOL = 1e-4
# Odd shapes: head dim 6, MLP 37, a vocabulary of 101, 3 layers; two token types (XLM-R
# has one, but its config may say otherwise and transformers then uses them).
TINY = dict(vocab_size=101, hidden_size=36, num_hidden_layers=3, num_attention_heads=6,
            intermediate_size=37, max_position_embeddings=30, type_vocab_size=2,
            layer_norm_eps=1e-5, pad_token_id=1, bos_token_id=0, eos_token_id=2)
LABELS = {"sequence": ("neg", "neu", "pos"), "token": ("O", "B-X", "I-X", "B-Y"), "qa": ()}
TASK_CLASSES = {"sequence": T.XLMRobertaForSequenceClassification,
                "token": T.XLMRobertaForTokenClassification,
                "qa": T.XLMRobertaForQuestionAnswering}


def tiny_hf(cls, seed=0, **kw):
  torch.manual_seed(seed)
  model = cls(T.XLMRobertaConfig(**{**TINY, **kw})).eval()
  with torch.no_grad():  # biases and norms away from 0 / 1, so every mapping matters
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  return model


def padded_batch(batch=3, length=13, seed=0):
  rng = np.random.RandomState(seed)
  ids = rng.randint(3, TINY["vocab_size"], size=(batch, length))
  mask = np.ones_like(ids)
  for i, n in enumerate([length, length - 5, 4][:batch]):
    mask[i, n:] = 0
  ids[mask == 0] = TINY["pad_token_id"]
  types = (np.arange(length)[None] >= 3).astype(np.int64) * mask
  return ids, mask, types


def run_torch(model, ids, mask, types):
  with torch.no_grad():
    return model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                 token_type_ids=torch.tensor(types), output_hidden_states=True)


@pytest.mark.parametrize("arch,prefixed", [
    ("XLMRobertaModel", False), ("XLMRobertaForMaskedLM", False),
    pytest.param("XLMRobertaModel", True, marks=pytest.mark.slow)])
def test_parity_tiny_random(arch, prefixed, tmp_path):
  hf = tiny_hf(getattr(T, arch), seed=1)
  hf.save_pretrained(tmp_path)
  if prefixed:  # a base model's tensors under the "roberta." prefix
    from safetensors.numpy import load_file, save_file
    f = tmp_path / "model.safetensors"
    save_file({f"roberta.{k}": v for k, v in load_file(f).items()}, f,
              metadata={"format": "pt"})
  model, params = encoders.from_hf(str(tmp_path))
  assert model.config.family == "xlm-roberta"
  ids, mask, types = padded_batch(seed=2)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask),
                    jnp.asarray(types))
  ref = run_torch(hf, ids, mask, types)
  real = mask.astype(bool)
  hidden = ref.hidden_states[-1].numpy()
  assert np.abs(hidden).max() > 0.1
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real], hidden[real],
                             atol=ATOL, rtol=0)
  if arch == "XLMRobertaForMaskedLM":
    np.testing.assert_allclose(np.asarray(out.mlm_logits)[real], ref.logits.numpy()[real],
                               atol=ATOL, rtol=0)
  else:
    np.testing.assert_allclose(np.asarray(out.pooler_output), ref.pooler_output.numpy(),
                               atol=ATOL, rtol=0)
    assert out.mlm_logits is None


# (test_task_heads.py runs every task of every family at even shapes in the default suite)
@pytest.mark.parametrize("task", ["qa", pytest.param("sequence", marks=pytest.mark.slow),
                                  pytest.param("token", marks=pytest.mark.slow)])
def test_task_heads_parity_and_export(task, tmp_path):
  labels = LABELS[task]
  kw = dict(id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)}
            ) if labels else {}
  hf = tiny_hf(TASK_CLASSES[task], seed=3, **kw)
  hf.save_pretrained(tmp_path / "src")
  model, params = tasks_hf.from_hf(str(tmp_path / "src"))
  assert model.task == task and model.labels == labels
  ids, mask, types = padded_batch(seed=4)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask),
                    jnp.asarray(types))
  ref = run_torch(hf, ids, mask, types)
  real = mask.astype(bool)
  pairs = ([(out.start_logits, ref.start_logits), (out.end_logits, ref.end_logits)]
           if task == "qa" else [(out.logits, ref.logits)])
  for got, want in pairs:
    got, want = np.asarray(got), want.numpy()
    assert got.shape == want.shape
    if task == "sequence":
      np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
    else:
      np.testing.assert_allclose(got[real], want[real], atol=ATOL, rtol=0)
  tasks_hf.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = TASK_CLASSES[task].from_pretrained(str(tmp_path / "out"),
                                                    output_loading_info=True)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
  again = run_torch(loaded.eval(), ids, mask, types)
  for name in ("start_logits", "end_logits") if task == "qa" else ("logits",):
    np.testing.assert_allclose(getattr(again, name).numpy(), getattr(ref, name).numpy(),
                               atol=1e-6)


@pytest.mark.parametrize("heads", [("mlm",),
                                   pytest.param(("pooler",), marks=pytest.mark.slow)])
def test_fresh_model_with_padded_vocabulary_exports_to_transformers(heads, tmp_path):
  cfg = encoders.family_defaults("xlm-roberta")
  cfg.update(vocab_size=101, hidden_size=36, num_hidden_layers=2, num_attention_heads=6,
             intermediate_size=37, max_position_embeddings=30, dtype="float32", heads=heads)
  assert cfg.vocab_pad_multiple == 1024
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  assert params["embeddings"]["word_embeddings"]["embedding"].shape == (1024, 36)
  encoders.to_hf(model, params, str(tmp_path / "out"))
  cls = T.XLMRobertaForMaskedLM if "mlm" in heads else T.XLMRobertaModel
  hf, info = cls.from_pretrained(str(tmp_path / "out"), output_loading_info=True)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
  assert hf.config.model_type == "xlm-roberta" and hf.config.vocab_size == 101
  ids, mask, _ = padded_batch(seed=5)
  types = np.zeros_like(ids)
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  ref = run_torch(hf.eval(), ids, mask, types)
  real = mask.astype(bool)
  got, want = ((out.mlm_logits, ref.logits) if "mlm" in heads
               else (out.last_hidden_state, ref.last_hidden_state))
  np.testing.assert_allclose(np.asarray(got)[real], want.numpy()[real], atol=ATOL, rtol=0)


def _count(cfg):
  model = encoders.build(cfg)
  shapes = jax.eval_shape(lambda: encoders.init_params(model, jax.random.PRNGKey(0)))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["base", "large"])
def test_parameter_counts_match_transformers(variant):
  cfg = xlmr.defaults(variant)
  hf_dict, arch = xlmr_hf.XlmRobertaMapping().config_to_hf(cfg)
  with torch.device("meta"):
    theirs = sum(p.numel() for p in getattr(T, arch)(T.XLMRobertaConfig(**hf_dict))
                 .parameters())
  pad = base.padded_vocab_size(cfg) - cfg.vocab_size
  assert pad == 878  # 250,002 -> 250,880 rows
  assert _count(cfg) == theirs + pad * (cfg.hidden_size + 1)  # table rows and MLM bias
  cfg.vocab_pad_multiple = 1
  assert _count(cfg) == theirs


def test_vocabulary_splits_evenly_over_the_mesh():
  """base's embedding table and MLM bias (the vocab axis) on a (data 2, fsdp 1, tensor 4)
  mesh with the trainer's state split over data: 1/8 of the rows on each device. Without
  the padding, 250,002 rows divide over neither axis."""
  cfg = xlmr_configs.get_config("base").model
  assert base.padded_vocab_size(cfg) % (128 * 8) == 0
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 1, 4), ("data", "fsdp", "tensor"))
  model = encoders.build(cfg)
  with nn.logical_axis_rules(DEFAULT_RULES):
    boxed = jax.eval_shape(lambda: encoders.init_boxed(model, jax.random.PRNGKey(0)))
  shardings = shard_lib.logical_shardings(boxed, mesh, DEFAULT_RULES)
  abstract = nn.unbox(boxed)
  split = shard_lib.split_over_data(abstract, shardings, mesh)
  v, d = base.padded_vocab_size(cfg), cfg.hidden_size
  table = split["embeddings"]["word_embeddings"]["embedding"]
  bias = split["mlm"]["bias"]
  assert shardings["embeddings"]["word_embeddings"]["embedding"].spec[0] == "tensor"
  assert table.shard_shape((v, d)) == (v // 8, d)
  assert bias.shard_shape((v,)) == (v // 8,)
  assert v % 8 == 0 and cfg.vocab_size % 4 and cfg.vocab_size % 8


def _xlmr_vocab(tmp_path):
  """A tiny SentencePiece unigram model and XLM-R's id layout over it: <s> <pad> </s>
  <unk>, the pieces, <mask> last (as the released sentencepiece.bpe.model + fairseq)."""
  text = tmp_path / "text.txt"
  text.write_text("\n".join([
      "The quick brown fox jumps over the lazy dog.",
      "Le renard brun saute par-dessus le chien paresseux.",
      "Der schnelle braune Fuchs springt über den faulen Hund."] * 40))
  spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "sp"),
                                 vocab_size=50, model_type="unigram",
                                 character_coverage=1.0, minloglevel=2)
  proto = sentencepiece_model_pb2.ModelProto()
  proto.ParseFromString((tmp_path / "sp.model").read_bytes())
  return ([("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
          + [(p.piece, p.score) for p in proto.pieces[3:]] + [("<mask>", 0.0)])


def test_xlmr_tokenizer_directories_load(tmp_path):
  vocab = _xlmr_vocab(tmp_path)
  hf_tok = T.XLMRobertaTokenizer(vocab=vocab)
  hf_tok.save_pretrained(tmp_path / "fast")  # tokenizer.json
  slow = tmp_path / "slow"  # only the SentencePiece file, as older XLM-R directories
  slow.mkdir()
  (slow / tokenizer.SPM_FILE).write_bytes((tmp_path / "sp.model").read_bytes())
  (slow / "tokenizer_config.json").write_text('{"tokenizer_class": "XLMRobertaTokenizer"}')
  text = "Le chien saute über den Hund, the fox."
  want = hf_tok(text)["input_ids"]
  assert want[0] == 0 and want[-1] == 2 and len(want) > 8
  for d in (tmp_path / "fast", slow):
    tok = tokenizer.load_tokenizer(str(d))
    assert tok.encode(text).ids == want, d
    assert tok.token_to_id("<mask>") == len(vocab) - 1
  pipe_tok = tokenization.load_hf(str(tmp_path / "fast"))  # the trainer's loader
  assert pipe_tok.encode(text) == want[1:-1]
  assert (pipe_tok.cls_id, pipe_tok.pad_id, pipe_tok.sep_id, pipe_tok.unk_id,
          pipe_tok.mask_id) == (0, 1, 2, 3, len(vocab) - 1)


def test_refusals():
  cfg = encoders.family_defaults("xlm-roberta")
  cfg.update(vocab_size=50, hidden_size=12, num_hidden_layers=1, num_attention_heads=2,
             intermediate_size=16, heads=("mlm", "nsp"))
  with pytest.raises(ValueError, match="no NSP head"):
    xlmr_hf.XlmRobertaMapping().config_to_hf(cfg)
  with pytest.raises(ValueError, match="no NSP head"):
    encoders.init_params(encoders.build(cfg), jax.random.PRNGKey(0))
  cfg.heads = ("mlm",)
  model = encoders.build(cfg)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  with pytest.raises(ValueError, match="input_ids contains 50"):
    model.apply({"params": params}, jnp.full((1, 4), 50, jnp.int32))
