"""Study: ELECTRA (Clark et al. 2020), Figure 3 (left) and Section 3.2 — generator size
and embedding sharing (with DeBERTaV3's gradient-disentangled sharing, He et al. 2023).

  python -m launch.ablate --config configs/ablations/study_electra_generator.py --workdir DIR

Arms (configs/ablations/electra.py): generator width 1/8, 1/4, 1/2, 1 of the
discriminator's (tied embeddings); sharing none / tied / GDES at width 1/4. The
paper's Section 3.2 GLUE scores for weight tying are given; Figure 3's are read off a
plot: not checked.
"""
from configs.ablations import studies as S

E = "configs/ablations/electra.py:{variant},setting="


def get_config():
  nc = (S.NOT_CHECKED,)
  return S.study(
      "electra_generator", "ELECTRA (Clark et al. 2020)", "Figure 3 / Section 3.2",
      "how big should the generator be, and what should it share?",
      [("gen_1_8", S.arm(E + "gen_1_8", "generator 1/8", "", nc)),
       ("gen_1_4", S.arm(E + "gen_1_4", "generator 1/4", "tied", nc)),
       ("gen_1_2", S.arm(E + "gen_1_2", "generator 1/2", "", nc)),
       ("gen_1", S.arm(E + "gen_1", "generator 1", "", nc)),
       ("share_none", S.arm(E + "share_none", "no tying", "width 1/4", ("83.6",))),
       ("share_gdes", S.arm(E + "share_gdes", "GDES", "DeBERTaV3's sharing", nc))],
      paper_columns=("GLUE dev",), mlm=False,
      not_run=("tying all weights (paper: 84.4; generator = discriminator size): "
               "the gen_1 arm ties embeddings only.",))
