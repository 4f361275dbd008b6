"""The two sides of a benchmark: our jitted step (`Ours`: the trainer's train step, or the
objective's inference forward) and the transformers PyTorch model of the same
architecture loaded with our weights (`Theirs`)."""
import json
import os
import tempfile
import time

import numpy as np

from launch.trainer import devices as devices_lib
from launch.perf.synthetic import SyntheticTokenizer


class Ours:
  """Our jitted step (forward or train) for one config, with per-shape compiled programs."""

  def __init__(self, config, mode: str, devices=None):
    import flax.linen as nn
    import jax
    import objectives
    from launch import trainer
    from launch.trainer import sharding as shard_lib
    self.config, self.mode = config, mode
    self.compiled, self.compile_s, self.memory = {}, {}, {}
    self.tok = SyntheticTokenizer.for_model(config.model)
    if mode == "train":
      self.setup = trainer.build(config, self.tok, devices)
      self.objective = self.setup.objective
      self.mesh, self.batch_sharding = self.setup.mesh, self.setup.batch_sharding
      self.state = self.setup.init_state()
      self.fn = self.setup.train_step
    elif mode == "forward":
      self.mesh = shard_lib.make_mesh(config.mesh.shape, devices)
      rules = shard_lib.rules_tuple(config.mesh.rules)
      self.objective = objective = objectives.get_objective(config, self.tok)
      key = jax.random.PRNGKey(config.train.seed)
      with nn.logical_axis_rules(rules):
        boxed = jax.eval_shape(objective.init, key)
      shardings = shard_lib.logical_shardings(boxed, self.mesh, rules)

      def init_unboxed(k):
        with nn.logical_axis_rules(rules):
          return nn.unbox(objective.init(k))

      self.params = jax.jit(init_unboxed, out_shardings=shardings)(key)
      self.batch_sharding = shard_lib.batch_sharding(self.mesh, rules)

      def forward(params, b):
        with nn.logical_axis_rules(rules):
          return objective.forward(params, b)

      self.fn = shard_lib.MeshJit(
          self.mesh, jax.jit(forward, in_shardings=(shardings, self.batch_sharding)))
    else:
      raise ValueError(f"--mode must be forward or train, got {mode!r}")

  def device_batch(self, host_batch):
    from launch.trainer import sharding as shard_lib
    return shard_lib.global_batch(host_batch, self.batch_sharding)

  def params_for_export(self):
    import jax
    if self.mode == "train":
      return jax.device_get({**self.state.params, **self.state.frozen})
    return jax.device_get(self.params)

  def shape_key(self, b):
    return tuple(tuple(v.shape) for v in b.values())

  def compile(self, b):
    key = self.shape_key(b)
    if key not in self.compiled:
      t = time.perf_counter()
      args = (self.state, b) if self.mode == "train" else (self.params, b)
      self.compiled[key] = self.fn.lower(*args).compile()
      self.compile_s[key] = time.perf_counter() - t
      self.memory[key] = devices_lib.memory_bytes(self.compiled[key])
    return self.compiled[key]

  def step(self, b):
    """Runs one step on a device batch and waits for it; returns seconds."""
    import jax
    fn = self.compile(b)
    t = time.perf_counter()
    if self.mode == "train":
      self.state, sums = fn(self.state, b)
      jax.block_until_ready((self.state, sums))
    else:
      jax.block_until_ready(fn(self.params, b))
    return time.perf_counter() - t

  def output(self, b):
    """The forward's output (forward mode)."""
    return self.compile(b)(self.params, b)

  def step_flops(self, batch: int, seq: int) -> float:
    """Train: the objective's step (e.g. the MLM head on its prediction budget only);
    forward: every head on every position."""
    if self.mode == "train":
      return batch * self.objective.flops_per_example(seq)
    return batch * self.objective.flops_per_example(seq, train=False, all_positions=True)


def _adam_moments(st, p, b1, b2):
  """One Adam moment update of parameter `p` in torch (state dict `st`, created on first
  use) -> the bias-corrected (m_hat, v_hat); shared by the torch LAMB and StableAdamW."""
  import torch
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
  import torch

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
  import torch

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
    import torch
    import transformers
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
    import torch
    x = self.objective.reference_inputs(host_batch, self.mode == "train", seed)
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in x.items()}

  def _autocast(self):
    import contextlib
    import torch
    if not self.autocast:
      return contextlib.nullcontext()
    return torch.autocast(device_type="cpu", dtype=self.torch_dtype)

  def run(self, x):
    import torch
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
