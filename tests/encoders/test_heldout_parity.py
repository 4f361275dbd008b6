"""A held-out parity check for the families added after the seven seeds, written apart from
their own tests and with shapes those do not use: transformers' own classes, built from
their config classes with odd sizes, saved as HF directories, loaded with
`encoders.from_hf` / `encoders.hf.tasks.from_hf`, compared in float32 on a right-padded
batch (the base model's last hidden state at real tokens, the MLM logits, and the
sequence and token classification logits); then our export of each, reloaded by
transformers with no missing or unexpected keys, gives the same outputs."""
import numpy as np
import pytest
import torch
import transformers as T

import encoders
from encoders.hf import tasks as tasks_hf

ATOL = 1e-4

# model_type -> (class-name prefix, config fields). Odd widths, head counts and lengths.
HELDOUT = {
    "eurobert": ("EuroBert", dict(vocab_size=203, hidden_size=60, intermediate_size=71,
                                  num_hidden_layers=3, num_attention_heads=5,
                                  num_key_value_heads=1, max_position_embeddings=64,
                                  pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                  mask_token_id=3, rms_norm_eps=1e-6)),
    "mpnet": ("MPNet", dict(vocab_size=211, hidden_size=45, intermediate_size=53,
                            num_hidden_layers=3, num_attention_heads=5,
                            # transformers' MPNet uses 32 buckets whatever the config says
                            relative_attention_num_buckets=32, max_position_embeddings=80,
                            pad_token_id=1)),
    "xlm-roberta": ("XLMRoberta", dict(vocab_size=307, hidden_size=42, intermediate_size=50,
                                       num_hidden_layers=3, num_attention_heads=7,
                                       max_position_embeddings=70, pad_token_id=1,
                                       type_vocab_size=1, layer_norm_eps=1e-5)),
    "nomic_bert": ("NomicBert", dict(vocab_size=223, hidden_size=48, intermediate_size=58,
                                     num_hidden_layers=3, num_attention_heads=3,
                                     max_position_embeddings=64, type_vocab_size=2,
                                     pad_token_id=0)),
    "gte": ("Gte", dict(vocab_size=229, hidden_size=36, intermediate_size=46,
                        num_hidden_layers=3, num_attention_heads=3, max_position_embeddings=64,
                        type_vocab_size=2, pad_token_id=0)),
}
HEADS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification")


def _build(model_type, head, seed=7):
  prefix, fields = HELDOUT[model_type]
  config_cls = getattr(T, f"{prefix}Config")
  extra = {"num_labels": 3} if head.startswith("For") and head != "ForMaskedLM" else {}
  cfg = config_cls(**fields, **extra)
  torch.manual_seed(seed)
  model = getattr(T, f"{prefix}{head}")(cfg).eval()
  with torch.no_grad():  # random biases and norm scales, so every tensor's mapping shows
    for name, p in model.named_parameters():
      if p.ndim == 1:
        p.add_(0.1 * torch.randn_like(p))
  return model


def _batch(cfg, batch=3, length=19, seed=3):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, cfg.vocab_size, size=(batch, length))
  mask = np.ones_like(ids)
  for i, n in enumerate([length, length - 6, 4][:batch]):
    mask[i, n:] = 0
  ids[mask == 0] = cfg.pad_token_id
  return ids, mask


def _torch_out(model, ids, mask, head):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  return (out.last_hidden_state if head == "Model" else out.logits).numpy()


def _ours(path, ids, mask, head):
  if head in ("Model", "ForMaskedLM"):
    model, params = encoders.from_hf(path)
    out = model.apply({"params": params}, ids.astype(np.int32), mask.astype(np.int32))
    if head == "Model":
      return np.asarray(out.last_hidden_state)
    return np.asarray(out.mlm_logits)[..., :model.config.vocab_size]
  model, params = tasks_hf.from_hf(path)
  return np.asarray(model.apply({"params": params}, ids.astype(np.int32),
                                mask.astype(np.int32)).logits)


def _compare(ours, theirs, mask, head, what):
  if ours.ndim == 3:  # per token: only real tokens are defined
    keep = mask.astype(bool)
    ours, theirs = ours[keep], theirs[keep]
  np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0, err_msg=f"{what} {head}")


@pytest.mark.parametrize("model_type", sorted(HELDOUT))
def test_heldout_parity_and_export(model_type, tmp_path):
  if model_type.replace("-", "_") not in {m.replace("-", "_") for m in encoders.hf.model_types()}:
    pytest.fail(f"{model_type} has no mapping in encoders.hf")
  for head in HEADS:
    model = _build(model_type, head)
    src = str(tmp_path / f"{head}_src")
    model.save_pretrained(src)
    ids, mask = _batch(model.config)
    theirs = _torch_out(model, ids, mask, head)
    _compare(_ours(src, ids, mask, head), theirs, mask, head, f"{model_type} import")
    # export: ours -> transformers, no missing or unexpected keys, same outputs
    out = str(tmp_path / f"{head}_out")
    if head in ("Model", "ForMaskedLM"):
      m, p = encoders.from_hf(src)
      encoders.to_hf(m, p, out)
    else:
      m, p = tasks_hf.from_hf(src)
      tasks_hf.to_hf(m, p, out)
    back, info = getattr(T, type(model).__name__).from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], (model_type, head, info)
    _compare(_torch_out(back.eval(), ids, mask, head), theirs, mask, head,
             f"{model_type} export")
