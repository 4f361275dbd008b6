"""Every config file and variant loads, locks, and builds its model."""
import jax
import pytest

import encoders
from configs import bert, roberta
from configs.ablations import bert_pretraining


@pytest.mark.parametrize("setting", bert_pretraining.SETTINGS)
def test_ablation_settings(setting):
  c = bert_pretraining.get_config(f"tiny,setting={setting}")
  assert c.is_locked
  heads = ("mlm", "nsp") if setting in ("nsp", "wwm", "mask40") else ("mlm",)
  assert tuple(c.model.heads) == heads
  assert (c.objective.name == "mlm_nsp") == ("nsp" in heads)
  if setting == "wwm":
    assert c.objective.whole_word
  if setting == "mask40":
    from objectives import masking
    budget = masking.prediction_budget(c.objective.mask_rate, c.data.seq_len,
                                       c.objective.max_predictions)
    assert c.objective.mask_rate == 0.4 and budget >= 0.4 * c.data.seq_len
  model = encoders.build(c.model)
  jax.eval_shape(lambda: encoders.init_params(model, jax.random.PRNGKey(0)))


def test_locked_configs_refuse_unknown_keys():
  c = bert.get_config("tiny")
  with pytest.raises(AttributeError):
    c.model.not_a_field = 1
  with pytest.raises(ValueError, match="setting"):
    bert_pretraining.get_config("tiny,setting=bogus")


def test_main_job_trains_at_30_percent_and_is_scored_at_15():
  """The README's main job: tiny's model and optimizer, MLM alone on packed documents,
  masked at 30% in training and at 15% on the held-out batches; the README names it."""
  import pathlib
  from launch.perf import synthetic
  import objectives
  c, tiny = bert.get_config("tiny-mlm"), bert.get_config("tiny")
  assert c.is_locked and c.objective.name == "mlm" and tuple(c.model.heads) == ("mlm",)
  assert c.data.packing == "documents" and c.train.steps == 800
  for k in ("num_hidden_layers", "hidden_size", "initializer_range", "position_init"):
    assert c.model[k] == tiny.model[k]
  assert c.optimizer.to_dict() == tiny.optimizer.to_dict()
  assert (c.data.seq_len, c.data.global_batch) == (tiny.data.seq_len, tiny.data.global_batch)
  obj = objectives.get_objective(c, synthetic.SyntheticTokenizer.for_model(c.model))
  assert (obj.cfg.mask_rate, obj.eval_mask_rate) == (0.3, 0.15)
  assert (obj.max_predictions, obj.eval_max_predictions) == (20, 10)  # rows of 64
  readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
  assert "--config configs/bert.py:tiny-mlm --workdir runs/bert_tiny" in readme


def test_roberta_has_no_nsp():
  c = roberta.get_config("base")
  assert tuple(c.model.heads) == ("mlm",) and c.objective.name == "mlm"
  assert c.data.packing == "documents" and c.model.type_vocab_size == 1


def test_deberta_recipe_and_ablations_load_and_build():
  """Every DeBERTa ablation setting (and the v3 recipe it varies) loads, locks and builds
  (the generator too, for the RTD ones); the settings change what they name."""
  from configs import deberta
  from configs.ablations import deberta as ablations
  from objectives import rtd
  for setting in ablations.SETTINGS:
    variant = "v3-tiny" if setting in ablations.SHARING else "tiny"
    c = ablations.get_config(f"{variant},setting={setting}")
    assert c.is_locked
    models = [c.model]
    if c.objective.name == "rtd":
      models.append(rtd.generator_config(c.model, c.objective))
    for m in models:
      model = encoders.build(m)
      if "rtd" in m.heads:  # the discriminator: the objective adds the RTD head
        model = rtd.with_rtd_head(model)
      p = jax.eval_shape(lambda mod=model: encoders.init_params(mod, jax.random.PRNGKey(0)))
      p = p.get("params", p)
      assert ("rel_embeddings" in p) == (setting != "no_relative"), setting
      assert ("position_embeddings" in p["embeddings"]) == (
          setting in ("no_relative", "absolute_input")), setting
    if setting in ablations.SHARING:
      assert c.objective.sharing == setting[len("share_"):]
  base = ablations.get_config("tiny,setting=paper")
  assert tuple(ablations.get_config("tiny,setting=no_c2p").model.pos_att_type) == ("p2c",)
  assert tuple(ablations.get_config("tiny,setting=no_p2c").model.pos_att_type) == ("c2p",)
  assert ablations.get_config("tiny,setting=no_buckets").model.position_buckets == 0
  assert base.model.position_buckets > 0 and len(base.model.pos_att_type) == 2
  with pytest.raises(ValueError, match="v3-"):
    ablations.get_config("tiny,setting=share_tied")
  for size in deberta.V1_SIZES:
    v1 = deberta.get_config(f"v1-{size}").model
    assert v1.family == "deberta" and v1.position_buckets <= 0 and not v1.share_att_key
    if size == "tiny":
      jax.eval_shape(lambda m=encoders.build(v1): encoders.init_params(
          m, jax.random.PRNGKey(0)))
  v3 = deberta.get_config("v3-base")
  assert (v3.objective.name, v3.objective.sharing, v3.objective.generator_depth,
          v3.objective.generator_width) == ("rtd", "gdes", 0.5, 1.0)
  assert v3.model.heads == ("rtd",) and v3.data.global_batch == 8192


def test_shipped_configs_load_by_name_from_any_directory(tmp_path, monkeypatch):
  """`--config bert:tiny`, `configs/bert.py:tiny` and `ablations/electra:...` find the
  shipped files from another directory; a file that exists where it is named wins."""
  import os
  from launch import cli
  from configs.ablations import electra as electra_ablations
  monkeypatch.chdir(tmp_path)
  shipped = os.path.join(cli.SHIPPED_CONFIGS, "bert.py")
  for name in ("bert", "bert.py", "configs/bert.py"):
    assert cli.config_path(name) == shipped
  assert cli.load_config("bert:tiny").to_dict() == bert.get_config("tiny").to_dict()
  spec = "ablations/electra:tiny,setting=gen_1_2"
  assert (cli.load_config(spec).to_dict()
          == electra_ablations.get_config("tiny,setting=gen_1_2").to_dict())
  (tmp_path / "mine.py").write_text(
      "import ml_collections\n"
      "def get_config(arg='a'):\n"
      "  return ml_collections.ConfigDict({'arg': arg})\n")
  assert cli.config_path("mine.py") == "mine.py" and cli.load_config("mine.py:b").arg == "b"
  with pytest.raises(cli.ConfigError, match="does not exist"):
    cli.config_path("not_a_config")


@pytest.mark.parametrize("spec, error", [
    ("bert:tiny", "did you mean train.steps"),  # found and loaded: the override is checked
    ("configs/bert.py:tinyx", "unknown BERT variant 'tinyx'"),  # loaded: its own error
    ("ablations/electra:tiny,setting=gen_1_2", "did you mean train.steps"),
    ("nope:tiny", "config file 'nope' does not exist"),
])
def test_entry_point_resolves_the_config_outside_the_checkout(tmp_path, spec, error):
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
  p = subprocess.run([sys.executable, "-m", "launch.preprocess", "--config", spec,
                      "--out", str(tmp_path / "out"), "--config.train.stepz=3"],
                     cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 2 and error in p.stderr, p.stderr[-2000:]
  assert not (tmp_path / "out").exists()
