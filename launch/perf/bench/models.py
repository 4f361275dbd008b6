"""Our side of a benchmark: the jitted step (`Ours`: the trainer's train step, or the
objective's inference forward). The transformers side is in theirs.py."""
import time

import flax.linen as nn
import jax

import objectives
from launch import trainer
from launch.perf.synthetic import SyntheticTokenizer
from launch.trainer import devices as devices_lib
from launch.trainer import sharding as shard_lib


class Ours:
  """Our jitted step (forward or train) for one config, with per-shape compiled programs."""

  def __init__(self, config, mode: str, devices=None):
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
    return shard_lib.global_batch(host_batch, self.batch_sharding)

  def params_for_export(self):
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
