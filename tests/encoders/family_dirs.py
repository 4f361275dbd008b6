"""Tiny HF directories, one per REGISTERED model type (encoders.hf's mappings), for the
tests of generic features (sharded loading, pure functions, export, conversion): a
family that registers a mapping and adds its tiny transformers classes to
tests/encoders/hf_helpers.ARCHS_ALL is covered with no edit here."""
import functools
import os
import tempfile

from encoders import hf as hf_lib
from tests.encoders import hf_helpers as H

# Sizes every mesh axis of the test meshes (2 or 4 devices) divides: hidden 32, 4 heads,
# MLP 40; the vocabulary (99) is padded to a multiple of 8 when loaded sharded.
EVEN = dict(intermediate_size=40)
PAD = dict(vocab_pad_multiple=8)


def model_types():
  return sorted({t for m in hf_lib._MAPPINGS.values() for t in m.model_types})


def params(fast=("bert",)):
  """pytest params over `model_types()`: those in `fast` run in the default suite, the
  others under the slow marker (the same checks, kept out of the ~10 min default run)."""
  import pytest
  return [t if t in fast else pytest.param(t, marks=pytest.mark.slow)
          for t in model_types()]


def arch_for(model_type: str) -> str:
  """The tiny architecture with the most heads for `model_type` (an MLM head if any)."""
  archs = sorted(a for a, (_, cfg_cls, _) in H.ARCHS_ALL.items()
                 if cfg_cls.model_type == model_type)
  if not archs:
    raise AssertionError(f"model_type {model_type!r} is registered but has no tiny "
                         "transformers model in tests/encoders/hf_helpers.ARCHS_ALL")
  for suffix in ("ForPreTraining", "ForMaskedLM"):
    for a in archs:
      if a.endswith(suffix):
        return a
  return archs[0]


@functools.lru_cache(maxsize=None)
def tiny_dir(model_type: str) -> str:
  """An HF directory (config.json + model.safetensors) of a tiny random model, written
  once per test session."""
  path = os.path.join(tempfile.mkdtemp(prefix=f"tiny_{model_type}_"), "hf")
  H.tiny_hf_model(arch_for(model_type), seed=3, **EVEN).save_pretrained(path)
  return path
