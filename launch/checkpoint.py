"""Orbax checkpoints of the train state and the data iterator.

A checkpoint is the sharded TrainState (params, optimizer state, step, RNG) plus the
Grain iterator state as JSON, so a restart continues the same data stream. Orbax writes
each step to a temporary directory and renames it when complete, so an interrupted save
never leaves a half-written checkpoint that a resume would pick up. Restoring takes the
target shardings from the abstract state, so a run saved on one mesh layout restores onto
another.
"""
import logging

import orbax.checkpoint as ocp

log = logging.getLogger("encoder_zoo")


class Manager:

  def __init__(self, directory: str, ckpt_config):
    self.mngr = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=int(ckpt_config.keep),
            enable_async_checkpointing=bool(ckpt_config.use_async),
            create=True),
        item_names=("state", "data"))

  def latest_step(self):
    return self.mngr.latest_step()

  def save(self, step: int, state, data_state: dict):
    self.mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)))

  def restore_latest(self, abstract_state):
    """-> (state placed on abstract_state's shardings, data iterator state) or None."""
    step = self.mngr.latest_step()
    if step is None:
      return None
    log.info("restoring checkpoint of step %d", step)
    out = self.mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    return out["state"], out["data"]

  def wait(self):
    self.mngr.wait_until_finished()

  def close(self):
    self.mngr.wait_until_finished()
    self.mngr.close()
