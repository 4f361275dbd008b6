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


def test_roberta_has_no_nsp():
  c = roberta.get_config("base")
  assert tuple(c.model.heads) == ("mlm",) and c.objective.name == "mlm"
  assert c.data.packing == "documents" and c.model.type_vocab_size == 1
