"""DeBERTa ablations as config variants of configs/deberta.py, named after the papers'
tables; every setting runs with the one trainer.

  python -m launch.pretrain --config configs/ablations/deberta.py:tiny,setting=no_c2p \\
      --workdir /tmp/deberta_no_c2p
  python -m launch.pretrain --config configs/ablations/deberta.py:v3-tiny,setting=share_tied \\
      --workdir /tmp/debv3_es

The variant is any of configs/deberta.py's (a plain size: MLM, DeBERTa v1/v2; v3-<size>:
the RTD + GDES recipe). Settings:

  paper        as published: c2p and p2c terms, log buckets (DeBERTa v3).
DeBERTa (He et al. 2021), Table 5 (ablation of the base model):
  no_c2p       "-C2P": only the position-to-content term (pos_att_type = p2c).
  no_p2c       "-P2C": only the content-to-position term (pos_att_type = c2p).
  no_relative  neither term: content-to-content attention on absolute positions added to
               the input (BERT's attention; the paper's comparison point).
  no_buckets   relative distances clipped at max_relative_positions, no log buckets
               (DeBERTa v1's relative positions; v2 added the log buckets).
  absolute_input  the relative terms and absolute positions in the input (v2's
               position_biased_input).
  no_emd       "-EMD": the MLM head on the last layer's output, without the enhanced mask
               decoder (the recipe's default has it).
  With absolute positions in the input (no_relative, absolute_input) the decoder is off,
  as in the released code, where it only runs for a model without them.
DeBERTaV3 (He, Gao and Chen 2023), Table 2 (embedding sharing; v3-* variants only):
  share_none   "NES": generator and discriminator have their own embeddings.
  share_tied   "ES": ELECTRA's tied embeddings, both losses update them.
  share_gdes   "GDES" (the v3 recipe's default).
Results are not bundled: run each setting with the same size and steps and compare the
held-out metrics (<workdir>/metrics.jsonl; `python -m launch.rtd_eval --workdir DIR` for
the v3-* ones).
"""
from configs import common, deberta

ATTENTION = ("paper", "no_c2p", "no_p2c", "no_relative", "no_buckets", "absolute_input",
             "no_emd")
SHARING = ("share_none", "share_tied", "share_gdes")
SETTINGS = ATTENTION + SHARING


def get_config(arg="tiny,setting=paper"):
  a = common.parse_arg(arg, variant="tiny", setting="paper")
  if a.setting not in SETTINGS:
    raise ValueError(f"unknown setting {a.setting!r}; choose from {SETTINGS}")
  if a.setting in SHARING:
    if not a.variant.startswith("v3-"):
      raise ValueError(f"setting {a.setting!r} compares embedding sharing of the RTD "
                       f"recipe: use a v3-* variant, not {a.variant!r}")
    return deberta.get_config(f"{a.variant},sharing={a.setting[len('share_'):]}")
  c = deberta.get_config(a.variant).unlock()
  m = c.model
  if a.setting == "no_c2p":
    m.pos_att_type = ("p2c",)
  elif a.setting == "no_p2c":
    m.pos_att_type = ("c2p",)
  elif a.setting == "no_relative":
    m.relative_attention = False
    m.pos_att_type = ()
    m.position_biased_input = True
    m.enhanced_mask_decoder = False
  elif a.setting == "no_buckets":
    m.position_buckets = 0
    m.max_relative_positions = c.data.seq_len  # distances clip at +-seq_len
  elif a.setting == "absolute_input":
    m.position_biased_input = True
    m.enhanced_mask_decoder = False
  elif a.setting == "no_emd":
    m.enhanced_mask_decoder = False
  return c.lock()
