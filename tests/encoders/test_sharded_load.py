"""from_hf(..., mesh=): params streamed from safetensors straight onto a mesh, for every
registered model type; each device's shard read by itself where the layout allows."""
import os

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import encoders
from encoders.hf import stream
from encoders.sharding_rules import DEFAULT_RULES
from tests.encoders import family_dirs as F


def _mesh(shape=(2, 2, 2)):
  n = int(np.prod(shape))
  return Mesh(np.asarray(jax.devices()[:n]).reshape(shape), ("data", "fsdp", "tensor"))


def _flat(tree):
  return {"/".join(str(k.key) for k in p): v
          for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _expected_shardings(model, mesh, rules=DEFAULT_RULES):
  boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0),
                                            np.zeros((1, 8), np.int32)))["params"]
  return _flat(nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules))


def _same(a, b):
  fa, fb = _flat(a), _flat(b)
  assert sorted(fa) == sorted(fb)
  for k in fa:
    np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), err_msg=k)


@pytest.mark.parametrize("model_type", F.model_types())
def test_sharded_load_places_every_param_and_matches_host_load(model_type):
  path = F.tiny_dir(model_type)
  mesh = _mesh()
  model, host = encoders.from_hf(path, **F.PAD)
  model_s, sharded = encoders.from_hf(path, mesh=mesh, **F.PAD)
  _same(host, sharded)
  want = _expected_shardings(model_s, mesh)
  n_split = 0
  for key, x in _flat(sharded).items():
    assert isinstance(x, jax.Array) and x.sharding.is_equivalent_to(want[key], x.ndim), key
    n_split += not x.sharding.is_fully_replicated
  assert n_split > 10  # embeddings, every kernel: really sharded, not replicated
  ids = np.arange(2 * 9).reshape(2, 9) % 90 + 3
  a = model.apply({"params": host}, ids).last_hidden_state
  b = jax.jit(lambda p: model_s.apply({"params": p}, ids).last_hidden_state)(sharded)
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.mark.parametrize("model_type", F.model_types())
def test_each_shard_reads_only_its_part(model_type, monkeypatch):
  """With whole heads per shard, no read of a sharded tensor is the whole tensor."""
  path = F.tiny_dir(model_type)
  reads = []
  real = stream.Tensors.read

  def spy(self, key, index=None):
    out = real(self, key, index)
    reads.append((key, out.size, int(np.prod(self.shape(key)))))
    return out
  monkeypatch.setattr(stream.Tensors, "read", spy)
  _, params = encoders.from_hf(path, mesh=_mesh((1, 4, 2)), **F.PAD)
  sharded = {k for k, x in _flat(params).items() if not x.sharding.is_fully_replicated}
  assert len(sharded) > 10
  whole = {k for k, size, full in reads if size == full and full > 1}
  partial = {k for k, size, full in reads if size < full}
  # every HF tensor behind a sharded param was read in parts only
  assert len(partial) >= len(sharded) - 2, (len(partial), len(sharded))
  assert not (partial & whole), sorted(partial & whole)


def test_shards_that_are_not_one_block_fall_back_to_a_whole_read():
  """Rules that split the head dim (kv) make a shard that is not one range of HF's
  (H*K, D) rows: the tensor is then converted whole once and cut; values still exact."""
  path = F.tiny_dir("bert")
  rules = tuple((n, "tensor" if n == "kv" else (None if n == "heads" else a))
                for n, a in DEFAULT_RULES)
  mesh = _mesh((1, 2, 4))
  _, host = encoders.from_hf(path, **F.PAD)
  _, sharded = encoders.from_hf(path, mesh=mesh, rules=rules, **F.PAD)
  _same(host, sharded)
  q = sharded["encoder"]["layer_0"]["attention"]["query"]["kernel"]
  assert q.sharding.spec == P("fsdp", None, "tensor")


@pytest.mark.parametrize("model_type", ["bert", "albert"])
def test_scanned_layers_are_stacked_onto_the_mesh(model_type):
  path = F.tiny_dir(model_type)
  mesh = _mesh()
  _, host = encoders.from_hf(path, scan_layers=True, **F.PAD)
  model, sharded = encoders.from_hf(path, mesh=mesh, scan_layers=True, **F.PAD)
  _same(host, sharded)
  want = _expected_shardings(model, mesh)
  for key, x in _flat(sharded).items():
    assert x.sharding.is_equivalent_to(want[key], x.ndim), key


def test_explicit_shardings_override_the_rules():
  path = F.tiny_dir("bert")
  mesh = _mesh()
  model, _ = encoders.from_hf(path, **F.PAD)
  word = NamedSharding(mesh, P(("data", "fsdp", "tensor"), None))
  tree = {"embeddings": {"word_embeddings": {"embedding": word}}}
  _, params = encoders.from_hf(path, shardings=tree, **F.PAD)
  emb = params["embeddings"]["word_embeddings"]["embedding"]
  assert emb.sharding == word and len({str(s.index) for s in emb.addressable_shards}) == 8
  # the rest follow the default rules on the same mesh
  other = params["embeddings"]["norm"]["scale"]
  assert other.sharding == NamedSharding(mesh, P("fsdp"))


def test_param_dtype_and_the_checks_of_the_host_path(tmp_path):
  path = F.tiny_dir("bert")
  _, params = encoders.from_hf(path, mesh=_mesh(), param_dtype="bfloat16", **F.PAD)
  assert {x.dtype for x in jax.tree.leaves(params)} == {np.dtype("bfloat16")}
  # a mis-shaped tensor is named before anything is placed
  from safetensors.numpy import load_file, save_file
  import shutil
  bad = tmp_path / "bad"
  shutil.copytree(path, bad)
  t = load_file(bad / "model.safetensors")
  key = next(k for k in t if k.endswith("layer.0.attention.self.query.weight"))
  t[key] = t[key][:, :-1].copy()
  save_file(t, bad / "model.safetensors", metadata={"format": "pt"})
  with pytest.raises(ValueError, match="query.weight.*has shape"):
    encoders.from_hf(str(bad), mesh=_mesh(), **F.PAD)


def test_header_reader_matches_safetensors(tmp_path):
  from safetensors.numpy import load_file
  path = F.tiny_dir("bert")
  ref = load_file(f"{path}/model.safetensors")
  t = stream.Tensors(path)
  assert sorted(t) == sorted(ref)
  for k, v in ref.items():
    np.testing.assert_array_equal(t[k], v)
    if v.ndim == 2:
      np.testing.assert_array_equal(t.read(k, (slice(1, 3), slice(0, 5))), v[1:3, :5])


@pytest.mark.slow  # three subprocesses and a ~230 MB checkpoint
def test_streamed_load_holds_about_no_more_than_the_placed_params(tmp_path):
  """docs/load_memory.py at 2 layers: the streamed load's peak host memory stays near the
  placed params' own (baseline), the old whole-file path's goes a checkpoint above."""
  import json
  import subprocess
  import sys
  script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))), "docs", "load_memory.py")
  out = tmp_path / "rows.json"
  run = subprocess.run([sys.executable, script, "--dir", str(tmp_path / "ckpt"),
                        "--layers", "2", "--json", str(out)], capture_output=True,
                       text=True, timeout=1200)
  assert run.returncode == 0, run.stderr[-3000:]
  rows = {r["mode"]: r for r in json.loads(out.read_text())}
  size = rows["stream"]["checkpoint_mb"]
  assert rows["stream"]["placed_mb"] >= size * 0.99
  assert rows["stream"]["over_baseline_mb"] < 0.2 * size, rows
  assert rows["old"]["over_baseline_mb"] > 0.9 * size, rows
