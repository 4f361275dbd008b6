"""Study: masking — whole-word vs token masking (Google's BERT "Whole Word Masking"
release) and the masking rate 15 / 30 / 40% (Wettig et al. 2023, "Should You Mask 15% in
Masked Language Modeling?").

  python -m launch.ablate --config configs/ablations/study_masking_wwm.py --workdir DIR

Arms: MLM only on packed documents (configs/ablations/bert_pretraining.py), masking per
token at 15% (BERT), per whole word at 15%, per token at 30% and 40%. The 30% and 40% arms
scale the masked positions with the rate (max_predictions=-1). Paper numbers: not
checked (the release notes and Wettig et al. report other model sizes and tasks).
At the old CPU scale (150 steps, one seed, BBC fine-tuning; not calibrated); the
calibrated 15% vs 40% study is study_masking.py.
"""
from configs.ablations import studies as S

B = "configs/ablations/bert_pretraining.py:{variant},setting="


def get_config():
  nc = (S.NOT_CHECKED,)
  return S.study(
      "masking_wwm", "BERT whole-word masking release; Wettig et al. 2023", "Table 1 / release notes",
      "whole words or tokens, and how much to mask?",
      [("token15", S.arm(B + "full_sentences", "token 15%", "BERT's masking", nc)),
       ("wwm15", S.arm(B + "full_sentences", "whole-word 15%", "whole words", nc,
                       overrides=("objective.whole_word=True",))),
       ("token30", S.arm(B + "full_sentences", "token 30%", "", nc,
                         overrides=("objective.mask_rate=0.3",))),
       ("token40", S.arm(B + "full_sentences", "token 40%", "", nc,
                         overrides=("objective.mask_rate=0.4",)))],
      paper_columns=("downstream",), paper_compare="")
