"""FLOP counts belong to the families: one golden hand count per family."""
import ml_collections

import encoders


def _cfg(family, **kw):
  cfg = encoders.family_defaults(family)
  cfg.update(kw)
  return ml_collections.FrozenConfigDict(cfg)


def test_bert_forward_flops_hand_count():
  # L=2, D=4, F=8, T=3, V=10, heads MLM + NSP.
  cfg = _cfg("bert", num_hidden_layers=2, hidden_size=4, intermediate_size=8, vocab_size=10,
             heads=("mlm", "nsp"))
  per_layer = (4 * 2 * 3 * 4 * 4     # q, k, v, out projections: 384
               + 2 * 2 * 3 * 3 * 4   # QK^T and probs @ V over the full 3 x 3 grid: 144
               + 2 * 3 * 4 * 8 * 2)  # MLP in and out: 384
  assert per_layer == 912
  pooler_nsp = 2 * 4 * 4 + 2 * 4 * 2  # 48
  mlm_per_position = 2 * 4 * 4 + 2 * 4 * 10  # transform + decoder: 112
  assert encoders.forward_flops(cfg, 3) == 2 * 912 + 48 + 3 * 112 == 2208
  assert encoders.forward_flops(cfg, 3, mlm_positions=1) == 2 * 912 + 48 + 112 == 1984


def test_albert_forward_flops_hand_count():
  # 3 applications x 2 inner layers = 6 layers of D=4, F=8; E=2, T=3, V=10; MLM + SOP.
  cfg = _cfg("albert", num_hidden_layers=3, num_hidden_groups=1, inner_group_num=2,
             hidden_size=4, intermediate_size=8, embedding_size=2, vocab_size=10,
             heads=("mlm", "sop"))
  projection = 2 * 3 * 2 * 4  # E -> D: 48
  layers = 6 * 912  # sharing saves parameters, not FLOPs
  pooler_sop = 48
  mlm_per_position = 2 * 4 * 2 + 2 * 2 * 10  # D -> E transform + E -> V decoder: 56
  assert encoders.forward_flops(cfg, 3) == projection + layers + pooler_sop + 3 * mlm_per_position
  assert encoders.forward_flops(cfg, 3) == 5736
