"""Non-finite losses and gradient-norm spikes: skip the update and count it, or stop.

`train.nonfinite_policy`:
- "stop" (default): a step whose loss or gradient norm is NaN/inf (or, with
  `train.grad_spike_factor` > 0, whose gradient norm spikes) does not update the state;
  the loop then stops with a `FloatingPointError` naming the step, at the next log or
  checkpoint, before anything is saved. The last checkpoint is from before the bad step.
- "skip": the update is skipped (params and optimizer state unchanged; the step counter
  and the data stream move on) and counted in the train metrics `skipped_nonfinite` and
  `skipped_spike` (sums over the log interval); the run goes on.
- "off": no check in the step (a NaN update is applied).

Under "skip", divergence is still loud (`SkipTracker`): the run stops with `Diverged`
(one line, non-zero exit) once `train.max_consecutive_skips` updates in a row were
skipped, and a finished run that skipped more than `train.max_skipped_fraction` of its
steps is refused before its export. The console line shows the skipped count, and its
loss is the mean over the applied steps only.

Whatever the policy, `assert_finite` keeps a checkpoint holding NaN/inf from being written
(`launch.trainer.checkpoint`), and `assert_finite_params` an export.

A spike is a gradient norm above `grad_spike_factor` times the running mean (an
exponential moving average, decay `SPIKE_EMA_DECAY`, of the accepted steps' norms), once
`grad_spike_warmup` steps have been accepted. The running mean lives in the optimizer
state (`wrap`), which is only wrapped when spike detection is on, so the default
optimizer state is unchanged.
"""
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

POLICIES = ("stop", "skip", "off")
SPIKE_EMA_DECAY = 0.99
COUNTERS = ("skipped_nonfinite", "skipped_spike")


class Diverged(FloatingPointError):
  """The run skipped too many updates (or would export non-finite weights)."""


def settings(train_cfg) -> tuple[str, float, int]:
  """(policy, spike factor, spike warmup) of the config's `train` section, checked."""
  policy = train_cfg.get("nonfinite_policy", "stop")
  factor = float(train_cfg.get("grad_spike_factor", 0.0))
  warmup = int(train_cfg.get("grad_spike_warmup", 100))
  if policy not in POLICIES:
    raise ValueError(f"train.nonfinite_policy={policy!r}; expected one of {POLICIES}")
  if factor != 0 and factor <= 1:
    raise ValueError(f"train.grad_spike_factor={factor}: use 0 (off) or a factor > 1")
  if factor and policy == "off":
    raise ValueError("train.grad_spike_factor needs train.nonfinite_policy stop or skip")
  if warmup < 0:
    raise ValueError(f"train.grad_spike_warmup={warmup} must be >= 0")
  return policy, factor, warmup


class SpikeState(NamedTuple):
  inner: Any
  ema: jax.Array  # float32: running mean of accepted gradient norms
  count: jax.Array  # int32: accepted steps seen
  spike: jax.Array  # bool: the last update's gradient norm was a spike


def wrap(tx: optax.GradientTransformation, train_cfg) -> optax.GradientTransformation:
  """`tx` with spike detection in its state when `train.grad_spike_factor` > 0, else `tx`."""
  _, factor, warmup = settings(train_cfg)
  if not factor:
    return tx

  def init(params):
    return SpikeState(tx.init(params), jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32),
                      jnp.zeros((), bool))

  def update(grads, state, params=None):
    norm = optax.tree.norm(grads).astype(jnp.float32)
    spike = (state.count >= warmup) & (norm > factor * state.ema)
    updates, inner = tx.update(grads, state.inner, params)
    ema = jnp.where(state.count == 0, norm,
                    SPIKE_EMA_DECAY * state.ema + (1 - SPIKE_EMA_DECAY) * norm)
    return updates, SpikeState(inner, ema, state.count + 1, spike)

  return optax.GradientTransformation(init, update)


def select(train_cfg, old_params, old_opt, new_params, new_opt, sums):
  """Inside the step: (params, opt_state, sums) with a bad update undone and counted."""
  policy, _, _ = settings(train_cfg)
  if policy == "off":
    return new_params, new_opt, sums
  finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(v)) for v in jax.tree.leaves(sums)
                              if jnp.issubdtype(v.dtype, jnp.floating)]))
  spike = new_opt.spike if isinstance(new_opt, SpikeState) else jnp.zeros((), bool)
  spike = spike & finite
  bad = ~finite | spike
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(bad, o, n), new, old)
  params, opt = keep(new_params, old_params), keep(new_opt, old_opt)
  if isinstance(new_opt, SpikeState):  # the flag itself reports this step
    opt = opt._replace(spike=spike)
  sums = {k: (v if k == "learning_rate" else jnp.where(bad, jnp.zeros_like(v), v))
          for k, v in sums.items()}
  sums["skipped_nonfinite"] = (~finite).astype(jnp.float32)
  sums["skipped_spike"] = spike.astype(jnp.float32)
  return params, opt, sums


