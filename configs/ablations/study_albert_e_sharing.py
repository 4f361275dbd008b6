"""Study: ALBERT (Lan et al. 2020), Tables 3 and 4 — embedding size E and cross-layer
sharing.

  python -m launch.ablate --config configs/ablations/study_albert_e_sharing.py --workdir DIR

Arms (configs/ablations/albert.py): all-shared with E = 32, 64 (tiny's default), 128;
not-shared with E = 64. Not supported: Table 4's shared-attention and shared-FFN (the
model shares whole layers). Paper numbers: not checked.
"""
from configs.ablations import studies as S

A = "configs/ablations/albert.py:{variant},setting="


def get_config():
  nc = (S.NOT_CHECKED,)
  return S.study(
      "albert_e_sharing", "ALBERT (Lan et al. 2020)", "Tables 3-4",
      "how small can E be, and what does sharing every layer cost?",
      [("e32", S.arm(A + "e32", "E=32 all-shared", "", nc)),
       ("e64", S.arm(A + "sop", "E=64 all-shared", "tiny's default", nc)),
       ("e128", S.arm(A + "e128", "E=128 all-shared", "E = H", nc)),
       ("not_shared", S.arm(A + "not_shared", "E=64 not-shared", "", nc))],
      paper_columns=("Avg",), pair_tasks=("sop",),
      not_run=("shared-attention, shared-FFN: the model shares whole layers only.",))
