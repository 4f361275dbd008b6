"""Start-up checks of a pretraining config: everything that can be known to fail before a
tokenizer is trained, data cached or anything written to the work directory.

`check(config, devices)` returns a private, unlocked copy of the config (with a warmup
longer than the run clamped, said in a printed note) or raises `cli.ConfigError`, one
line naming the key, its value and the fix. Checked:
- every enum, range and rate: `train.nonfinite_policy` and the other
  guard settings, the optimizer's name, schedule, b1/b2, eps, weight decay, clip norm,
  the model's dropout probabilities, activations and norm epsilons (`_check_settings`),
  and the objective's own (`Objective.check_config`: masking rates, enums);
- the data and tokenizer sections (`launch.data.pipeline.validate`: sources, packing,
  `data.bad_data` and its limits, ...), the objective, the model family;
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

import jax
import ml_collections
from etils import epath

import encoders
import objectives
from encoders.layers import core
from launch.cli import ConfigError
from launch.data import pipeline as pipeline_lib
from launch.data import sources
from launch.trainer import compile_cache
from launch.trainer import fingerprint as fp_lib
from launch.trainer import guard as guard_lib
from launch.trainer import optim
from launch.trainer import sharding as shard_lib
from launch.trainer import state as state_lib

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


def _enum(key: str, value, choices) -> None:
  if value not in choices:
    _fail(f"{key}={value!r}; expected one of {tuple(choices)}")


def _number(key: str, value, low=None, high=None, low_open=False, high_open=False,
            integer=False) -> None:
  """`value` a (finite) number within the bounds, else one line naming the range."""
  kind = "an integer" if integer else "a number"
  ok = isinstance(value, int) if integer else isinstance(value, (int, float))
  ok = ok and not isinstance(value, bool) and math.isfinite(value)
  if ok and low is not None:
    ok = value > low if low_open else value >= low
  if ok and high is not None:
    ok = value < high if high_open else value <= high
  if ok:
    return
  if low is not None and high is not None:
    rng = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
  elif low is not None:
    rng = f"{'>' if low_open else '>='} {low}"
  else:
    rng = f"{'<' if high_open else '<='} {high}"
  _fail(f"{key}={value!r} must be {kind} {rng}; set --config.{key}")


_ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "classifier_activation",
                    "pooler_hidden_act", "conv_act")


def _check_settings(config):
  """Every enum, range and rate of the data, train, optimizer, checkpoint and model
  sections (the objective's own: its `check_config`), in one line each."""
  data, t, opt = config.data, config.train, config.optimizer
  # data.bad_data, max_document_bytes, min_printable_ratio: launch.data.pipeline.validate
  if int(data.get("max_documents", -1)) != -1:
    _number("data.max_documents", data.max_documents, 1, integer=True)
  _number("data.worker_count", data.get("worker_count", 0), 0, integer=True)
  _number("data.eval_fraction", data.get("eval_fraction", 0.0), 0, 1, high_open=True)
  _as_error(guard_lib.settings, t)  # nonfinite_policy, grad_spike_factor / _warmup
  _number("train.max_consecutive_skips", t.get("max_consecutive_skips", 1), 1,
          integer=True)
  _number("train.max_skipped_fraction", t.get("max_skipped_fraction", 1.0), 0, 1,
          low_open=True)
  for entry in fp_lib.parse_allowed(t.get("allow_config_change", "")):
    msg = fp_lib.allowed_entry_error(entry)
    if msg:
      _fail(msg)
  _enum("optimizer.name", str(opt.get("name", "adamw")).lower(), optim.OPTIMIZERS)
  _enum("optimizer.schedule", str(opt.get("schedule", "linear")).lower(), optim.SCHEDULES)
  _number("optimizer.learning_rate", opt.learning_rate, 0)
  for key in ("b1", "b2"):
    if key in opt:
      _number(f"optimizer.{key}", opt[key], 0, 1, high_open=True)
  if "eps" in opt:
    _number("optimizer.eps", opt.eps, 0, low_open=True)
  for key in ("weight_decay", "clip_norm"):
    if key in opt:
      _number(f"optimizer.{key}", opt[key], 0)
  if "decay_fraction" in opt:
    _number("optimizer.decay_fraction", opt.decay_fraction, 0, 1)
  ck = config.get("checkpoint", {})
  if "keep" in ck:
    _number("checkpoint.keep", ck["keep"], 1, integer=True)
  m = config.model
  for key, value in m.items():
    if "dropout" in key and isinstance(value, (int, float)):
      _number(f"model.{key}", value, 0, 1, high_open=True)
  for key in _ACTIVATION_KEYS:
    if key in m and m[key]:
      try:
        core.activation(m[key])
      except ValueError:
        _fail(f"model.{key}={m[key]!r}; expected one of "
              f"{tuple(sorted(core._ACTIVATIONS))}")  # noqa: SLF001 - the one table
  for key in ("layer_norm_eps", "norm_eps"):
    if key in m:
      _number(f"model.{key}", m[key], 0, low_open=True)
  if "initializer_range" in m:
    _number("model.initializer_range", m.initializer_range, 0, low_open=True)


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
    _as_error(sources.expand_globs, data.files)
    if data.get("eval_split"):
      _as_error(sources.expand_globs, data.eval_split, "data.eval_split")
  if tok.kind in ("sentencepiece", "hf") and not config.get("init_from", ""):
    if not tok.path:
      _fail(f"tokenizer.kind={tok.kind} needs --config.tokenizer.path (a "
            f"{'.model file' if tok.kind == 'sentencepiece' else 'tokenizer.json or vocab.txt'})")
    if not epath.Path(tok.path).exists():
      _fail(f"tokenizer.path={tok.path!r} does not exist; point --config.tokenizer.path at "
            "an existing file")


def _check_length(config):
  """data.seq_len against the model's positions (after init_from / teacher settings)."""
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
  out = ml_collections.ConfigDict(config.to_dict())
  _check_steps(out)
  _check_settings(out)
  _as_error(pipeline_lib.validate, out)
  _as_error(objectives.objective_class, out)
  _as_error(objectives.objective_class(out).check_config, out)  # masking rates, enums
  _check_files(out)
  _as_error(compile_cache.resolve, out.train.get("compilation_cache_dir", ""), "")
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
