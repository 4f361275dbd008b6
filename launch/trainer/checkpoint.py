"""Orbax checkpoints of the train state and the data iterator.

A checkpoint is the sharded TrainState (params, optimizer state, step, RNG) plus each
process's data-iterator state (one JSON file per process, through Grain's checkpoint
handler: on a multi-host job every host reads its own shard of the stream), so a restart
continues the same data stream. Orbax writes
each step to a temporary directory and renames it when complete, so an interrupted save
never leaves a half-written checkpoint that a resume would pick up. Restoring takes the
target shardings from the abstract state, so a run saved on one mesh layout restores onto
another.
"""
import json
import logging

import grain
import orbax.checkpoint as ocp

from launch.trainer import guard

log = logging.getLogger("encoder_zoo")


class _IteratorSnapshot:
  """The iterator state as it was when `save` was called (an async save must not read
  the live iterator later), in the shape Grain's checkpoint handler writes and reads."""

  def __init__(self, state=None):
    self.raw = json.dumps(state).encode() if state is not None else b"null"

  def get_state(self) -> bytes:
    return self.raw

  def set_state(self, raw: bytes):
    self.raw = raw

  def start_prefetch(self):
    pass

  def state(self):
    return json.loads(self.raw.decode())


class Manager:

  def __init__(self, directory: str, ckpt_config):
    self.mngr = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=int(ckpt_config.keep),
            enable_async_checkpointing=bool(ckpt_config.use_async),
            create=True),
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "data": grain.checkpoint.CheckpointHandler()})

  def latest_step(self):
    return self.mngr.latest_step()

  def save(self, step: int, state, data_state: dict):
    guard.assert_finite(state, step)  # a checkpoint holding NaN/inf is never written
    saved = self.mngr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(_IteratorSnapshot(data_state))))
    if not saved:  # never a run that says it saved when Orbax declined
      raise RuntimeError(f"the checkpoint of step {step} was not written (the newest is "
                         f"step {self.mngr.latest_step()}); {self.mngr.directory}")

  def restore_latest(self, abstract_state):
    """-> (state placed on abstract_state's shardings, data iterator state) or None.

    Only committed steps count (an interrupted save leaves a temporary directory, which
    is ignored); a committed step that still fails to restore (a torn copy, a storage
    fault) is skipped with a warning for the step before it.
    """
    steps = sorted(self.mngr.all_steps(), reverse=True)
    for i, step in enumerate(steps):
      log.info("restoring checkpoint of step %d", step)
      try:
        out = self.mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=grain.checkpoint.CheckpointRestore(_IteratorSnapshot())))
        return out["state"], out["data"].state()
      except Exception as e:  # pylint: disable=broad-except
        if i + 1 == len(steps):
          raise
        log.warning("checkpoint of step %d does not restore (%s: %s); using step %d",
                    step, type(e).__name__, str(e).splitlines()[0] if str(e) else "",
                    steps[i + 1])
    return None

  def wait(self):
    self.mngr.wait_until_finished()

  def close(self):
    self.mngr.wait_until_finished()
    self.mngr.close()
