"""Pretraining as a job of the one loop (loop.py): the config's data pipeline (Grain,
checkpointable), held-out evaluation every `train.eval_every` steps, the objective's
trivial baselines, and at the end the objective's export, the loss plot and its demo."""
import logging
from typing import Any, Dict, Optional

import jax
import jax.numpy as jnp
import ml_collections

import objectives
from launch import data as data_lib
from launch.data import badinput
from launch.trainer import checks
from launch.trainer import loop
from launch.trainer import metrics as metrics_lib
from launch.trainer import report
from launch.trainer import sharding as shard_lib
from launch.trainer.state import Setup
from launch.trainer.step import eval_key
from objectives import losses

log = logging.getLogger("encoder_zoo")
BASELINE_TRAIN_BATCHES = 50  # training batches the baselines count frequencies on


def adopt_tokenizer(config, tokenizer):
  """The tokenizer decides the vocabulary and the padding id of a new model. A model
  that comes from a checkpoint (`init_from`) keeps its table: the tokenizer must fit."""
  m = config.model
  if config.get("init_from", ""):
    if tokenizer.vocab_size > m.vocab_size or tokenizer.pad_id != m.pad_token_id:
      raise ValueError(
          f"init_from={config.init_from!r}: the tokenizer (vocab {tokenizer.vocab_size}, "
          f"pad {tokenizer.pad_id}) does not fit the model (vocab_size {m.vocab_size}, "
          f"pad_token_id {m.pad_token_id})")
    return
  if m.vocab_size != tokenizer.vocab_size or m.pad_token_id != tokenizer.pad_id:
    log.info("model.vocab_size %d -> %d and pad_token_id %d -> %d from the tokenizer",
             m.vocab_size, tokenizer.vocab_size, m.pad_token_id, tokenizer.pad_id)
  m.vocab_size = tokenizer.vocab_size
  m.pad_token_id = tokenizer.pad_id


def prepare(config, workdir: str):
  """A private copy of the config with the objective's changes (`init_from`), the data
  pipeline, and the model sized to the tokenizer. -> (config, pipeline)"""
  config = ml_collections.ConfigDict(config.to_dict())  # a private, unlocked copy
  objectives.prepare_config(config)
  try:
    pipeline = data_lib.make_pipeline(config, workdir)
  except badinput.InputDataError:
    raise
  except ValueError as e:  # the data cannot train this run (named): one line at the CLI
    raise badinput.InputDataError(" ".join(str(e).split())) from e
  adopt_tokenizer(config, pipeline.tokenizer)
  return config, pipeline


def evaluate(setup: Setup, state, eval_batches) -> Dict[str, float]:
  total = {}
  for i, b in enumerate(eval_batches):
    sums = setup.eval_step(state, shard_lib.global_batch(b, setup.batch_sharding),
                           jnp.asarray(i, jnp.int32))
    total = losses.add_metrics(total, jax.device_get(sums))
  return losses.finalize_metrics({k: float(v) for k, v in total.items()}) if total else {}


def bad_data_skipped(pipeline) -> int:
  """The bad input the data pipeline skipped so far (`stats["bad_data"]`, kind ->
  count, where the source reports it; with the shard readers' own counts)."""
  stats = getattr(pipeline, "stats", None) or {}
  bad = stats.get("bad_data") if hasattr(stats, "get") else None
  if callable(getattr(pipeline, "bad_data", None)):
    bad = pipeline.bad_data()
  total = 0
  for counts in (bad, stats.get("preprocess_bad_data") if hasattr(stats, "get") else None):
    if isinstance(counts, dict):
      total += int(sum(v for v in counts.values() if isinstance(v, (int, float))))
    elif isinstance(counts, (int, float)):
      total += int(counts)
  return total


def train_and_evaluate(config, workdir: str, devices=None, stop_after: Optional[int] = None,
                       phases=None) -> Dict[str, Any]:
  """Pretraining: the one loop (loop.train_and_evaluate) with the config's data."""
  return loop.train_and_evaluate(config, workdir, PretrainJob(), devices, stop_after, phases)


class PretrainJob(loop.Job):
  """The config's pretraining data and held-out split (launch/data)."""

  def __init__(self):
    self.pipeline = None
    self.eval_batches = []
    self.config = None

  def check(self, config, devices):
    return checks.check(config, devices)

  def finished(self, workdir, config):
    done = report.finished(workdir, int(config.train.steps))
    if done is None:
      return None
    return {"state": None, "eval": report.say_complete(workdir, done), "setup": None,
            "step": done, "stopped": False}

  def prepare(self, config, workdir):
    config, self.pipeline = prepare(config, workdir)
    self.tokenizer = self.pipeline.tokenizer
    self.config = config
    return config

  def train_iter(self, start_state=None):
    return self.pipeline.train_iter(start_state=start_state)

  def start(self, setup):
    spec = setup.objective.batch_spec()
    self.eval_batches = [spec.select(b) for b in
                         self.pipeline.eval_batches(self.config.train.eval_batches)]
    for b in self.eval_batches:
      setup.objective.check_batch(b)

  def record(self, setup):
    return {"data": self.pipeline.stats}

  def baselines(self, setup) -> Dict[str, Any]:
    """The objective's trivial predictors, scored on the eval's own examples and masks."""
    if not self.eval_batches:
      return {}
    it = self.pipeline.train_iter()
    n = min(BASELINE_TRAIN_BATCHES, self.pipeline.steps_per_epoch)
    train_batches = [next(it) for _ in range(n)]
    items = [(b, eval_key(i)) for i, b in enumerate(self.eval_batches)]
    return setup.objective.baselines(train_batches, items)

  def bad_data_skipped(self):
    return bad_data_skipped(self.pipeline)

  def eval_due(self, step, total):
    return bool(self.eval_batches) and (step % self.config.train.eval_every == 0
                                        or step == total)

  def evaluate(self, setup, state, step):
    return evaluate(setup, state, self.eval_batches)

  def export(self, setup, host_params, path):
    setup.objective.export(host_params, path, self.pipeline.tokenizer)

  def finish(self, setup, host_params, workdir, writer):
    if self.config.logging.plot:
      metrics_lib.plot(workdir)
    lines = setup.objective.demo_lines(host_params, self.pipeline.tokenizer,
                                       self.pipeline.eval_batches(1))
    if lines:
      print("\n".join(lines), flush=True)
    report.say_artifacts(workdir, self.config, self.pipeline.tokenizer.id_to_token(
        self.pipeline.tokenizer.mask_id))