def check(counts: dict, train_cfg, step: int, first_step: int) -> None:
  """On the host, with summed metrics since `first_step`: raises under policy "stop"."""
  policy, factor, _ = settings(train_cfg)
  n_nan = int(counts.get("skipped_nonfinite", 0))
  n_spike = int(counts.get("skipped_spike", 0))
  if policy != "stop" or not n_nan + n_spike:
    return
  what = []
  if n_nan:
    what.append(f"{n_nan} with a NaN/inf loss or gradient norm")
  if n_spike:
    what.append(f"{n_spike} with a gradient-norm spike (> {factor} x its running mean)")
  raise FloatingPointError(
      f"training stopped at step {step}: of the steps {first_step + 1}..{step}, "
      f"{' and '.join(what)}; those updates were not applied and no checkpoint holds "
      "them. Lower the learning rate or check the data, or set "
      "train.nonfinite_policy='skip' to skip such updates and go on.")


def check_pending(pending: list, train_cfg, step: int, first_step: int) -> None:
  """`check` over device metric sums not fetched yet (before a checkpoint is written)."""
  if settings(train_cfg)[0] != "stop" or not pending or COUNTERS[0] not in pending[0]:
    return
  got = jax.device_get([{k: s[k] for k in COUNTERS} for s in pending])
  check({k: sum(float(g[k]) for g in got) for k in COUNTERS}, train_cfg, step, first_step)


@jax.jit
def _all_finite(tree):
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def assert_finite(state, step: int) -> None:
  """Raises FloatingPointError when the params or optimizer state hold NaN/inf."""
  if not bool(_all_finite((state.params, state.opt_state))):
    raise FloatingPointError(
        f"refusing to write the checkpoint of step {step}: the train state holds NaN/inf "
        "(train.nonfinite_policy='off' applied a non-finite update); the previous "
        "checkpoint is kept")


def assert_finite_params(params, step: int, what: str) -> None:
  """Raises Diverged naming `what` (e.g. the export directory) and the step when the
  (host) params hold NaN/inf: nothing non-finite is ever exported."""
  if not bool(_all_finite(params)):
    raise Diverged(f"refusing to write {what}: the params of step {step} hold NaN/inf "
                   "(train.nonfinite_policy='off' applied a non-finite update?); lower the "
                   "learning rate, or resume from an earlier checkpoint")


def skipped_of(sums: dict) -> int:
  """Skipped updates counted in one step's (or an interval's) metric sums."""
  return int(round(sum(float(sums.get(k, 0)) for k in COUNTERS)))


class SkipTracker:
  """Host-side skip accounting of a run under nonfinite_policy=skip: updates skipped in a
  row and in all (`prior`: skipped before this process resumed the run)."""

  def __init__(self, train_cfg, prior: int = 0):
    self.policy = settings(train_cfg)[0]
    self.limit = int(train_cfg.get("max_consecutive_skips", 10))
    self.max_fraction = float(train_cfg.get("max_skipped_fraction", 1.0))
    self.in_a_row = 0
    self.since = None  # the first step of the current run of skips
    self.total = int(prior)

  def observe(self, first_step: int, per_step: list) -> int:
    """`per_step`: the metric sums of steps first_step, first_step+1, ... in order (one
    log interval). -> the skipped count among them; raises Diverged when a run of
    max_consecutive_skips skipped updates was reached in them."""
    n, hit, ended = 0, None, False
    for i, sums in enumerate(per_step):
      skipped = skipped_of(sums)
      n += skipped
      if not skipped:
        self.in_a_row, self.since = 0, None
        ended = hit is not None  # the run of skips that reached the limit is over
        continue
      self.in_a_row += 1
      self.since = first_step + i if self.since is None else self.since
      if self.in_a_row >= self.limit and hit is None:
        hit, ended = self.since, False
      if hit is not None and not ended:
        last_kinds = [k for k in COUNTERS if float(sums.get(k, 0))]
        last = first_step + i
    self.total += n
    if hit is None or self.policy != "skip":
      return n
    end = first_step + len(per_step) - 1
    why = ("a NaN/inf loss or gradient norm" if last_kinds == ["skipped_nonfinite"] else
           "a gradient-norm spike" if last_kinds == ["skipped_spike"] else
           "a NaN/inf or a spike")
    raise Diverged(
        f"training stopped at step {end}: {last - hit + 1} updates in a row were skipped "
        f"(steps {hit}..{last}, the last with {why}; train.max_consecutive_skips="
        f"{self.limit}): the run has diverged or its input is bad. Lower the learning "
        "rate or check the data, then resume from the last checkpoint")

  def check_fraction(self, total_steps: int, step: int) -> None:
    """At the end of a run: raises Diverged when more than max_skipped_fraction of its
    steps were skipped (before anything is exported)."""
    if self.policy != "skip" or not total_steps:
      return
    if self.total > self.max_fraction * total_steps:
      raise Diverged(
          f"run ended at step {step} with {self.total} of its {total_steps} updates skipped "
          f"(more than train.max_skipped_fraction={self.max_fraction}); refusing to export "
          "a model that mostly did not train. Lower the learning rate or check the data "
          "(or raise train.max_skipped_fraction to export it anyway)")
