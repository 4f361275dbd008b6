"""`--mode loop`: the whole training loop timed, not just the step, optionally next to a
plain PyTorch loop doing the same work in the same process.

Ours: the real trainer (`launch.trainer.train_and_evaluate`) for `--steps` steps in a
work directory (`--workdir`, default a temporary one): the real pipeline (Grain iteration,
tokenizer and data caches of the workdir), on-device masking, the step, metric logging
every `train.log_every` steps and the checkpoints (every `checkpoint.every` steps and at
the last). Held-out evaluation is off (`train.eval_batches=0`: the torch loop has none)
and the end-of-run export is outside the timing. The loop's phases
(launch/trainer/phases.py) split the wall time of the steps after the first (whose
compile is excluded): input iteration, host-to-device, step dispatch, device wait (at log
steps: the loop syncs nowhere else), metrics/logging, checkpoint.

Theirs (`--compare-hf`): transformers' class of the same architecture loaded with our
trained weights, `torch.optim.AdamW` (or the LAMB of launch/perf/bench/models.py) with the same
hyper-parameters, weight decay groups, clipping and linear warmup/decay schedule. Every
step reads the next batch from a fresh iterator of the same pipeline (the same rows in
the same order as ours), masks on the host as a data collator would (mask_rate of the
non-special tokens, at most the objective's prediction budget per row, 80/10/10
replacement), runs the encoder, the MLM head on the gathered masked positions only (the
same number of positions as our head: the same work as ours), the pair head if the
objective has one, backward, clipping and the optimizer step. The first step is excluded
too. Both sides report tokens/s (wall), CPU seconds (user, system) and minor page faults
per step over their timed window; the ratio is ours/theirs in tokens/s, and in tokens
per CPU second (more robust on a loaded machine).
"""
import os
import shutil
import tempfile
import time
from typing import Any, Dict

import numpy as np

from launch.trainer import phases as phases_lib

CACHES = ("tokenizer", "data_cache")  # launch/data's caches in a workdir
PAIR_LABELS = {"nsp": "next_sentence_label", "sop": "sentence_order_label"}


def loop_config(config, steps: int):
  """A private copy of `config` for `steps` timed steps: eval off, warmup within the run,
  a checkpoint at the end (and every `checkpoint.every` steps as configured)."""
  import ml_collections
  if steps < 2:
    raise ValueError(f"--steps={steps}: the loop needs at least 2 steps (the first one "
                     "compiles and is not timed)")
  c = ml_collections.ConfigDict(config.to_dict())
  c.train.steps = steps
  c.train.eval_batches = 0
  c.optimizer.warmup_steps = min(int(c.optimizer.warmup_steps), steps)
  c.logging.plot = False
  return c


def _side(tokens_per_step: int, rep: Dict[str, Any]) -> Dict[str, Any]:
  steps, wall, u = rep["steps"], rep["wall_s"], rep["usage"]
  cpu = u["user_s"] + u["sys_s"]
  return {**rep, "tokens_per_s": tokens_per_step * steps / wall if wall else float("nan"),
          "tokens_per_cpu_s": tokens_per_step * steps / cpu if cpu else float("nan"),
          "step_time_s": wall / steps if steps else float("nan"),
          "minflt_per_step": u["minflt"] / steps if steps else float("nan"),
          "sys_over_user": u["sys_s"] / u["user_s"] if u["user_s"] else float("nan")}


def run_ours(config, workdir: str) -> Dict[str, Any]:
  from launch import trainer
  ph = phases_lib.Phases()
  result = trainer.train_and_evaluate(config, workdir, phases=ph)
  return {"report": ph.report(), "result": result}


class TorchLoop:
  """The same-work transformers loop (see the module docstring)."""

  def __init__(self, config, objective, params, pipeline):
    import torch
    from launch.perf.bench.models import Theirs
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
    import torch
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
    import torch
    import torch.nn.functional as F
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


