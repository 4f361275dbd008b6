"""DistilBERT's loss and init ablations (Sanh et al. 2019, Table 4), as config variants of
configs/distilbert.py: each removes one ingredient of the triple loss, or the init from
teacher layers.

  python -m launch.pretrain \\
      --config configs/ablations/distilbert_table4.py:tiny,setting=no_cos \\
      --config.objective.teacher=runs/bert_tiny --workdir runs/ablation_no_cos

settings (Table 4's rows):
  full         the triple loss 5 KL + 2 MLM + 1 cosine, student from teacher layers
  no_cos       "- L_cos": alpha_cos = 0
  no_mlm       "- L_mlm": alpha_mlm = 0
  no_ce        "- L_ce": alpha_ce = 0 (no soft targets)
  random_init  "Triple loss + random weights initialization"
  mse          not a Table 4 row: the MSE-on-logits option in place of the KL term
The paper reports GLUE macro-scores relative to the full recipe; here compare held-out
MLM accuracy and teacher agreement in <workdir>/metrics.jsonl at equal steps. With a
teacher of fewer than 2 x (student layers) layers, "every other layer" does not exist and
`full` falls back to random init too (the log says so): set
--config.objective.student_init=0,1 (explicit teacher layers) for such pairs.
"""
from configs import common
from configs import distilbert

SETTINGS = ("full", "no_cos", "no_mlm", "no_ce", "random_init", "mse")


def get_config(arg="tiny,setting=full"):
  a = common.parse_arg(arg, variant="tiny", setting="full")
  if a.setting not in SETTINGS:
    raise ValueError(f"unknown setting {a.setting!r}; choose from {SETTINGS}")
  if a.variant not in ("tiny", "paper"):
    raise ValueError(f"distillation ablations take variant tiny or paper, got {a.variant!r}")
  c = distilbert.get_config(a.variant).unlock()
  o = c.objective
  if a.setting == "no_cos":
    o.alpha_cos = 0.0
  elif a.setting == "no_mlm":
    o.alpha_mlm = 0.0
  elif a.setting == "no_ce":
    o.alpha_ce = 0.0
  elif a.setting == "random_init":
    o.student_init = "random"
  elif a.setting == "mse":
    o.alpha_mse, o.alpha_ce = o.alpha_ce, 0.0
  return c.lock()
