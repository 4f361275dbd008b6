"""Tiny random transformers task models for every HF model type the zoo maps: the
fixtures of the task-head parity tests (test_task_heads.py) and the pipelines' tests."""
import torch
import transformers as T

from encoders import hf as ehf

MODEL_TYPES = ehf.model_types()
TASKS = ("sequence", "token", "qa")  # the tasks with a transformers Auto class
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=37, max_position_embeddings=160)
# Per HF model type: what its tiny config needs beyond TINY (ALBERT: E != H, two groups of
# two layers, four applications).
EXTRA = {"albert": dict(embedding_size=16, num_hidden_layers=4, num_hidden_groups=2,
                        inner_group_num=2, hidden_act="gelu_new"),
         "distilbert": dict(hidden_dim=37),  # its MLP width is hidden_dim
         # XLM-R creates its parameters in another order than RoBERTa: with type_vocab_size
         # 1 (its released value) the seeded random tagger tags something
         "xlm-roberta": dict(type_vocab_size=1),
         # EuroBERT: special ids inside the tiny vocabulary, 2 K/V heads for 4 query heads
         "eurobert": dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, mask_token_id=3,
                          num_key_value_heads=2),
         # ModernBERT: special ids inside the tiny vocabulary; a window smaller than the
         # batch's rows; global, local, local, global layers.
         "modernbert": dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1,
                            sep_token_id=2, local_attention=4, num_hidden_layers=4),
         # DeBERTa-v3 style: shared keys, log buckets, normed relative table
         "deberta-v2": dict(relative_attention=True, position_buckets=8,
                            norm_rel_ebd="layer_norm", share_att_key=True,
                            pos_att_type="p2c|c2p", position_biased_input=False),
         # DeBERTa v1 (microsoft/deberta-base's options): both terms, no absolute positions
         "deberta": dict(relative_attention=True, pos_att_type="c2p|p2c",
                         position_biased_input=False)}
AUTO = {"sequence": T.AutoModelForSequenceClassification,
        "token": T.AutoModelForTokenClassification,
        "qa": T.AutoModelForQuestionAnswering}
LABELS = {"sequence": ("negative", "neutral", "positive"),
          "token": ("O", "B-PER", "I-PER", "B-LOC", "I-LOC"), "qa": ()}
ATOL = 1e-4


def hf_config(model_type, task, **overrides):
  kw = {**TINY, **EXTRA.get(model_type, {}), **overrides}
  labels = LABELS[task]
  if labels:
    kw.update(id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
  return T.AutoConfig.for_model(model_type, **kw)


def tiny_task_model(model_type, task, seed=0, **overrides):
  """A tiny random transformers task model with perturbed biases, norms and heads, so
  parity checks every tensor's mapping."""
  torch.manual_seed(seed)
  model = AUTO[task].from_config(hf_config(model_type, task, **overrides)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "norm" in name.lower():
        p.add_(0.1 * torch.randn_like(p))
  return model
