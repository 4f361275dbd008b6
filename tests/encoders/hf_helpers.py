"""Tiny random transformers models built locally, and inputs that exercise padding."""
import numpy as np
import torch
import transformers as T

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=40)

ARCHS = {
    "BertModel": (T.BertModel, T.BertConfig, {}),
    "BertForMaskedLM": (T.BertForMaskedLM, T.BertConfig, {}),
    "BertForPreTraining": (T.BertForPreTraining, T.BertConfig, {}),
    "RobertaModel": (T.RobertaModel, T.RobertaConfig,
                     dict(pad_token_id=1, type_vocab_size=1, layer_norm_eps=1e-5,
                          max_position_embeddings=42)),
    "RobertaForMaskedLM": (T.RobertaForMaskedLM, T.RobertaConfig,
                           dict(pad_token_id=1, type_vocab_size=1, layer_norm_eps=1e-5,
                                max_position_embeddings=42)),
}
# ALBERT: E != H, two parameter groups of two layers each, four layer applications.
ALBERT_TINY = dict(embedding_size=16, num_hidden_layers=4, num_hidden_groups=2,
                   inner_group_num=2, hidden_act="gelu_new")
ALBERT_ARCHS = {name: (getattr(T, name), T.AlbertConfig, ALBERT_TINY)
                for name in ("AlbertModel", "AlbertForMaskedLM", "AlbertForPreTraining")}
# ELECTRA: E != H (the embeddings are projected), generator and discriminator heads.
ELECTRA_ARCHS = {name: (getattr(T, name), T.ElectraConfig, dict(embedding_size=16))
                 for name in ("ElectraModel", "ElectraForMaskedLM", "ElectraForPreTraining")}
ARCHS_ALL = {**ARCHS, **ALBERT_ARCHS, **ELECTRA_ARCHS}


def tiny_hf_model(arch, seed=0, **overrides):
  cls, cfg_cls, extra = ARCHS_ALL[arch]
  torch.manual_seed(seed)
  cfg = cfg_cls(**{**TINY, **extra, **overrides})
  model = cls(cfg).eval()
  # Random init leaves biases and LayerNorm at 0/1; perturb them so parity checks every
  # tensor's mapping, not just the kernels.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  return model


def padded_batch(cfg, batch=3, length=11, seed=0):
  rng = np.random.RandomState(seed)
  ids = rng.randint(3, cfg.vocab_size, size=(batch, length))
  mask = np.ones_like(ids)
  lengths = [length, length - 4, 3][:batch]
  for i, n in enumerate(lengths):
    mask[i, n:] = 0
  ids[mask == 0] = cfg.pad_token_id
  if getattr(cfg, "type_vocab_size", 0) > 1:
    types = (np.arange(length)[None] >= np.array(lengths)[:, None] // 2).astype(np.int64)
    types = types * mask
  else:
    types = np.zeros_like(ids)
  return ids, mask, types


def torch_outputs(model, ids, mask, types):
  with torch.no_grad():
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                token_type_ids=torch.tensor(types), output_hidden_states=True)
  hidden = out.hidden_states[-1].numpy()
  result = {"last_hidden_state": hidden}
  if getattr(out, "prediction_logits", None) is not None:
    result["mlm_logits"] = out.prediction_logits.numpy()
  elif getattr(out, "logits", None) is not None:  # (B,T): ELECTRA's RTD logits
    result["mlm_logits" if out.logits.ndim == 3 else "rtd_logits"] = out.logits.numpy()
  if getattr(out, "seq_relationship_logits", None) is not None:
    result["nsp_logits"] = out.seq_relationship_logits.numpy()
  if getattr(out, "sop_logits", None) is not None:
    result["sop_logits"] = out.sop_logits.numpy()
  if getattr(out, "pooler_output", None) is not None:
    result["pooler_output"] = out.pooler_output.numpy()
  return result
