"""BERT pretraining-objective ablations, as config variants of configs/bert.py.

  python -m launch.pretrain --config configs/ablations/bert_pretraining.py:tiny,setting=no_nsp \
      --workdir /tmp/ablation_no_nsp

settings:
  nsp        BERT as published: MLM + NSP on sentence pairs (Devlin et al. 2019, Table 5 "BERT").
  no_nsp     MLM only, same pair inputs (Devlin et al. 2019, Table 5 "No NSP").
  full_sentences  MLM only on packed contiguous text (Liu et al. 2019, Table 2
             "FULL-SENTENCES"; here documents in a row never attend across each other).
  wwm        whole-word masking (Google's BERT release "Whole Word Masking" models).
  mask40     a 40% masking rate (Wettig et al. 2023, "Should You Mask 15% in MLM?").
Results are not bundled: run each setting with the same size and steps and compare the
held-out metrics in <workdir>/metrics.jsonl.
"""
from configs import bert
from configs import common

SETTINGS = ("nsp", "no_nsp", "full_sentences", "wwm", "mask40")


def get_config(arg="tiny,setting=nsp"):
  a = common.parse_arg(arg, variant="tiny", setting="nsp")
  if a.setting not in SETTINGS:
    raise ValueError(f"unknown setting {a.setting!r}; choose from {SETTINGS}")
  c = bert.get_config(a.variant).unlock()
  if a.setting in ("no_nsp", "full_sentences"):
    c.objective.name = "mlm"
    c.model.heads = ("mlm",)
  if a.setting == "full_sentences":
    c.data.packing = "documents"
  if a.setting == "wwm":
    c.objective.whole_word = True
  if a.setting == "mask40":
    c.objective.mask_rate = 0.4
    c.objective.max_predictions = -1  # auto: ceil(0.4 * seq_len), follows seq_len
  return c.lock()
