"""ALBERT ablations (Lan et al. 2020) as config variants of configs/albert.py.

  python -m launch.pretrain --config configs/ablations/albert.py:tiny,setting=nsp \\
      --workdir /tmp/albert_nsp

settings:
  sop          as published: MLM + sentence-order prediction (Table 5 "SOP").
  nsp          MLM + next-sentence prediction on BERT's NSP pairs, scored by the same pair
               classifier (the model's "sop" head: objective.pair_head) (Table 5 "NSP").
  none         MLM only on the same pair inputs (Table 5 "None").
  not_shared   every layer its own parameters (num_hidden_groups = layers) (Table 4
               "not-shared"; the default is "all-shared").
  e<N>         embedding size E = N, e.g. e32, e128, e768 (Table 3).
Not here: Table 4's "shared-attention" and "shared-FFN" (the model shares whole layers).
"""
from configs import albert
from configs import common

SETTINGS = ("sop", "nsp", "none", "not_shared")


def get_config(arg="tiny,setting=sop"):
  a = common.parse_arg(arg, variant="tiny", setting="sop")
  if a.setting not in SETTINGS and not (a.setting[:1] == "e" and a.setting[1:].isdigit()):
    raise ValueError(f"unknown setting {a.setting!r}; choose from {SETTINGS} or e<N>")
  c = albert.get_config(a.variant).unlock()
  c.objective.pair_head = ""  # "" = the pair task's own head
  if a.setting == "nsp":
    c.objective.name = "mlm_nsp"
    c.objective.pair_head = "sop"  # ALBERT has one pair classifier; NSP trains it
    c.data.pair_task = "nsp"
  elif a.setting == "none":
    c.objective.name = "mlm"
    c.model.heads = ("mlm",)
  elif a.setting == "not_shared":
    c.model.num_hidden_groups = c.model.num_hidden_layers
  elif a.setting.startswith("e"):
    c.model.embedding_size = int(a.setting[1:])
  return c.lock()
