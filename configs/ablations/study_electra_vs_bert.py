"""Study: ELECTRA (Clark et al. 2020), Table 1 — ELECTRA against BERT at equal
pretraining FLOPs.

  python -m launch.ablate --config configs/ablations/study_electra_vs_bert.py \
      --workdir runs/electra_vs_bert
  # the paper's small size (ELECTRA-Small: 1M steps of batch 128 at length 128):
  python -m launch.ablate --config configs/ablations/study_electra_vs_bert.py \
      --workdir /mnt/bucket/electra_vs_bert --config.scale.variant=small \
      --config.scale.steps=1000000 --config.scale.seq_len=128 \
      --config.scale.global_batch=128 --platform tpu --parallel 2 --devices_per_arm 4

Arms: ELECTRA (configs/electra.py: replaced-token detection, a 1/4-width generator,
tied embeddings; at `tiny` replacements sampled at temperature 2, configs/electra.py says
why) and BERT with MLM only (configs/bert.py's tiny-mlm recipe at BERT's 15% masking) on
the same packed documents, the same discriminator-sized encoder, the same lowercased
tokenizer, trained for as many steps as give it ELECTRA's pretraining FLOPs
(match_flops_of; the trainer's own count: forward + backward of every trained module).
Each arm keeps its recipe's learning rate. Three pretraining seeds per arm; the claim is
tested on a frozen-feature linear probe (BBC topics, studies.probe_default) on mean-pooled
hidden states (ELECTRA's discriminator has no MLM head for pool="mlm"), paired by seed,
with each encoder at random init as the floor. At calibration that probe did not tell a
pretrained tiny BERT from its random init (docs/ablations/README.md): read this study's
probe numbers against the random-init rows first. The paper's numbers:
Table 1, GLUE dev average of the small models at about 1.4e18 FLOPs each.

At `variant=small` or above, replace the bert arm's config with
configs/ablations/bert_pretraining.py:{variant},setting=full_sentences (tiny-mlm is a
tiny-only recipe).
"""
from configs.ablations import studies as S


def get_config():
  return S.study(
      "electra_vs_bert", "ELECTRA (Clark et al. 2020)", "Table 1",
      "at equal pretraining FLOPs, does replaced-token detection beat MLM?",
      [("electra", S.arm("configs/electra.py:{variant}", "ELECTRA",
                         "as the paper (tiny: temperature 2)", ("79.9",))),
       ("bert", S.arm("configs/bert.py:{variant}-mlm", "BERT (MLM)",
                      "MLM only at 15%, same data, tokenizer and encoder size; steps set "
                      "to ELECTRA's FLOPs", ("75.1",),
                      overrides=("tokenizer.lowercase=True", "objective.mask_rate=0.15"),
                      match_flops_of="electra"))],
      paper_columns=("GLUE dev (small models)",), paper_compare="GLUE dev (small models)",
      mlm=True, finetune=False, probe=S.probe_default(pool="mean"), steps=800, seq_len=64,
      global_batch=64, seeds=(0, 1, 2), evals=4,
      claim=S.compare("electra", "bert", "probe_accuracy",
                      "ELECTRA > BERT at equal pretraining FLOPs (GLUE dev 79.9 vs 75.1 for "
                      "the small models, Table 1)"))
