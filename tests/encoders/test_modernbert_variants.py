"""mmBERT and Ettin, published as model_type "modernbert": tiny random models shaped like
them (a 256k vocabulary, theta 160k in global and local layers, their special ids, the
config keys their config.json files carry) load with parity in float32 on padded batches
and export cleanly; the published sizes in configs/modernbert.py count the parameters
transformers counts (and Ettin's its names say)."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as T
from transformers.initialization import no_init_weights

import encoders
from configs import modernbert as mb_configs
from encoders.hf import modernbert as mb_hf

ATOL = 1e-4
# The keys mmBERT's and ModernBERT's config.json carry that transformers' ModernBertConfig
# does not define (it keeps and never reads them), plus the older theta keys.
RAW_KEYS = dict(layer_norm_eps=1e-5, position_embedding_type="sans_pos", mask_token_id=4,
                global_rope_theta=160000, local_rope_theta=160000,
                gradient_checkpointing=False, torch_dtype="float32")
ROPE = {"full_attention": {"rope_type": "default", "rope_theta": 160000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 160000.0}}
# mmBERT-small scaled down (22 layers of 384 -> 4 of 48, 6 heads of 8), Gemma's vocabulary
# and special ids; Ettin-17m's 7 layers (narrower), ModernBERT's vocabulary and pad id.
SHAPES = {
    "mmbert": dict(vocab_size=256_000, hidden_size=48, num_hidden_layers=4,
                   num_attention_heads=6, intermediate_size=72, pad_token_id=0,
                   bos_token_id=2, eos_token_id=1, cls_token_id=1, sep_token_id=1),
    "ettin": dict(vocab_size=50_368, hidden_size=32, num_hidden_layers=7,
                  num_attention_heads=4, intermediate_size=48, pad_token_id=50_283,
                  bos_token_id=50_281, eos_token_id=50_282, cls_token_id=50_281,
                  sep_token_id=50_282),
}


def published_like_dir(kind, path, arch="ModernBertForMaskedLM", seed=0):
  torch.manual_seed(seed)
  cfg = T.ModernBertConfig(**SHAPES[kind], local_attention=4, global_attn_every_n_layers=3,
                           max_position_embeddings=64, rope_parameters=ROPE)
  cfg._attn_implementation = "eager"
  with no_init_weights():  # HF's truncated-normal init of a 256k table takes seconds
    model = getattr(T, arch)(cfg).eval()
  model.tie_weights()
  with torch.no_grad():  # every tensor random, norms and biases away from 1 / 0
    for name, p in model.named_parameters():
      if "norm" in name:
        p.copy_(1 + 0.1 * torch.randn_like(p))
      else:
        p.normal_(0, 0.1 if name.endswith("bias") else 0.02)
  model.save_pretrained(path)
  with open(path / "config.json") as f:
    raw = json.load(f)
  raw.update(RAW_KEYS)
  with open(path / "config.json", "w") as f:
    json.dump(raw, f)
  return model


def padded_batch(cfg, batch=3, length=11, seed=0):
  rng = np.random.RandomState(seed)
  ids = rng.randint(5, cfg.vocab_size, size=(batch, length))
  mask = np.ones_like(ids)
  for i, n in enumerate([length, length - 4, 3][:batch]):
    mask[i, n:] = 0
  ids[mask == 0] = cfg.pad_token_id
  return ids, mask


def torch_out(model, ids, mask):
  with torch.no_grad():
    out = model(torch.tensor(ids), attention_mask=torch.tensor(mask),
                output_hidden_states=True)
  return out.hidden_states[-1].numpy(), getattr(out, "logits", None)


@pytest.mark.parametrize("kind", ["mmbert", pytest.param("ettin", marks=pytest.mark.slow)])
def test_published_like_configs_load_with_parity(kind, tmp_path):
  hf = published_like_dir(kind, tmp_path, seed=1)
  model, params = encoders.from_hf(str(tmp_path), attention_impl="einsum")
  c = model.config
  assert (c.vocab_size, c.pad_token_id) == (SHAPES[kind]["vocab_size"],
                                            SHAPES[kind]["pad_token_id"])
  assert c.global_rope_theta == c.local_rope_theta == 160_000.0
  ids, mask = padded_batch(hf.config, seed=2)
  assert ids.shape[1] > 4 + 1  # the window (4) is narrower than the rows
  out = jax.jit(model.apply)({"params": params}, jnp.asarray(ids), jnp.asarray(mask))
  hidden, logits = torch_out(hf, ids, mask)
  real = mask.astype(bool)
  assert np.abs(hidden).max() > 0.1
  np.testing.assert_allclose(np.asarray(out.last_hidden_state)[real], hidden[real],
                             atol=ATOL, rtol=0)
  assert out.mlm_logits.shape == (3, 11, SHAPES[kind]["vocab_size"])
  np.testing.assert_allclose(np.asarray(out.mlm_logits)[real], logits.numpy()[real],
                             atol=ATOL, rtol=0)


@pytest.mark.slow
def test_mmbert_like_export_loads_in_transformers(tmp_path):
  hf = published_like_dir("mmbert", tmp_path / "src", arch="ModernBertModel", seed=3)
  model, params = encoders.from_hf(str(tmp_path / "src"))
  encoders.to_hf(model, params, str(tmp_path / "out"))
  loaded, info = T.ModernBertModel.from_pretrained(
      str(tmp_path / "out"), output_loading_info=True, attn_implementation="eager")
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
  assert loaded.config.rope_parameters["sliding_attention"]["rope_theta"] == 160_000.0
  ids, mask = padded_batch(hf.config, seed=4)
  want, _ = torch_out(hf, ids, mask)
  got, _ = torch_out(loaded.eval(), ids, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(got[real], want[real], atol=1e-5, rtol=0)


def test_a_setting_transformers_reads_is_still_refused(tmp_path):
  published_like_dir("ettin", tmp_path, seed=5)
  with open(tmp_path / "config.json") as f:
    raw = json.load(f)
  raw["rope_parameters"]["full_attention"] = {"rope_type": "yarn", "rope_theta": 1e4,
                                              "factor": 2.0}
  with open(tmp_path / "config.json", "w") as f:
    json.dump(raw, f)
  with pytest.raises(ValueError, match="rope_type 'yarn'"):
    encoders.from_hf(str(tmp_path))


@pytest.mark.parametrize("name", [n if n == "ettin-17m" else
                                  pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(mb_configs.PUBLISHED)])
def test_published_sizes_count_what_transformers_counts(name):
  cfg = mb_configs.get_config(name).model
  model = encoders.build(cfg)
  shapes = jax.eval_shape(lambda: encoders.init_params(model, jax.random.PRNGKey(0)))
  ours = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))
  hf, arch = mb_hf.ModernBertMapping().config_to_hf(cfg)
  with torch.device("meta"):
    ref = getattr(T, arch)(T.ModernBertConfig(**hf))
  assert ours == sum(p.numel() for p in ref.parameters())
  if name.startswith("ettin-"):  # the suite names its sizes by parameter count
    size = name.split("-")[1]
    named = float(size[:-1]) * (1e9 if size.endswith("b") else 1e6)
    assert abs(ours / named - 1) < 0.05, (name, ours)
