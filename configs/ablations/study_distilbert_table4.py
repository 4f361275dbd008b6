"""Study: DistilBERT (Sanh et al. 2019), Table 4 — the triple loss and the init.

  python -m launch.pretrain --config configs/bert.py:tiny --workdir runs/bert_tiny  # teacher
  python -m launch.ablate --config configs/ablations/study_distilbert_table4.py --workdir DIR

Arms (configs/ablations/distilbert_table4.py), each distilled from the teacher in
runs/bert_tiny/hf (override `objective.teacher` in the arms for another). Paper numbers
(GLUE macro-score changes): not checked.
"""
from configs.ablations import studies as S

D = "configs/ablations/distilbert_table4.py:{variant},setting="
TEACHER = ("objective.teacher=runs/bert_tiny/hf",)


def get_config():
  nc = (S.NOT_CHECKED,)
  arms = [(s, S.arm(D + s, label, "", nc, overrides=TEACHER)) for s, label in (
      ("full", "triple loss"), ("no_cos", "- L_cos"), ("no_mlm", "- L_mlm"),
      ("no_ce", "- L_ce"), ("random_init", "random init"))]
  return S.study("distilbert_table4", "DistilBERT (Sanh et al. 2019)", "Table 4",
                 "which parts of the triple loss and the init matter?", arms,
                 paper_columns=("GLUE macro-score change",))
