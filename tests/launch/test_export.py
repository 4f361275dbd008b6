"""launch.export: a jax.export artifact that a fresh process, which never imports
encoders, deserializes and runs at several shapes, matching `apply` to 1e-5."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import encoders
from launch import export as export_lib
from tests.encoders import family_dirs as F

SERVE = r"""
import sys
import numpy as np
import jax
from jax import export
artifact, inputs, out = sys.argv[1:4]
exp = export.deserialize(bytearray(open(artifact, "rb").read()))
x = np.load(inputs)
results = {}
for tag in sorted({k.split("_")[0] for k in x.files}):
  o = exp.call(*(x[f"{tag}_{k}"] for k in ("ids", "mask", "types")))
  results.update({f"{tag}_{k}": np.asarray(v) for k, v in o.items()})
np.savez(out, **results)
leaked = sorted(m for m in sys.modules if m == "encoders" or m.startswith("encoders."))
assert not leaked, leaked
print(" ".join(exp.platforms))
"""


def _inputs(shapes, vocab=90, seed=0):
  rng = np.random.RandomState(seed)
  out = {}
  for i, (b, t) in enumerate(shapes):
    ids = rng.randint(3, vocab, size=(b, t)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[0, t // 2:] = 0
    out.update({f"s{i}_ids": ids, f"s{i}_mask": mask, f"s{i}_types": np.zeros_like(ids)})
  return out


def _serve_in_fresh_process(tmp_path, artifact, inputs):
  np.savez(tmp_path / "inputs.npz", **inputs)
  script = tmp_path / "serve.py"
  script.write_text(SERVE)
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
  env["JAX_PLATFORMS"] = "cpu"
  run = subprocess.run([sys.executable, str(script), str(artifact),
                        str(tmp_path / "inputs.npz"), str(tmp_path / "out.npz")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
  assert run.returncode == 0, run.stderr[-3000:]
  return np.load(tmp_path / "out.npz"), run.stdout.split()


@pytest.mark.parametrize("model_type", F.params())
def test_exported_artifact_serves_dynamic_shapes_without_encoders(model_type, tmp_path):
  path = F.tiny_dir(model_type)
  artifact = tmp_path / "model.jaxexport"
  assert export_lib.main(["--from", path, "--out", str(artifact)]) == 0
  meta = json.loads((tmp_path / "model.jaxexport.json").read_text())
  assert meta["inputs"]["input_ids"]["shape"] == ["b", "t"]
  assert "cpu" in meta["platforms"]
  # every requested platform is either in the artifact or recorded with its reason
  assert set(meta["platforms"]) | set(meta["platforms_failed"]) == {"cpu", "cuda", "tpu"}
  inputs = _inputs([(2, 7), (3, 16)])
  got, platforms = _serve_in_fresh_process(tmp_path, artifact, inputs)
  assert platforms == meta["platforms"]
  model, params = encoders.from_hf(path)
  fn = jax.jit(lambda p, i, m, t: model.apply({"params": p}, i, m, t))
  for s in ("s0", "s1"):
    ref = fn(params, inputs[f"{s}_ids"], inputs[f"{s}_mask"], inputs[f"{s}_types"])
    names = [k for k in ref.__dataclass_fields__ if getattr(ref, k) is not None]
    assert sorted(f"{s}_{k}" for k in names) == sorted(k for k in got.files if
                                                        k.startswith(s + "_"))
    for k in names:
      np.testing.assert_allclose(got[f"{s}_{k}"], np.asarray(getattr(ref, k)), atol=1e-5,
                                 rtol=1e-5, err_msg=f"{s} {k}")


def test_fixed_shapes_and_bad_arguments(tmp_path):
  path = F.tiny_dir("bert")
  meta = export_lib.export(path, str(tmp_path / "fixed.jaxexport"), batch="2", seq="8",
                           platforms=["cpu"])
  assert meta["inputs"]["input_ids"]["shape"] == ["2", "8"]
  assert meta["platforms"] == ["cpu"] and meta["platforms_failed"] == {}
  assert meta["outputs"]["last_hidden_state"]["shape"] == ["2", "8", "32"]
  with pytest.raises(ValueError, match="exceeds the model's maximum length 40"):
    export_lib.export(path, str(tmp_path / "x"), seq="41", platforms=["cpu"])
  with pytest.raises(ValueError, match="--batch must be 'dynamic' or a positive integer"):
    export_lib.export(path, str(tmp_path / "x"), batch="many", platforms=["cpu"])
  with pytest.raises(ValueError, match="unknown \\['metal'\\]"):
    export_lib.export(path, str(tmp_path / "x"), platforms=["metal"])
  assert export_lib.main(["--from", path, "--out", str(tmp_path / "x"), "--seq", "0"]) == 2


def test_out_that_is_not_our_artifact_is_refused_before_loading(tmp_path):
  from encoders.outdir import OutputDirError
  user = tmp_path / "model.jaxexport"
  user.write_text("my file")
  missing = str(tmp_path / "no_such_model")  # never read: the check comes first
  with pytest.raises(OutputDirError, match="exists and is not an artifact launch.export wrote"):
    export_lib.export(missing, str(user), platforms=["cpu"])
  assert user.read_text() == "my file"
  side = tmp_path / "b.jaxexport.json"
  side.write_text('{"mine": 1}')  # the metadata path is someone else's file
  with pytest.raises(OutputDirError):
    export_lib.export(missing, str(tmp_path / "b.jaxexport"), platforms=["cpu"])
  assert side.read_text() == '{"mine": 1}'
  (tmp_path / "dir").mkdir()
  assert export_lib.main(["--from", missing, "--out", str(tmp_path / "dir")]) == 2
  assert sorted(os.listdir(tmp_path)) == ["b.jaxexport.json", "dir", "model.jaxexport"]


def test_export_replaces_its_own_artifact_and_a_crash_keeps_the_old_one(tmp_path,
                                                                         monkeypatch):
  path = F.tiny_dir("bert")
  out = str(tmp_path / "m.jaxexport")
  meta = export_lib.export(path, out, batch="2", seq="8", platforms=["cpu"])
  assert meta["writer"] == "launch.export"
  export_lib.export(path, out, batch="2", seq="4", platforms=["cpu"])  # replaced
  with open(out + ".json") as f:
    assert json.load(f)["inputs"]["input_ids"]["shape"] == ["2", "4"]
  before = open(out, "rb").read(), open(out + ".json", "rb").read()

  def crash(*args, **kwargs):
    raise OSError("No space left on device")
  for target, name in ((export_lib.json, "dumps"), (export_lib.os, "replace")):
    with monkeypatch.context() as m:  # the metadata fails / the rename fails
      m.setattr(target, name, crash)
      with pytest.raises(OSError, match="No space"):
        export_lib.export(path, out, batch="2", seq="8", platforms=["cpu"])
    assert (open(out, "rb").read(), open(out + ".json", "rb").read()) == before
    assert sorted(os.listdir(tmp_path)) == ["m.jaxexport", "m.jaxexport.json"]
