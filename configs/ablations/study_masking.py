"""Study: the masking rate, 15% against 40% (Wettig et al. 2023, "Should You Mask 15% in
Masked Language Modeling?"; ModernBERT trains at 30%).

  python -m launch.ablate --config configs/ablations/study_masking.py \
      --workdir runs/masking

Arms: configs/bert.py's tiny-mlm recipe (MLM alone on packed documents, scored at BERT's
15% whatever the training rate: objective.eval_mask_rate) trained at 15% and at 40%
(the masked positions per row follow the rate: max_predictions=-1). Three pretraining
seeds per arm; the claim is tested on a frozen-feature linear probe (BBC topics on the
MLM head's predicted-token distribution, studies.probe_default) paired by seed, with each
encoder at random init as the floor; the held-out MLM accuracy (both scored at 15%) is
reported beside it. Paper numbers: not checked (Wettig et al. report larger models and GLUE/SQuAD).
Whole-word masking and 30%: study_masking_wwm.py.
"""
from configs.ablations import studies as S

MLM = "configs/bert.py:{variant}-mlm"


def get_config():
  nc = (S.NOT_CHECKED,)
  return S.study(
      "masking", "Wettig et al. 2023", "Table 1", "mask 15% or 40%?",
      [("mask15", S.arm(MLM, "15%", "BERT's rate", nc, overrides=("objective.mask_rate=0.15",))),
       ("mask40", S.arm(MLM, "40%", "Wettig et al.'s rate", nc,
                        overrides=("objective.mask_rate=0.4",)))],
      paper_columns=("downstream",), mlm=True, finetune=False, probe=S.probe_default(),
      steps=800, seq_len=64, global_batch=64, seeds=(0, 1, 2), evals=4,
      claim=S.compare("mask40", "mask15", "probe_accuracy",
                      "masking 40% beats 15% downstream (Wettig et al. 2023: large models, "
                      "efficient pretraining recipe)"))
