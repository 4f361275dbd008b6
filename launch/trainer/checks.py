"""Start-up checks of a pretraining config: everything that can be known to fail before a
tokenizer is trained, data cached or anything written to the work directory.

`check(config, devices)` returns a private, unlocked copy of the config (with a warmup
longer than the run clamped, said in a printed note) or raises `cli.ConfigError`, one
line naming the key, its value and the fix. Checked:
- the data and tokenizer sections (`launch.data.pipeline.validate`), the objective, the
  model family;
- files that must exist: `data.files` (and a glob `data.eval_split`) for source=text,
  `tokenizer.path` for the sentencepiece/hf kinds, `init_from` and a distillation
  teacher (read by the objective's `prepare_config`, which writes nothing);
- `data.seq_len` against the positions the model has (`max_length()` of the family);
- the step counts, and `data.global_batch` against the data-parallel devices, the
  processes and `optimizer.grad_accum_steps`;
- the mesh against the devices.
"""
from __future__ import annotations

import logging
import math

import ml_collections

from launch.cli import ConfigError

log = logging.getLogger("encoder_zoo")
WARMUP_FRACTION = 0.1  # a clamped warmup: this fraction of the run


def _fail(msg: str):
  raise ConfigError(msg)


def _as_error(fn, *args):
  """Runs a validator that raises one-line ValueErrors; re-raises them as ConfigError."""
  try:
    return fn(*args)
  except ConfigError:
    raise
  except (ValueError, FileNotFoundError) as e:
    _fail(" ".join(str(e).split()))


def _check_steps(config):
  t = config.train
  for key in ("steps", "log_every", "eval_every", "eval_batches"):
    v = t.get(key)
    if v is None:
      continue
    if int(v) < (0 if key == "eval_batches" else 1):
      _fail(f"train.{key}={v} must be {'>= 0' if key == 'eval_batches' else 'positive'}; "
            f"set --config.train.{key}")
  every = config.get("checkpoint", {}).get("every", 1)
  if int(every) < 1:
    _fail(f"checkpoint.every={every} must be positive; set --config.checkpoint.every")
  if float(config.optimizer.learning_rate) < 0:
    _fail(f"optimizer.learning_rate={config.optimizer.learning_rate} must be >= 0")
  if int(config.optimizer.warmup_steps) < 0:
    _fail(f"optimizer.warmup_steps={config.optimizer.warmup_steps} must be >= 0")
  if int(config.optimizer.get("grad_accum_steps", 1)) < 1:
    _fail(f"optimizer.grad_accum_steps={config.optimizer.grad_accum_steps} must be >= 1")


def clamp_warmup(config) -> str | None:
  """A warmup that does not fit the run becomes WARMUP_FRACTION of it (in place);
  returns the note saying so, or None."""
  opt, steps = config.optimizer, int(config.train.steps)
  warmup = int(opt.warmup_steps)
  room = steps
  if opt.get("schedule") == "wsd":
    room = steps - round(float(opt.get("decay_fraction", 0.1)) * steps)
  if warmup <= room:
    return None
  new = min(room, int(WARMUP_FRACTION * steps))
  opt.warmup_steps = new
  return (f"note: optimizer.warmup_steps={warmup} is longer than the run's {steps} steps"
          f"{' (before its decay)' if room != steps else ''}; clamped to {new}")


def _check_files(config):
  data, tok = config.data, config.tokenizer
  if data.source == "text":
    from launch.data import sources
    _as_error(sources.expand_globs, data.files)
    if data.get("eval_split"):
      _as_error(sources.expand_globs, data.eval_split, "data.eval_split")
  if tok.kind in ("sentencepiece", "hf") and not config.get("init_from", ""):
    from etils import epath
    if not tok.path:
      _fail(f"tokenizer.kind={tok.kind} needs --config.tokenizer.path (a "
            f"{'.model file' if tok.kind == 'sentencepiece' else 'tokenizer.json or vocab.txt'})")
    if not epath.Path(tok.path).exists():
      _fail(f"tokenizer.path={tok.path!r} does not exist; point --config.tokenizer.path at "
            "an existing file")


def _check_length(config):
  """data.seq_len against the model's positions (after init_from / teacher settings)."""
  import encoders
  seq_len = int(config.data.seq_len)
  model = _as_error(encoders.build, config.model)
  limit = model.max_length()
  if limit is not None and seq_len > limit:
    key = "model.max_position_embeddings"
    fix = (f"use --config.data.seq_len={limit} or less"
           + ("" if config.get("init_from", "") else f", or raise --config.{key}"))
    _fail(f"data.seq_len={seq_len} is longer than the model's {limit} positions ({key}="
          f"{config.model.get('max_position_embeddings')}); {fix}")
  teacher = config.objective.get("teacher_model")
  if teacher:
    limit = encoders.build(teacher).max_length()
    if limit is not None and seq_len > limit:
      _fail(f"data.seq_len={seq_len} is longer than the teacher's {limit} positions; use "
            f"--config.data.seq_len={limit} or less")


def _check_batch(config, devices):
  import jax

  from launch.trainer import sharding as shard_lib
  mesh = _as_error(shard_lib.make_mesh, config.mesh.shape, devices)
  axes = dict(shard_lib.rules_tuple(config.mesh.rules)).get("act_batch")
  axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
  shards = math.prod(mesh.shape[a] for a in axes)
  batch = int(config.data.global_batch)
  accum = int(config.optimizer.get("grad_accum_steps", 1))
  if batch <= 0:
    _fail(f"data.global_batch={batch} must be positive")
  unit = shard_lib.batch_unit(mesh, config.mesh.rules, accum)
  if batch % unit:
    parts = [f"{shards} data-parallel devices (mesh {dict(mesh.shape)})"]
    if accum > 1:
      parts.append(f"grad_accum_steps={accum} micro-batches")
    if jax.process_count() > 1:
      parts.append(f"{jax.process_count()} processes")
    near = max(unit, batch // unit * unit)
    _fail(f"data.global_batch={batch} does not split over {' x '.join(parts)}; use a "
          f"multiple of {unit}, e.g. --config.data.global_batch={near}")


def check(config, devices=None) -> ml_collections.ConfigDict:
  """The start-up checks (module docstring); -> a private unlocked copy of `config`."""
  import objectives
  from launch.data import pipeline as pipeline_lib
  out = ml_collections.ConfigDict(config.to_dict())
  _check_steps(out)
  _as_error(pipeline_lib.validate, out)
  _as_error(objectives.objective_class, out)
  _check_files(out)
  from launch.trainer import compile_cache
  _as_error(compile_cache.resolve, out.train.get("compilation_cache_dir", ""), "")
  from launch.trainer import state as state_lib
  _as_error(state_lib.compiler_options, out, "cpu")  # train.tpu_scoped_vmem_kib, any host
  scratch = ml_collections.ConfigDict(out.to_dict())
  _as_error(objectives.prepare_config, scratch)  # reads init_from / teacher; writes nothing
  _check_length(scratch)
  _check_batch(out, devices)
  note = clamp_warmup(out)
  if note:
    print(note, flush=True)
    log.info("%s", note)
  return out
