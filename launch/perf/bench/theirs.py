"""The PyTorch side of a benchmark (`--compare-hf`; torch and transformers are the `hf`
extra): transformers' model of the same architecture loaded with our weights (`Theirs`),
torch versions of the optimizers torch lacks (LAMB, StableAdamW), the same-work torch
training loop of `--mode loop` (`TorchLoop`), and torch's matmul rate for the CPU peak."""
import contextlib
import json
import os
import tempfile
import time
from typing import Any, Dict

import numpy as np
import torch
import torch.nn.functional as F
import transformers

from launch.trainer import devices as devices_lib
from launch.trainer import phases as phases_lib

PAIR_LABELS = {"nsp": "next_sentence_label", "sop": "sentence_order_label"}


def _adam_moments(st, p, b1, b2):
  """One Adam moment update of parameter `p` in torch (state dict `st`, created on first
  use) -> the bias-corrected (m_hat, v_hat); shared by the torch LAMB and StableAdamW."""
  if not st:
    st.update(t=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
  st["t"] += 1
  st["m"].mul_(b1).add_(p.grad, alpha=1 - b1)
  st["v"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
  return st["m"] / (1 - b1 ** st["t"]), st["v"] / (1 - b2 ** st["t"])


def torch_lamb(groups, lr, betas, eps):
  """optax.lamb's update in torch, which has no LAMB: Adam moments with bias correction,
  decoupled weight decay on the decay group, then a per-tensor trust ratio ||p|| / ||u||
  (1 where either norm is 0), as optax's scale_by_trust_ratio."""

  class Lamb(torch.optim.Optimizer):
    @torch.no_grad()
    def step(self):
      for g in self.param_groups:
        b1, b2 = g["betas"]
        for p in g["params"]:
          if p.grad is None:
            continue
          m_hat, v_hat = _adam_moments(self.state[p], p, b1, b2)
          u = m_hat / (v_hat.sqrt() + g["eps"])
          if g["weight_decay"]:
            u.add_(p, alpha=g["weight_decay"])
          pn, un = p.norm(), u.norm()
          trust = torch.where((pn > 0) & (un > 0), pn / un, torch.ones_like(pn))
          p.sub_(g["lr"] * trust * u)

  return Lamb(groups, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0))


def torch_stable_adamw(groups, lr, betas, eps):
  """launch/trainer/stable_adamw.py's update in torch (transformers' Trainer has no
  StableAdamW): AdamW whose step per tensor, decay included, is divided by
  max(1, RMS(g / sqrt(max(v_hat, eps^2))))."""

  class StableAdamW(torch.optim.Optimizer):
    @torch.no_grad()
    def step(self):
      for g in self.param_groups:
        b1, b2 = g["betas"]
        for p in g["params"]:
          if p.grad is None:
            continue
          m_hat, v_hat = _adam_moments(self.state[p], p, b1, b2)
          rms = (p.grad.square() / v_hat.clamp_min(g["eps"] ** 2)).mean().sqrt()
          u = m_hat / (v_hat.sqrt() + g["eps"])
          if g["weight_decay"]:
            u.add_(p, alpha=g["weight_decay"])
          p.sub_(g["lr"] * u / rms.clamp_min(1.0))

  return StableAdamW(groups, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0})


class Theirs:
  """The transformers PyTorch model of the same architecture, loaded with our weights."""

  def __init__(self, config, mode: str, objective, params):
    self.config, self.mode, self.objective = config, mode, objective
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "hf")
      objective.export(params, path)
      with open(os.path.join(path, "config.json")) as f:
        self.arch = json.load(f)["architectures"][0]
      # An objective whose work is more than one transformers class (RTD: generator +
      # discriminator) gives its own torch reference.
      reference = getattr(objective, "reference_model", None)
      self.model = (reference(path) if reference is not None
                    else getattr(transformers, self.arch).from_pretrained(path))
    self.attn_implementation = getattr(self.model.config, "_attn_implementation", None)
    self.autocast = config.model.dtype != "float32"
    self.torch_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        config.model.dtype)
    if mode == "train":
      self.model.train()
      o = config.optimizer
      decay = [p for n, p in self.model.named_parameters()
               if p.ndim >= 2 and "norm" not in n.lower()]
      no_decay = [p for n, p in self.model.named_parameters()
                  if not (p.ndim >= 2 and "norm" not in n.lower())]
      groups = [{"params": decay, "weight_decay": o.weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]
      if o.name == "adamw":
        self.opt = torch.optim.AdamW(groups, lr=o.learning_rate, betas=(o.b1, o.b2),
                                     eps=o.eps)
      elif o.name == "lamb":
        self.opt = torch_lamb(groups, o.learning_rate, (o.b1, o.b2), o.eps)
      elif o.name == "stable_adamw":
        self.opt = torch_stable_adamw(groups, o.learning_rate, (o.b1, o.b2), o.eps)
      else:
        raise ValueError(f"--compare-hf has no torch optimizer for {o.name!r}")
    else:
      self.model.eval()

  def inputs(self, host_batch, seed: int = 0):
    """Torch inputs of the same batch (in train mode with labels, masked as a data
    collator would, outside the timed step)."""
    x = self.objective.reference_inputs(host_batch, self.mode == "train", seed)
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in x.items()}

  def _autocast(self):
    if not self.autocast:
      return contextlib.nullcontext()
    return torch.autocast(device_type="cpu", dtype=self.torch_dtype)

  def run(self, x):
    if self.mode == "train":
      with self._autocast():
        loss = self.model(**x).loss
      loss.backward()
      clip = self.config.optimizer.clip_norm
      if clip and clip > 0:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
      self.opt.step()
      self.opt.zero_grad(set_to_none=True)
      return loss
    with torch.inference_mode(), self._autocast():
      return self.model(**x, output_hidden_states=True)

  def step(self, x) -> float:
    t = time.perf_counter()
    self.run(x)
    return time.perf_counter() - t

  def step_flops(self, batch: int, seq: int) -> float:
    """transformers decodes every position in its heads."""
    return batch * self.objective.flops_per_example(seq, train=self.mode == "train",
                                                    all_positions=True)


