"""Hugging Face directory reading: the errors that protect users from training on noise."""
import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

import encoders
from tests.encoders import hf_helpers as H


@pytest.fixture
def bert_dir(tmp_path):
  H.tiny_hf_model("BertForPreTraining").save_pretrained(tmp_path)
  return tmp_path


def _edit_config(path, **changes):
  cfg = json.loads((path / "config.json").read_text())
  cfg.update(changes)
  (path / "config.json").write_text(json.dumps(cfg))


def test_pickle_only_directory_is_refused_without_unpickling(tmp_path):
  model = H.tiny_hf_model("BertModel")
  model.config.save_pretrained(tmp_path)
  sentinel = tmp_path / "unpickled"

  class Bomb:  # unpickling this file would create the sentinel
    def __reduce__(self):
      return (open, (str(sentinel), "w"))

  torch.save({"x": Bomb()}, tmp_path / "pytorch_model.bin")
  with pytest.raises(ValueError, match="pickle"):
    encoders.from_hf(str(tmp_path))
  assert not sentinel.exists()


def test_unsupported_config_attribute_is_named(bert_dir):
  _edit_config(bert_dir, position_embedding_type="relative_key")
  with pytest.raises(ValueError, match="position_embedding_type"):
    encoders.from_hf(str(bert_dir))


def test_unknown_config_attribute_is_named(bert_dir):
  _edit_config(bert_dir, rotary_frobnication=3)
  with pytest.raises(ValueError, match="rotary_frobnication"):
    encoders.from_hf(str(bert_dir))


def test_unsupported_architecture_is_named(bert_dir):
  _edit_config(bert_dir, architectures=["BertForQuestionAnswering"])
  with pytest.raises(ValueError, match="BertForQuestionAnswering"):
    encoders.from_hf(str(bert_dir))


def test_missing_tensor_is_named(bert_dir):
  f = bert_dir / "model.safetensors"
  tensors = load_file(f)
  del tensors["bert.encoder.layer.1.output.dense.bias"]
  save_file(tensors, f, metadata={"format": "pt"})
  with pytest.raises(ValueError, match=r"encoder\.layer\.1\.output\.dense\.bias.*missing"):
    encoders.from_hf(str(bert_dir))


def test_unexpected_tensor_is_named(bert_dir):
  f = bert_dir / "model.safetensors"
  tensors = load_file(f)
  tensors["bert.encoder.layer.7.extra.weight"] = np.zeros((2, 2), np.float32)
  save_file(tensors, f, metadata={"format": "pt"})
  with pytest.raises(ValueError, match=r"layer\.7\.extra\.weight"):
    encoders.from_hf(str(bert_dir))


def test_misshaped_tensor_is_named(bert_dir):
  f = bert_dir / "model.safetensors"
  tensors = load_file(f)
  tensors["bert.pooler.dense.weight"] = np.zeros((32, 31), np.float32)
  save_file(tensors, f, metadata={"format": "pt"})
  with pytest.raises(ValueError, match="pooler"):
    encoders.from_hf(str(bert_dir))


def test_transposed_same_size_tensor_is_named_not_reshaped(bert_dir):
  # (37, 32) stored as (32, 37): same element count, scrambled layout. Only a declared
  # reshape may change a tensor's shape, so this must fail, naming the tensor.
  f = bert_dir / "model.safetensors"
  tensors = load_file(f)
  key = "bert.encoder.layer.0.intermediate.dense.weight"
  assert tensors[key].shape == (37, 32)
  tensors[key] = np.ascontiguousarray(tensors[key].T)
  save_file(tensors, f, metadata={"format": "pt"})
  with pytest.raises(ValueError, match=r"encoder\.layer\.0\.intermediate\.dense\.weight.*"
                                       r"\(32, 37\), expected \(37, 32\)"):
    encoders.from_hf(str(bert_dir))


def test_flattened_attention_kernel_needs_its_declared_layout(bert_dir):
  # The query kernel is declared (D,H,K) <-> HF (H*K, D) = (32, 32); a same-size (16, 64)
  # is refused, not reshaped.
  f = bert_dir / "model.safetensors"
  tensors = load_file(f)
  key = "bert.encoder.layer.1.attention.self.query.weight"
  tensors[key] = np.zeros((16, 64), np.float32)
  save_file(tensors, f, metadata={"format": "pt"})
  with pytest.raises(ValueError, match=r"layer\.1\.attention\.self\.query\.weight.*"
                                       r"\(16, 64\), expected \(32, 32\)"):
    encoders.from_hf(str(bert_dir))


def test_untied_decoder_is_refused(bert_dir):
  f = bert_dir / "model.safetensors"
  tensors = load_file(f)
  tensors["cls.predictions.decoder.weight"] = tensors[
      "bert.embeddings.word_embeddings.weight"] + 1.0
  save_file(tensors, f, metadata={"format": "pt"})
  with pytest.raises(ValueError, match="untied"):
    encoders.from_hf(str(bert_dir))


def test_sharded_safetensors_index(tmp_path):
  hf = H.tiny_hf_model("BertForMaskedLM", seed=7)
  hf.save_pretrained(tmp_path / "one")
  hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
  assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
  assert not (tmp_path / "sharded" / "model.safetensors").exists()
  _, p1 = encoders.from_hf(str(tmp_path / "one"))
  _, p2 = encoders.from_hf(str(tmp_path / "sharded"))
  import jax
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
    np.testing.assert_array_equal(a, b)


def test_to_hf_writes_atomically(tmp_path, monkeypatch):
  hf = H.tiny_hf_model("BertModel")
  hf.save_pretrained(tmp_path / "in")
  model, params = encoders.from_hf(str(tmp_path / "in"))
  import safetensors.numpy as stn

  def fail(*args, **kwargs):
    raise OSError("disk full")

  monkeypatch.setattr(stn, "save_file", fail)
  with pytest.raises(OSError):
    encoders.to_hf(model, params, str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()
  assert [p.name for p in tmp_path.iterdir()] == ["in"]


def test_export_refuses_params_no_rule_covers(tmp_path):
  """A param the mapping does not cover would silently vanish from the export."""
  import jax
  from configs import bert as bert_configs
  model = encoders.build(bert_configs.get_config("tiny").model)
  params = encoders.init_params(model, jax.random.PRNGKey(0))
  params = dict(params, extra={"kernel": np.zeros((2, 2), np.float32)})
  with pytest.raises(ValueError, match="extra/kernel"):
    encoders.to_hf(model, params, str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()
