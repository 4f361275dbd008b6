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
Not here: Table 5's "Replace MLM" and "All-Tokens MLM" need an MLM objective over generator
samples, which is not implemented. Results are not bundled: run each setting with the same
size and steps and compare the held-out metrics (python -m launch.rtd_eval --workdir DIR).
"""
from configs import common
from configs import electra

GENERATOR_WIDTHS = {"gen_1_8": 0.125, "gen_1_4": 0.25, "gen_1_2": 0.5, "gen_1": 1.0}
SETTINGS = tuple(GENERATOR_WIDTHS) + ("share_none", "share_tied", "share_gdes", "electra_15")


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
  return c.lock()