def bench_loop(config, steps: int, compare_hf: bool = False, workdir: str = "",
               log=print) -> Dict[str, Any]:
  """Runs ours (and theirs) for `steps` steps; see the module docstring."""
  import jax
  from launch.perf import runinfo
  from launch.trainer import loop as loop_lib
  config = loop_config(config, steps)
  tmp = None
  if not workdir:
    tmp = tempfile.TemporaryDirectory()
    workdir = tmp.name
  run_dir = os.path.join(os.path.abspath(workdir), f"loop_run_{os.getpid()}")
  try:
    # A fresh run (no checkpoint to resume) that shares the workdir's tokenizer and data
    # caches, so a kept --workdir trains the tokenizer once.
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    for cache in CACHES:
      os.makedirs(os.path.join(workdir, cache), exist_ok=True)
      os.symlink(os.path.abspath(os.path.join(workdir, cache)), os.path.join(run_dir, cache))
    t = time.perf_counter()
    ours = run_ours(config, run_dir)
    ours_total = time.perf_counter() - t
    setup = ours["result"]["setup"]
    prepared, pipeline = loop_lib.prepare(config, run_dir)
    from encoders import base
    base.resolve_auto(prepared.model, jax.devices()[0].platform)
    tokens = int(prepared.data.global_batch) * int(prepared.data.seq_len)
    result = {"mode": "loop", "steps": steps, "batch": int(prepared.data.global_batch),
              "seq": int(prepared.data.seq_len), "dtype": prepared.model.dtype,
              "config": runinfo.config_summary(prepared, setup.objective),
              "log_every": int(prepared.train.log_every),
              "checkpoint_every": int(prepared.checkpoint.every),
              "ours": _side(tokens, ours["report"]), "ours_total_s": ours_total}
    if compare_hf:
      state = ours["result"]["state"]
      params = jax.device_get({**state.params, **state.frozen})
      theirs = TorchLoop(prepared, setup.objective, params, pipeline)
      result["theirs"] = _side(tokens, theirs.run(steps))
      result["theirs"]["architecture"] = theirs.theirs.arch
      result["ratio_tokens_per_s"] = (result["ours"]["tokens_per_s"]
                                      / result["theirs"]["tokens_per_s"])
      result["ratio_tokens_per_cpu_s"] = (result["ours"]["tokens_per_cpu_s"]
                                          / result["theirs"]["tokens_per_cpu_s"])
  finally:
    shutil.rmtree(run_dir, ignore_errors=True)  # removes the links, not the caches
    if tmp is not None:
      tmp.cleanup()
  return result


PHASE_ORDER = ("input", "host_to_device", "step", "device_wait", "metrics", "eval",
               "checkpoint", "other")


def format_loop(r: Dict[str, Any]) -> list:
  """The report lines of a loop run."""
  sides = [("ours (jax)", r["ours"])] + (
      [("transformers (torch)", r["theirs"])] if "theirs" in r else [])
  lines = [f"loop: {r['steps']} steps ({r['ours']['steps']} timed), log every "
           f"{r['log_every']}, checkpoint every {r['checkpoint_every']} and at the end"]
  head = f"{'':24}" + "".join(f"{n:>24}" for n, _ in sides)
  lines.append(head)
  rows = [("tokens/s (wall)", lambda s: f"{s['tokens_per_s']:,.0f}"),
          ("tokens per CPU second", lambda s: f"{s['tokens_per_cpu_s']:,.0f}"),
          ("step time (wall)", lambda s: f"{s['step_time_s'] * 1e3:,.1f} ms"),
          ("CPU user", lambda s: f"{s['usage']['user_s']:,.2f} s"),
          ("CPU system", lambda s: f"{s['usage']['sys_s']:,.2f} s"),
          ("system / user", lambda s: f"{100 * s['sys_over_user']:.1f}%"),
          ("minor faults / step", lambda s: f"{s['minflt_per_step']:,.0f}")]
  for name, f in rows:
    lines.append(f"{name:24}" + "".join(f"{f(s):>24}" for _, s in sides))
  lines.append("where the wall time goes (host thread, timed steps):")
  for name, s in sides:
    ph = s["phases_s"]
    parts = [f"{k} {ph[k]:.2f}s ({100 * ph[k] / s['wall_s']:.0f}%)"
             for k in PHASE_ORDER if k in ph and s["wall_s"]]
    lines.append(f"  {name}: " + ", ".join(parts))
  if "theirs" in r:
    lines.append(f"transformers: {r['theirs']['architecture']}, MLM head on the gathered "
                 "masked positions only")
    lines.append(f"ratio ours/theirs: {r['ratio_tokens_per_s']:.2f}x tokens/s (wall), "
                 f"{r['ratio_tokens_per_cpu_s']:.2f}x tokens per CPU second")
  return lines
