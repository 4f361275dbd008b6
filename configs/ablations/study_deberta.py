"""Study: DeBERTa (He et al. 2021), Table 5 — removing the enhanced mask decoder (-EMD),
the content-to-position (-C2P) or position-to-content (-P2C) attention terms.

  python -m launch.ablate --config configs/ablations/study_deberta.py --workdir DIR

Arms (configs/ablations/deberta.py): the full model, -EMD, -C2P, -P2C, and no relative
terms (BERT's attention on absolute positions). Paper numbers: not checked.
"""
from configs.ablations import studies as S

D = "configs/ablations/deberta.py:{variant},setting="


def get_config():
  nc = (S.NOT_CHECKED,)
  return S.study(
      "deberta_table5", "DeBERTa (He et al. 2021)", "Table 5",
      "which disentangled attention terms matter?",
      [("paper", S.arm(D + "paper", "DeBERTa", "c2p + p2c", nc)),
       ("no_emd", S.arm(D + "no_emd", "-EMD", "", nc)),
       ("no_c2p", S.arm(D + "no_c2p", "-C2P", "", nc)),
       ("no_p2c", S.arm(D + "no_p2c", "-P2C", "", nc)),
       ("no_relative", S.arm(D + "no_relative", "no relative terms", "BERT-style", nc))],
      paper_columns=("MNLI-m",))
