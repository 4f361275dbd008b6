"""Study: ALBERT (Lan et al. 2020), Table 5 — the sentence-pair loss: none, NSP or SOP,
with the cross-task check (each model's pair classifier scored on NSP pairs and on SOP
pairs).

  python -m launch.ablate --config configs/ablations/study_albert_sop.py \
      --workdir runs/ablate_albert_sop
  # the paper's size (ALBERT-base, 125k steps of batch 4096 at length 512, LAMB):
  python -m launch.ablate --config configs/ablations/study_albert_sop.py \
      --workdir /mnt/bucket/albert_sop --config.scale.variant=base \
      --config.scale.steps=125000 --config.scale.seq_len=512 \
      --config.scale.global_batch=4096 --platform tpu --parallel 3 --devices_per_arm 8

Arms (configs/ablations/albert.py): the same ALBERT, the same pair inputs; only the pair
loss differs. The NSP arm trains ALBERT's one pair classifier on NSP labels, as the paper
did. The paper's numbers (ALBERT-base, Table 5): intrinsic accuracies of MLM, NSP and SOP,
and SST-2 and the downstream average, which the computed reading compares against. Our
downstream task is BBC News topics (5 classes; docs/finetune_real.py).
"""
import ml_collections

ALBERT = "configs/ablations/albert.py:{variant},setting="


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "albert_sop"
  c.paper = "ALBERT (Lan et al. 2020)"
  c.table = "Table 5"
  c.question = "NSP or SOP: which pair loss teaches inter-sentence coherence?"
  c.scale = ml_collections.ConfigDict(dict(
      variant="tiny", steps=150, seq_len=64, global_batch=32, checkpoint_every=75,
      learning_rate=0.0))
  c.paper_columns = ("MLM", "NSP", "SOP", "SST-2", "Avg")
  c.paper_compare = "Avg"
  c.order = ("nsp", "sop")
  c.arms = ml_collections.ConfigDict()
  c.arms.nsp = dict(config=ALBERT + "nsp", overrides=(), label="NSP",
                    note="as the paper: NSP pairs, ALBERT's pair classifier",
                    paper=("54.5", "90.5", "52.0", "91.1", "79.2"), match_flops_of="")
  c.arms.sop = dict(config=ALBERT + "sop", overrides=(), label="SOP",
                    note="as the paper", paper=("54.0", "78.9", "86.5", "90.3", "80.1"),
                    match_flops_of="")
  c.not_run = (
      "None (MLM only; paper: 54.9, 52.4, 53.3, 89.9, 79.0): configured "
      "(configs/ablations/albert.py setting=none) but not run at the CPU scale "
      "(add it to `order` and `arms`).",)
  c.evaluate = ml_collections.ConfigDict(dict(
      mlm=True, pair_tasks=("nsp", "sop"),
      finetune=dict(dataset="bbc", max_rows=2000, eval_fraction=0.2, split_seed=0,
                    epochs=1, seeds=(0, 1, 2), seq_len=64, global_batch=32,
                    learning_rate=1e-3, text_column="text", label_column="label")))
  return c
