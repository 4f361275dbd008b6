"""Study: ELECTRA (Clark et al. 2020), Table 1 — ELECTRA against BERT at equal
pretraining FLOPs.

  python -m launch.ablate --config configs/ablations/study_electra_vs_bert.py \
      --workdir runs/ablate_electra_vs_bert
  # the paper's small size (ELECTRA-Small: 1M steps of batch 128 at length 128):
  python -m launch.ablate --config configs/ablations/study_electra_vs_bert.py \
      --workdir /mnt/bucket/electra_vs_bert --config.scale.variant=small \
      --config.scale.steps=1000000 --config.scale.seq_len=128 \
      --config.scale.global_batch=128 --platform tpu --parallel 2 --devices_per_arm 4

Arms: ELECTRA (configs/electra.py: replaced-token detection, a 1/4-width generator,
tied embeddings) and BERT with MLM only on the same packed documents, the same
discriminator-sized encoder and tokenizer, trained for as many steps as give it the same
pretraining FLOPs (match_flops_of; the FLOPs are the trainer's own count: forward +
backward of every trained module). Masked-LM accuracy is not reported: ELECTRA's
discriminator does not predict tokens, so the comparison is downstream only. At `tiny`
ELECTRA samples replacements at temperature 2 (configs/electra.py explains why).
The paper's numbers (Table 1, GLUE dev average of the small models at about 1.4e18
FLOPs each). Our downstream task is one task, BBC News topics (5 classes), not the GLUE
average.
"""
import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "electra_vs_bert"
  c.paper = "ELECTRA (Clark et al. 2020)"
  c.table = "Table 1"
  c.question = "at equal pretraining FLOPs, does replaced-token detection beat MLM?"
  c.scale = ml_collections.ConfigDict(dict(
      variant="tiny", steps=150, seq_len=64, global_batch=32, checkpoint_every=75,
      learning_rate=0.0))
  c.paper_columns = ("GLUE dev (small models)",)
  c.paper_compare = "GLUE dev (small models)"
  c.order = ("electra", "bert")
  c.arms = ml_collections.ConfigDict()
  c.arms.electra = dict(config="configs/electra.py:{variant}", overrides=(),
                        label="ELECTRA", note="as the paper (tiny: temperature 2)",
                        paper=("79.9",), match_flops_of="")
  c.arms.bert = dict(
      config="configs/ablations/bert_pretraining.py:{variant},setting=full_sentences",
      overrides=("tokenizer.lowercase=True", "model.hidden_dropout_prob=0.0",
                 "model.attention_probs_dropout_prob=0.0"),
      label="BERT (MLM)", note="MLM only, same data, tokenizer and encoder size; steps "
      "set to ELECTRA's FLOPs", paper=("75.1",), match_flops_of="electra")
  c.not_run = ()
  c.evaluate = ml_collections.ConfigDict(dict(
      mlm=False, pair_tasks=(),
      finetune=dict(dataset="bbc", max_rows=2000, eval_fraction=0.2, split_seed=0,
                    epochs=1, seeds=(0, 1, 2), seq_len=64, global_batch=32,
                    learning_rate=1e-3, text_column="text", label_column="label")))
  return c
