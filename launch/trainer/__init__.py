"""The one trainer for every objective.

  state.py       the run's setup: mesh, objective, optimizer, sharded state, jitted steps
  step.py        the update step (exact gradient accumulation) and the eval step
  loop.py        the one loop: checks, claim, resume or init, metrics, evals,
                 checkpoints, SIGTERM, export; a Job says what is trained and evaluated
  pretraining.py the pretraining job (data pipeline, held-out eval, export, demo)
  finetuning.py  the fine-tuning job (labelled rows in epochs, eval per epoch, best/)
  optim.py       Optax optimizers and schedules
  sharding.py    mesh, logical-axis rules, shardings, MeshJit
  checkpoint.py  Orbax checkpoints of the state and the data iterator
  metrics.py     console / JSONL / TensorBoard metrics and the loss plot
"""
from launch.trainer.loop import Job
from launch.trainer.pretraining import adopt_tokenizer, evaluate, prepare, train_and_evaluate
from launch.trainer.state import Setup, build, compiler_options, compiler_options_line
from launch.trainer.step import EVAL_SEED, TrainState, eval_key, gradients

__all__ = ["Job", "Setup", "TrainState", "build", "compiler_options", "compiler_options_line",
           "train_and_evaluate", "prepare", "adopt_tokenizer", "evaluate", "gradients",
           "eval_key", "EVAL_SEED"]
