"""ELECTRA ablations (Clark et al. 2020), as config variants of configs/electra.py.

  python -m launch.pretrain --config configs/ablations/electra.py:tiny,setting=gen_1_2 \
      --workdir /tmp/electra_gen_1_2

settings:
  gen_1_8, gen_1_4, gen_1_2, gen_1   generator width (hidden, FFN, heads) 1/8, 1/4, 1/2, 1
             of the discriminator's (Figure 3, left: generator size).
  share_none, share_tied, share_gdes  embedding sharing (Section 3.2 "Weight Sharing": none
             vs tied token and position embeddings; gdes: DeBERTaV3's gradient-disentangled
             sharing, He et al. 2021, Table 2).
  electra_15  the discriminator loss on the masked (15%) positions only (Table 5,
             "ELECTRA 15%").
  replace_mlm     Table 5 "Replace MLM": the second network is trained with MLM at the
             masked positions, which hold generator samples instead of [MASK]
             (objectives/rtd_mlm.py, objective.mlm_targets="masked").
  all_tokens_mlm  Table 5 "All-Tokens MLM": MLM of the original token at every real
             position of the corrupted input, with the paper's copy gate (the "rtd" head
             as a sigmoid mixing the input token into the softmax; mlm_targets="all",
             copy_gate=True).
The two MLM settings weight the second network's loss 1 (disc_weight=1: both terms are
cross-entropies; the paper gives no weight). Results are not bundled: run each setting
with the same size and steps and compare the held-out metrics (for the RTD settings,
python -m launch.rtd_eval --workdir DIR).
"""
from configs import common
from configs import electra

GENERATOR_WIDTHS = {"gen_1_8": 0.125, "gen_1_4": 0.25, "gen_1_2": 0.5, "gen_1": 1.0}
MLM_SETTINGS = {"replace_mlm": ("masked", False), "all_tokens_mlm": ("all", True)}
SETTINGS = (tuple(GENERATOR_WIDTHS) + ("share_none", "share_tied", "share_gdes", "electra_15")
            + tuple(MLM_SETTINGS))


def get_config(arg="tiny,setting=gen_1_4"):
  a = common.parse_arg(arg, variant="tiny", setting="gen_1_4")
  if a.setting not in SETTINGS:
    raise ValueError(f"unknown setting {a.setting!r}; choose from {SETTINGS}")
  c = electra.get_config(a.variant).unlock()
  if a.setting in GENERATOR_WIDTHS:
    c.objective.generator_width = GENERATOR_WIDTHS[a.setting]
  elif a.setting.startswith("share_"):
    c.objective.sharing = a.setting[len("share_"):]
  elif a.setting == "electra_15":
    c.objective.rtd_positions = "masked"
  elif a.setting in MLM_SETTINGS:
    targets, copy_gate = MLM_SETTINGS[a.setting]
    c.objective.name = "replaced_mlm"
    c.objective.mlm_targets = targets
    c.objective.copy_gate = copy_gate
    c.objective.disc_weight = 1.0
    c.model.heads = ("mlm", "rtd") if copy_gate else ("mlm",)
  return c.lock()
