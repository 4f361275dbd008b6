"""Study: RoBERTa (Liu et al. 2019), Table 2 — input format and the NSP loss.

  python -m launch.ablate --config configs/ablations/study_roberta_table2.py \
      --workdir runs/ablate_roberta_table2
  # the paper's size on a TPU VM (BERT-base, its 1M steps of batch 256 at length 512):
  python -m launch.ablate --config configs/ablations/study_roberta_table2.py \
      --workdir /mnt/bucket/roberta_table2 --config.scale.variant=base \
      --config.scale.steps=1000000 --config.scale.seq_len=512 --config.scale.global_batch=256 \
      --config.scale.learning_rate=1e-4 --platform tpu --parallel 2 --devices_per_arm 4

Arms map onto what the data pipeline builds (launch/data/packing.py, launch/data/pairs.py):
  segment_pair_nsp  BERT's input: pairs of multi-sentence segments + NSP (the paper's
                    SEGMENT-PAIR+NSP, which is BERT's own recipe).
  segment_pair      the same pairs without the NSP loss (not a Table 2 row: Devlin et al.
                    2019, Table 5 "No NSP"; here it separates the loss from the format).
  doc_sentences     MLM on contiguous text packed into full rows, a document never
                    attending across into another (segment ids): the paper's
                    DOC-SENTENCES, approximated — RoBERTa fills short rows by raising the
                    batch size, we fill them by packing more documents into the row.
Not supported by the pipeline (listed in results.md, not run): SENTENCE-PAIR+NSP (single
natural sentences as segments) and FULL-SENTENCES (rows that run on across document
boundaries): packing always keeps documents apart.
The paper's numbers are Table 2's (BERT-base size, BookCorpus + Wikipedia, 1M steps at
batch 256). Our downstream task is BBC News topics (5 classes; docs/finetune_real.py);
SST-2, the paper's single-sentence classification column, is the one the computed
reading compares against.
"""
import ml_collections

BERT = "configs/ablations/bert_pretraining.py:{variant},setting="


def get_config():
  c = ml_collections.ConfigDict()
  c.name = "roberta_table2"
  c.paper = "RoBERTa (Liu et al. 2019)"
  c.table = "Table 2"
  c.question = "does the NSP loss help, and which input format is best?"
  c.scale = ml_collections.ConfigDict(dict(
      variant="tiny", steps=150, seq_len=64, global_batch=32, checkpoint_every=75,
      learning_rate=0.0))
  c.paper_columns = ("SQuAD 1.1/2.0 F1", "MNLI-m", "SST-2", "RACE")
  c.paper_compare = "SST-2"
  c.order = ("segment_pair_nsp", "segment_pair", "doc_sentences")
  c.arms = ml_collections.ConfigDict()
  c.arms.segment_pair_nsp = dict(
      config=BERT + "nsp", overrides=(), label="SEGMENT-PAIR+NSP",
      note="as the paper (BERT's pairs of segments, NSP)",
      paper=("90.4/78.7", "84.0", "92.9", "64.2"), match_flops_of="")
  c.arms.segment_pair = dict(
      config=BERT + "no_nsp", overrides=(), label="segment pairs, no NSP",
      note="not a Table 2 row (BERT Table 5's No NSP): same pairs, MLM only",
      paper=("not in Table 2",) * 4, match_flops_of="")
  c.arms.doc_sentences = dict(
      config=BERT + "full_sentences", overrides=(), label="DOC-SENTENCES",
      note="approximated: packed documents kept apart by segment ids, MLM only",
      paper=("90.6/79.7", "84.7", "92.7", "65.6"), match_flops_of="")
  c.not_run = (
      "SENTENCE-PAIR+NSP (paper: 88.7/76.2, 82.9, 92.1, 63.0): pairs of single sentences; "
      "the pair builder accumulates lines into segments and has no single-sentence mode.",
      "FULL-SENTENCES (paper: 90.4/79.1, 84.7, 92.5, 64.8): rows that cross document "
      "boundaries; packing always keeps documents apart.")
  c.evaluate = ml_collections.ConfigDict(dict(
      mlm=True, pair_tasks=(),
      finetune=dict(dataset="bbc", max_rows=2000, eval_fraction=0.2, split_seed=0,
                    epochs=2, seeds=(0, 1, 2), seq_len=64, global_batch=32,
                    learning_rate=1e-3, text_column="text", label_column="label")))
  return c