class TorchLoop:
  """The same-work transformers loop (see the module docstring)."""

  def __init__(self, config, objective, params, pipeline):
    self.config, self.objective, self.pipeline = config, objective, pipeline
    self.theirs = Theirs(config, "train", objective, params)
    model = self.theirs.model
    self.base = getattr(model, model.base_model_prefix)
    cls = getattr(model, "cls", None)
    self.mlm_head = getattr(cls, "predictions", None) if cls is not None else getattr(
        model, "lm_head", None)
    self.pair = getattr(objective, "pair", None)
    self.pair_head = getattr(cls, "seq_relationship", None) if self.pair == "nsp" else None
    if self.mlm_head is None or (self.pair and self.pair_head is None):
      raise SystemExit(f"--mode loop --compare-hf: no same-work torch loop for "
                       f"{self.theirs.arch} with objective {objective.name!r} (BERT-style "
                       "MLM and MLM+NSP are supported)")
    o = config.optimizer
    total, warm = int(config.train.steps), int(o.warmup_steps)

    def lr_factor(s):  # launch/trainer/optim.py's linear schedule
      if s < warm:
        return s / warm
      return max(0.0, (total - s) / max(1, total - warm))

    self.sched = torch.optim.lr_scheduler.LambdaLR(self.theirs.opt, lr_factor)
    self.budget = int(objective.max_predictions) or int(config.data.seq_len)
    self.rng = np.random.default_rng(int(config.train.seed))

  def collate(self, b):
    """Host masking as a collator: at most `budget` positions per row, mask_rate of the
    non-special tokens, 80% [MASK] / 10% random / 10% kept."""
    c = self.objective.cfg
    ids = np.asarray(b["input_ids"]).astype(np.int64)
    r = self.rng.random(ids.shape)
    r[np.asarray(b["special_tokens_mask"], bool)] = 2.0
    pos = np.argsort(r, axis=1)[:, :self.budget]
    weights = np.take_along_axis(r, pos, 1) < c.mask_rate
    labels = np.take_along_axis(ids, pos, 1)
    u = self.rng.random(pos.shape)
    rows = np.arange(ids.shape[0])[:, None]
    masked = ids.copy()
    mask_tok = weights & (u < c.mask_token_prob)
    rand_tok = weights & (u >= c.mask_token_prob) & (
        u < c.mask_token_prob + c.random_token_prob)
    masked[rows, pos] = np.where(mask_tok, self.objective.mask_id, np.where(
        rand_tok, self.rng.integers(0, self.objective.vocab_size, pos.shape), labels))
    x = {"input_ids": masked, "attention_mask": (np.asarray(b["segment_ids"]) > 0),
         "token_type_ids": np.asarray(b["token_type_ids"]),
         "positions": pos, "labels": labels, "weights": weights.astype(np.float32)}
    if self.pair:
      x["pair"] = np.maximum(np.asarray(b[PAIR_LABELS[self.pair]]), 0)
    return {k: torch.from_numpy(np.ascontiguousarray(v)).to(
        torch.float32 if k == "weights" else torch.int64) for k, v in x.items()}

  def step(self, x):
    t = self.theirs
    with t._autocast():  # pylint: disable=protected-access
      out = self.base(input_ids=x["input_ids"], attention_mask=x["attention_mask"],
                      token_type_ids=x["token_type_ids"])
      h = out.last_hidden_state
      idx = x["positions"].unsqueeze(-1).expand(-1, -1, h.shape[-1])
      logits = self.mlm_head(torch.gather(h, 1, idx)).float()
      ce = F.cross_entropy(logits.flatten(0, 1), x["labels"].flatten(), reduction="none")
      w = x["weights"].flatten()
      loss = (ce * w).sum() / w.sum().clamp(min=1.0)
      if self.pair_head is not None:
        loss = loss + F.cross_entropy(self.pair_head(out.pooler_output).float(), x["pair"])
    loss.backward()
    clip = self.config.optimizer.clip_norm
    if clip and clip > 0:
      torch.nn.utils.clip_grad_norm_(t.model.parameters(), clip)
    t.opt.step()
    self.sched.step()
    t.opt.zero_grad(set_to_none=True)
    return loss

  def run(self, steps: int) -> Dict[str, Any]:
    spec = self.objective.batch_spec()
    it = self.pipeline.train_iter()
    ph = phases_lib.Phases()
    log_every = int(self.config.train.log_every)
    losses = []
    for s in range(1, steps + 1):
      with ph("input"):
        x = self.collate(spec.select(next(it)))
      with ph("step"):
        losses.append(self.step(x).detach())
      ph.step_dispatched(s)
      if s % log_every == 0 or s == steps:
        with ph("metrics"):
          float(sum(losses)) / len(losses)
          losses = []
    ph.finish()
    return ph.report()


def matmul_flops(n: int, dtype: str, repeats: int) -> float:
  dt = {"float32": torch.float32, "bfloat16": torch.bfloat16,
        "float16": torch.float16}[str(dtype)]
  a, b = torch.ones(n, n, dtype=dt), torch.full((n, n), 0.5, dtype=dt)
  with torch.inference_mode():
    return devices_lib.best_rate(lambda: torch.matmul(a, b), 2 * n ** 3, repeats)
