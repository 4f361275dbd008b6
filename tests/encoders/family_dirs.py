"""Tiny HF directories, one per REGISTERED model type (encoders.hf's mappings), for the
tests of generic features (sharded loading, pure functions, export, conversion): built
through transformers' AutoConfig and the architecture classes the mappings name, so a
family that registers a mapping is covered with no edit here (EXTRA only where a type
needs other sizes)."""
import functools
import os
import tempfile

from encoders import hf as hf_lib
from tests.encoders import hf_helpers as H

# Sizes every mesh axis of the test meshes (2 or 4 devices) divides: hidden 32, 4 heads,
# MLP 40; the vocabulary (99) is padded to a multiple of 8 when loaded sharded.
EVEN = dict(intermediate_size=40)
PAD = dict(vocab_pad_multiple=8)


# Per HF model type: what its tiny config needs beyond TINY, and keys it names otherwise.
EXTRA = {
    "eurobert": dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, mask_token_id=3,
                     num_key_value_heads=2),
    "albert": dict(H.ALBERT_TINY),
    "roberta": dict(pad_token_id=1, type_vocab_size=1),
    "distilbert": dict(hidden_dim=40, activation="gelu"),
    "modernbert": dict(num_hidden_layers=4, local_attention=4, global_attn_every_n_layers=3,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                       sep_token_id=2),
}
DROP = {"distilbert": ("intermediate_size",)}
TINY = dict(H.TINY, **EVEN)
_PREFERRED = ("ForMaskedLM", "ForPreTraining", "Model")


def _archs():
  """model_type -> the HF architecture its tiny model uses: of the architectures the
  registered mappings support, the one with an MLM head where there is one."""
  import transformers as T
  found = {}
  for mapping in {id(m): m for m in map(hf_lib.mapping_for, hf_lib.model_types())}.values():
    for arch in mapping.architectures:
      cls = getattr(T, arch, None)
      if cls is None:
        continue
      t = cls.config_class.model_type
      rank = next((i for i, s in enumerate(_PREFERRED) if arch.endswith(s)), len(_PREFERRED))
      if t in mapping.model_types and (t not in found or rank < found[t][0]):
        found[t] = (rank, arch)
  return {t: arch for t, (_, arch) in found.items()}


def model_types():
  """The registered model types that some supported transformers architecture has (e.g.
  a mapping that names an architecture this transformers lacks is skipped)."""
  return sorted(_archs())


def params(fast=("bert",)):
  """pytest params over `model_types()`: those in `fast` run in the default suite, the
  others under the slow marker (the same checks, kept out of the ~10 min default run)."""
  import pytest
  return [t if t in fast else pytest.param(t, marks=pytest.mark.slow)
          for t in model_types()]


def tiny_hf_model(model_type: str, seed: int = 3):
  """A tiny random transformers model (an MLM head where the family has one), biases and
  norms perturbed so every tensor's mapping matters."""
  import torch
  import transformers as T
  torch.manual_seed(seed)
  kw = {k: v for k, v in TINY.items() if k not in DROP.get(model_type, ())}
  cfg = T.AutoConfig.for_model(model_type, **{**kw, **EXTRA.get(model_type, {})})
  model = getattr(T, _archs()[model_type])(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "norm" in name.lower():
        p.add_(0.1 * torch.randn_like(p))
  return model


@functools.lru_cache(maxsize=None)
def tiny_dir(model_type: str) -> str:
  """An HF directory (config.json + model.safetensors) of a tiny random model, written
  once per test session."""
  path = os.path.join(tempfile.mkdtemp(prefix=f"tiny_{model_type}_"), "hf")
  tiny_hf_model(model_type).save_pretrained(path)
  return path
