"""Held-out report of a replaced-token-detection run, from its workdir's latest checkpoint.

  python -m launch.rtd_eval --workdir /tmp/electra_tiny

Restores the run (its config.json, data cache and checkpoint), scores the eval batches
exactly as the trainer's eval does, and prints, next to the never-flag baseline on the
same tokens: discriminator accuracy, precision, recall and ROC AUC over the real tokens,
the replaced fraction, and the generator's MLM accuracy.
"""
import json
import os
import sys

import jax
import ml_collections
from absl import app, flags

from launch import trainer
from launch.trainer import checkpoint as ckpt_lib
from launch.trainer import sharding as shard_lib
from objectives import rtd


def report(workdir: str, devices=None) -> dict:


  for need in ("config.json", "checkpoints"):  # before anything reads or caches data
    if not os.path.exists(os.path.join(workdir, need)):
      raise ValueError(f"{workdir} is not a training work directory (no {need}); give an "
                       "rtd run's --workdir")
  with open(os.path.join(workdir, "config.json")) as f:
    config = ml_collections.ConfigDict(json.load(f))
  config.mesh.shape = tuple(config.mesh.shape)
  config.mesh.rules = tuple((k, tuple(v) if isinstance(v, list) else v)
                            for k, v in config.mesh.rules)
  config.model.heads = tuple(config.model.heads)
  config, pipeline = trainer.prepare(config, workdir)
  setup = trainer.build(config, pipeline.tokenizer, devices)
  if not isinstance(setup.objective, rtd.ReplacedTokenDetection):
    raise ValueError(f"{workdir} is not an rtd run (objective {config.objective.name!r})")
  manager = ckpt_lib.Manager(os.path.join(workdir, "checkpoints"), config.checkpoint)
  restored = manager.restore_latest(setup.abstract_state)
  manager.close()
  if restored is None:
    raise ValueError(f"no checkpoint in {workdir}/checkpoints")
  state, _ = restored
  spec = setup.objective.batch_spec()
  batches = [spec.select(b) for b in pipeline.eval_batches(config.train.eval_batches)]
  metrics = trainer.evaluate(setup, state, batches)
  params = {**state.params, **state.frozen}
  items = [(shard_lib.global_batch(b, setup.batch_sharding), trainer.eval_key(i))
           for i, b in enumerate(batches)]
  auc = rtd.held_out_auc(setup.objective, params, items)
  out = {"step": int(jax.device_get(state.step)),
         "tokens": metrics["rtd_count"],
         "replaced_fraction": metrics["rtd_fraction_replaced"],
         "accuracy": metrics["rtd_accuracy"],
         "precision": metrics["rtd_flagged_accuracy"],
         "recall": metrics["rtd_replaced_accuracy"],
         "flagged_fraction": metrics["rtd_fraction_flagged"],
         "auc": auc["rtd_auc"],
         "generator_mlm_accuracy": metrics["mlm_accuracy"],
         "baseline_never_flag": {"accuracy": metrics["rtd_all_original_accuracy"],
                                 "precision": 0.0, "recall": 0.0, "auc": 0.5}}
  return out


def main(argv):
  del argv
  try:
    out = report(flags.FLAGS.workdir)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps(out, indent=2))
  return 0


if __name__ == "__main__":
  flags.DEFINE_string("workdir", None, "an rtd run's workdir")
  flags.mark_flag_as_required("workdir")
  app.run(main)
