"""Replaced-token detection through the one trainer: ELECTRA (tied embeddings) end to end
with held-out metrics, baselines, the held-out report (launch.rtd_eval) and an export that
transformers loads; BERT with GDES and a sharded mesh behind the slow marker."""
import os

import jax
import numpy as np
import pytest

from configs import bert as bert_configs
from configs import electra as electra_configs
from launch import trainer as train
from launch.trainer import metrics as metrics_lib
from tests.launch.train_helpers import copy_workdir, first_devices, small_config
from tests.launch.train_helpers import tokenizer_cache  # noqa: F401  (a fixture)


def _electra(**overrides):
  c = small_config(electra_configs, "tiny", train__steps=4, train__eval_every=2, **overrides)
  c.model.embedding_size = 32  # E != H
  c.model.num_attention_heads = 2
  c.tokenizer.lowercase = False  # share the cached test tokenizer
  return c


@pytest.mark.slow  # default-suite time; the feature keeps a faster test by default
def test_electra_rtd_trains_reports_and_exports(tmp_path, tokenizer_cache):  # noqa: F811
  wd = copy_workdir(tmp_path, "electra", tokenizer_cache)
  c = _electra()
  out = train.train_and_evaluate(c, wd, first_devices(1))
  ev = out["eval"]
  for key in ("mlm_accuracy", "rtd_loss", "rtd_accuracy", "rtd_replaced_accuracy",
              "rtd_flagged_accuracy", "rtd_fraction_replaced", "rtd_all_original_accuracy"):
    assert np.isfinite(ev[key]), key
  assert 0 < ev["rtd_fraction_replaced"] < 0.2
  records = metrics_lib.read(wd)
  run = [r for r in records if r.get("split") == "run"][0]
  obj = out["setup"].objective
  assert run["step_flops"] == c.data.global_batch * 3 * (
      obj.module_flops("generator", 32) + obj.module_flops("discriminator", 32))
  assert run["objective"]["shared"]  # tied tables
  base = [r for r in records if r.get("split") == "baseline"][0]
  assert base["mlm_count"] == ev["mlm_count"] > 0
  # Both collections trained; the discriminator has no word table of its own (tied).
  params = out["state"].params
  assert sorted(params) == ["discriminator", "generator"]
  assert "word_embeddings" not in params["discriminator"]["embeddings"]
  import transformers as T
  disc, info = T.ElectraForPreTraining.from_pretrained(os.path.join(wd, "hf"),
                                                       output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  _, info = T.ElectraForMaskedLM.from_pretrained(os.path.join(wd, "hf", "generator"),
                                                 output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  np.testing.assert_array_equal(
      disc.electra.embeddings.word_embeddings.weight.detach().numpy(),
      np.asarray(jax.device_get(
          params["generator"]["embeddings"]["word_embeddings"]["embedding"])))
  from launch import rtd_eval
  rep = rtd_eval.report(wd, first_devices(1))
  assert rep["step"] == 4 and 0 <= rep["auc"] <= 1
  np.testing.assert_allclose(rep["recall"], ev["rtd_replaced_accuracy"], atol=1e-6)
  np.testing.assert_allclose(rep["baseline_never_flag"]["accuracy"],
                             ev["rtd_all_original_accuracy"], atol=1e-6)


@pytest.mark.slow
def test_bert_gdes_on_a_mesh_matches_one_device(tmp_path, tokenizer_cache):  # noqa: F811
  """RTD on a BERT backbone with GDES (full-width, half-depth generator), on a 2x2x2 mesh,
  trains as on one device."""
  curves = {}
  for name, shape, n in (("one", (1, 1, 1), 1), ("mixed", (2, 2, 2), 8)):
    c = small_config(bert_configs, "tiny", mesh__shape=shape, train__steps=3,
                     checkpoint__every=100)
    c.model.heads = ("rtd",)
    c.data.packing = "documents"
    electra_configs.rtd_objective(c, "gdes", width=1.0, depth=0.5)
    wd = copy_workdir(tmp_path, name, tokenizer_cache)
    train.train_and_evaluate(c, wd, first_devices(n))
    curves[name] = [r["rtd_loss"] for r in metrics_lib.read(wd) if r.get("split") == "train"]
  assert len(curves["one"]) == 3
  np.testing.assert_allclose(curves["mixed"], curves["one"], rtol=1e-4)
