"""launch.convert: a work directory's checkpoint (any step) -> HF; HF -> an Orbax
directory that from_hf and the trainer's init_from read; and back, bit for bit."""
import os
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

import encoders
from launch import convert
from launch import trainer as train
from objectives import pretrained
from tests.encoders import family_dirs as F
from tests.launch.train_helpers import small_config


def _tensors(path):
  return load_file(os.path.join(path, "model.safetensors"))


def _same_tensors(a, b):
  ta, tb = _tensors(a), _tensors(b)
  assert sorted(ta) == sorted(tb)
  for k in ta:
    assert ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape, k
    np.testing.assert_array_equal(ta[k], tb[k], err_msg=k)


def _same_params(a, b):
  fa = jax.tree_util.tree_flatten_with_path(a)[0]
  fb = jax.tree_util.tree_flatten_with_path(b)[0]
  assert [p for p, _ in fa] == [p for p, _ in fb]
  for (p, x), (_, y) in zip(fa, fb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=str(p))


@pytest.mark.parametrize("model_type", F.params())
def test_hf_to_orbax_and_back_is_exact(model_type, tmp_path):
  src = str(shutil.copytree(F.tiny_dir(model_type), tmp_path / "src"))
  with open(os.path.join(src, "tokenizer.json"), "w") as f:
    f.write("{}")  # a side file must travel along
  orbax_dir, back = str(tmp_path / "orbax"), str(tmp_path / "back")
  assert convert.main(["--from", src, "--out", orbax_dir]) == 0
  assert convert.kind_of(orbax_dir) == "orbax" and convert.kind_of(src) == "hf"
  assert os.path.isfile(os.path.join(orbax_dir, "tokenizer.json"))
  assert not os.path.exists(os.path.join(orbax_dir, "model.safetensors"))
  # from_hf reads the Orbax directory like the HF one, also onto a mesh
  model, ref = encoders.from_hf(src)
  _, got = encoders.from_hf(orbax_dir)
  _same_params(ref, got)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:8]).reshape(2, 2, 2),
                           ("data", "fsdp", "tensor"))
  _, sharded = encoders.from_hf(orbax_dir, mesh=mesh, vocab_pad_multiple=8)
  _, sharded_hf = encoders.from_hf(src, mesh=mesh, vocab_pad_multiple=8)
  _same_params(sharded_hf, sharded)
  for x, y in zip(jax.tree.leaves(sharded), jax.tree.leaves(sharded_hf)):
    assert x.sharding.is_equivalent_to(y.sharding, x.ndim)
  assert convert.main(["--from", orbax_dir, "--out", back]) == 0
  _same_tensors(src, back)
  assert os.path.isfile(os.path.join(back, "tokenizer.json"))
  _, again = encoders.from_hf(back)
  _same_params(ref, again)


def test_init_from_an_orbax_directory_places_the_weights_on_the_run_shardings(tmp_path):
  """The trainer's init_from hook (objectives/pretrained.load_into) on a converted
  directory: every tensor lands on the run's sharding."""
  src = F.tiny_dir("bert")
  orbax_dir = str(tmp_path / "orbax")
  convert.hf_to_orbax(src, orbax_dir)
  model, ref = encoders.from_hf(src)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:4]).reshape(1, 2, 2),
                           ("data", "fsdp", "tensor"))
  P = jax.sharding.PartitionSpec

  def sharding(x):  # rows over fsdp where they divide, else replicated
    split = x.ndim and x.shape[0] % 2 == 0
    return jax.sharding.NamedSharding(mesh, P("fsdp") if split else P())
  shardings = jax.tree.map(sharding, ref)
  fresh = jax.tree.map(lambda x, s: jax.device_put(np.zeros(x.shape, x.dtype), s), ref,
                       shardings)
  out = pretrained.load_into(orbax_dir, fresh, shardings, model.config)
  _same_params(ref, out)
  for x, s in zip(jax.tree.leaves(out), jax.tree.leaves(shardings)):
    assert x.sharding.is_equivalent_to(s, x.ndim)


def test_bad_arguments_are_named(tmp_path):
  src = F.tiny_dir("bert")
  with pytest.raises(ValueError, match="not a training work directory"):
    convert.convert(str(tmp_path), str(tmp_path / "x"))
  with pytest.raises(ValueError, match="--step applies to a training work directory"):
    convert.convert(src, str(tmp_path / "x"), step=3)
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "f").write_text("x")
  with pytest.raises(ValueError, match="non-empty directory this project did not write"):
    convert.convert(src, str(tmp_path / "full"))
  assert os.listdir(tmp_path / "full") == ["f"]
  assert convert.main(["--from", str(tmp_path), "--out", str(tmp_path / "y")]) == 2


@pytest.fixture(scope="module")
def trained_workdir(tmp_path_factory):
  """A tiny BERT run of 4 steps with checkpoints at steps 2 and 4."""
  wd = str(tmp_path_factory.mktemp("run") / "wd")
  c = small_config(train__steps=4, checkpoint__every=2, train__eval_every=4,
                   train__eval_batches=1, data__max_documents=40, data__global_batch=8)
  c.checkpoint.keep = 3
  c.checkpoint.use_async = False
  train.train_and_evaluate(c, wd, jax.devices()[:1])
  return wd


