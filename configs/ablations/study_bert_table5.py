"""Study: BERT (Devlin et al. 2019), Table 5 — the effect of the NSP task.

  python -m launch.ablate --config configs/ablations/study_bert_table5.py --workdir DIR

Arms: BERT as published (MLM + NSP) and "No NSP" (MLM only, same pair inputs), from
configs/ablations/bert_pretraining.py. "LTR & No NSP" (a left-to-right model) is not
supported: no family here has a causal mask. Paper numbers: Table 5 (BERT-base).
"""
from configs.ablations import studies as S

B = "configs/ablations/bert_pretraining.py:{variant},setting="


def get_config():
  return S.study(
      "bert_table5", "BERT (Devlin et al. 2019)", "Table 5", "does NSP help?",
      [("nsp", S.arm(B + "nsp", "BERT_BASE", "as the paper",
                     ("84.4", "88.4", "86.7", "92.7", "88.5"))),
       ("no_nsp", S.arm(B + "no_nsp", "No NSP", "as the paper",
                        ("83.9", "84.9", "86.5", "92.6", "87.9")))],
      paper_columns=("MNLI-m", "QNLI", "MRPC", "SST-2", "SQuAD 1.1 F1"),
      paper_compare="SST-2", pair_tasks=("nsp",),
      not_run=("LTR & No NSP: left-to-right models are not supported (no causal mask in "
               "any family).",))
