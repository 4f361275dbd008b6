"""ModernBERT ablations (Warner et al. 2024), as config variants of configs/modernbert.py.

  python -m launch.pretrain \\
      --config configs/ablations/modernbert.py:tiny,setting=global_every_layer \\
      --workdir /tmp/mb_ablation_global

settings:
  paper               as published: global attention every third layer (a 128-token window
                      in between; 64 in the tiny variant), 30% masking.
  global_every_layer  global attention in every layer (no sliding window anywhere).
  mask15              15% masking, BERT's rate (the paper trains with 30%).
Results are not bundled: run each setting with the same size and steps and compare the
held-out metrics in <workdir>/metrics.jsonl.
"""
from configs import common
from configs import modernbert

SETTINGS = ("paper", "global_every_layer", "mask15")


def get_config(arg="tiny,setting=paper"):
  a = common.parse_arg(arg, variant="tiny", setting="paper")
  if a.setting not in SETTINGS:
    raise ValueError(f"unknown setting {a.setting!r}; choose from {SETTINGS}")
  over = {"global_every_layer": ",every_n=1", "mask15": ",mask_rate=0.15"}.get(a.setting, "")
  return modernbert.get_config(a.variant + over)