@pytest.mark.slow  # trains a tokenizer and a tiny model first (minutes on a loaded machine)
def test_workdir_checkpoint_of_any_step_to_hf(trained_workdir, tmp_path):
  latest, step2 = str(tmp_path / "latest"), str(tmp_path / "step2")
  assert convert.main(["--from", trained_workdir, "--out", latest]) == 0
  assert convert.main(["--from", trained_workdir, "--step", "2", "--out", step2]) == 0
  # the latest checkpoint converts to exactly what the trainer exported at the end
  _same_tensors(os.path.join(trained_workdir, "hf"), latest)
  assert sorted(os.listdir(latest)) == sorted(os.listdir(os.path.join(trained_workdir, "hf")))
  a, b = _tensors(latest), _tensors(step2)
  assert any(not np.array_equal(a[k], b[k]) for k in a)  # a different step's weights
  with pytest.raises(ValueError, match=r"no checkpoint of step 3 .*steps: \[2, 4\]"):
    convert.convert(trained_workdir, str(tmp_path / "x"), step=3)
  # and on to Orbax and back, exactly
  orbax_dir, back = str(tmp_path / "orbax"), str(tmp_path / "back")
  convert.convert(step2, orbax_dir)
  convert.convert(orbax_dir, back)
  _same_tensors(step2, back)
  shutil.rmtree(orbax_dir)


def _fake_workdir(path, mark):
  """What a run's work directory holds that convert must never delete."""
  from encoders import outdir
  os.makedirs(os.path.join(path, "checkpoints", "4", "state"))
  with open(os.path.join(path, "checkpoints", "4", "state", "data"), "w") as f:
    f.write("weights")
  with open(os.path.join(path, "config.json"), "w") as f:
    f.write("{}")
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.write('{"step": 4}\n')
  if mark:
    outdir.write_marker(path, "training work directory")
  return sorted(os.path.relpath(os.path.join(r, n), path)
                for r, ds, fs in os.walk(path) for n in ds + fs)


@pytest.mark.parametrize("mark", [False, True])
def test_out_pointed_at_a_work_directory_is_refused_and_nothing_deleted(tmp_path, mark):
  from encoders import outdir
  src = F.tiny_dir("bert")
  wd = str(tmp_path / "run")
  before = _fake_workdir(wd, mark)
  other = str(tmp_path / "other")
  _fake_workdir(other, False)
  for source in (src, other):  # HF -> Orbax, and another work directory's export
    with pytest.raises(outdir.OutputDirError, match=rf"--out {wd} is a training work "
                                                    r"directory"):
      convert.convert(source, wd)
    assert convert.main(["--from", source, "--out", wd]) == 2
  after = sorted(os.path.relpath(os.path.join(r, n), wd)
                 for r, ds, fs in os.walk(wd) for n in ds + fs)
  assert after == before
  with open(os.path.join(wd, "checkpoints", "4", "state", "data")) as f:
    assert f.read() == "weights"
  assert sorted(os.listdir(tmp_path)) == ["other", "run"]  # no temporary left behind


def test_out_pointed_at_a_user_directory_or_into_the_source_is_refused(tmp_path):
  from encoders import outdir
  src = str(shutil.copytree(F.tiny_dir("bert"), tmp_path / "src"))
  user = tmp_path / "mine"
  user.mkdir()
  (user / "model.safetensors").write_text("not ours")  # even an HF-looking directory
  with pytest.raises(outdir.OutputDirError, match="did not write"):
    convert.convert(src, str(user))
  assert (user / "model.safetensors").read_text() == "not ours"
  with pytest.raises(outdir.OutputDirError, match="holds it"):
    convert.convert(src, str(tmp_path))  # --out a directory holding --from


def test_convert_replaces_its_own_earlier_output_atomically(tmp_path, monkeypatch):
  src = F.tiny_dir("bert")
  orbax_dir, back = str(tmp_path / "orbax"), str(tmp_path / "back")
  convert.convert(src, orbax_dir)
  convert.convert(src, orbax_dir)  # its own output: replaced
  convert.convert(orbax_dir, back)
  before = _tensors(back)
  import safetensors.numpy as stn

  def crash(*args, **kwargs):
    raise OSError("No space left on device")
  monkeypatch.setattr(stn, "save_file", crash)
  with pytest.raises(OSError, match="No space"):
    convert.convert(orbax_dir, back)
  after = _tensors(back)  # the earlier output is whole
  assert sorted(before) == sorted(after)
  for k in before:
    np.testing.assert_array_equal(before[k], after[k])
  assert sorted(os.listdir(tmp_path)) == ["back", "orbax"]


def test_rtd_eval_refuses_a_directory_that_is_not_a_run(tmp_path):
  from launch import rtd_eval
  (tmp_path / "notes.txt").write_text("x")
  with pytest.raises(ValueError, match=r"not a training work directory \(no config.json\)"):
    rtd_eval.report(str(tmp_path))
  assert os.listdir(tmp_path) == ["notes.txt"]  # nothing cached into it


def test_a_converted_directory_with_nonfinite_params_is_refused(tmp_path):
  import orbax.checkpoint as ocp
  src = F.tiny_dir("bert")
  orbax_dir = str(tmp_path / "orbax")
  convert.hf_to_orbax(src, orbax_dir)
  _, params = encoders.from_hf(src, scan_layers=False, vocab_pad_multiple=1)
  params = jax.tree.map(np.array, jax.device_get(params))
  params["encoder"]["layer_0"]["mlp"]["wi"]["bias"][3] = np.inf
  item = os.path.join(orbax_dir, "params")
  shutil.rmtree(item)
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(item, params)
    ckpt.wait_until_finished()
  with pytest.raises(ValueError, match=r"orbax/params: param 'encoder/layer_0/mlp/wi/bias' "
                                       "holds non-finite"):
    encoders.from_hf(orbax_dir)
  _, got = encoders.from_hf(orbax_dir, allow_nonfinite=True)
  assert np.isinf(np.asarray(got["encoder"]["layer_0"]["mlp"]["wi"]["bias"][3]))
  assert convert.main(["--from", orbax_dir, "--out", str(tmp_path / "back")]) == 2
  assert not os.path.exists(tmp_path / "back")
