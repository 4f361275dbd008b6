"""Study: ModernBERT (Warner et al. 2024) — alternating local/global attention against
global attention in every layer, and the masking rate (30% vs BERT's 15%).

  python -m launch.ablate --config configs/ablations/study_modernbert.py --workdir DIR

Arms (configs/ablations/modernbert.py). Paper numbers: not checked (the paper reports
these choices in its design discussion, not as one ablation table).
"""
from configs.ablations import studies as S

M = "configs/ablations/modernbert.py:{variant},setting="


def get_config():
  nc = (S.NOT_CHECKED,)
  return S.study(
      "modernbert", "ModernBERT (Warner et al. 2024)", "design choices",
      "local/global attention and a 30% masking rate: what do they cost or buy?",
      [("paper", S.arm(M + "paper", "ModernBERT", "global every 3rd layer, 30% masking", nc)),
       ("global_every_layer", S.arm(M + "global_every_layer", "global everywhere", "", nc)),
       ("mask15", S.arm(M + "mask15", "15% masking", "", nc))],
      paper_columns=("downstream",))
