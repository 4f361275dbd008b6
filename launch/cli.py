"""Command-line errors as one line: the `flags_parser` every launch entry point with
`--config` overrides hands to `absl.app.run`; it also finds the config file from any
directory (`--config bert:tiny`, `--config configs/bert.py:tiny`, `ablations/electra:...`:
the configs shipped with the package, `config_path`).

ml_collections reports a mistyped override (`--config.train.stepz=3`) as a three-part
chained traceback ending in an escaped AttributeError. Here the overrides are checked
against the loaded config first, so a typo reads

    error: unknown config key train.stepz; did you mean train.steps?

and the program exits with status 2 (the shell's "usage error"), before anything runs.
Other flag errors (a bad value, a missing required flag) are one line with status 2 too.
"""
from __future__ import annotations

import difflib
import importlib.util
import os
import sys
from collections.abc import Sequence

from absl import app, flags

EXIT_USAGE = 2
# configs/ next to launch/: in a checkout and in an installed package alike (not imported:
# configs sit above launch, and a config file is loaded by path as config_flags does).
SHIPPED_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "configs")


class ConfigError(ValueError):
  """A bad setting, said in one line naming the key, the value and the fix."""


def _config_spec(argv: Sequence[str], flag: str) -> str | None:
  """The `FILE[:ARG]` value of `--flag` in argv (None when absent)."""
  for i, a in enumerate(argv):
    if a.startswith(f"--{flag}="):
      return a.split("=", 1)[1]
    if a == f"--{flag}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _overrides(argv: Sequence[str], flag: str) -> list[tuple]:
  """(dotted key, value or None) of `--flag.a.b=V` / `--flag.a.b V` / `--noflag.a.b`."""
  out = []
  for i, a in enumerate(argv):
    if a == "--":
      break
    for prefix in (f"--{flag}.", f"--no{flag}."):
      if a.startswith(prefix):
        key, eq, value = a[len(prefix):].partition("=")
        if not eq and prefix == f"--{flag}." and i + 1 < len(argv) \
            and not argv[i + 1].startswith("--"):
          value, eq = argv[i + 1], "="
        out.append((key, value if eq else None))
  return out


def config_path(path: str) -> str:
  """The config file `path` names: the file itself when it exists (relative to the current
  directory), else the shipped config of that name, from any directory: `bert`, `bert.py`,
  `configs/bert.py`, `ablations/electra` -> SHIPPED_CONFIGS/bert.py, .../ablations/electra.py."""
  if os.path.isfile(path):
    return path
  name = os.path.normpath(path)
  if name.startswith("configs" + os.sep):
    name = name[len("configs" + os.sep):]
  if not name.endswith(".py"):
    name += ".py"
  shipped = os.path.join(SHIPPED_CONFIGS, name)
  if not os.path.isabs(name) and os.path.isfile(shipped):
    return shipped
  raise ConfigError(f"config file {path!r} does not exist, here or among the shipped "
                    f"configs ({SHIPPED_CONFIGS}: e.g. bert, ablations/electra)")


def resolve_config_flag(argv: Sequence[str], flag: str = "config") -> list[str]:
  """argv with the file of `--flag FILE[:ARG]` replaced by `config_path(FILE)`."""
  argv = list(argv)
  for i, a in enumerate(argv):
    if a == "--":
      break
    if a.startswith(f"--{flag}="):
      path, colon, arg = a.split("=", 1)[1].partition(":")
      argv[i] = f"--{flag}={config_path(path)}{colon}{arg}"
    elif a == f"--{flag}" and i + 1 < len(argv):
      path, colon, arg = argv[i + 1].partition(":")
      argv[i + 1] = f"{config_path(path)}{colon}{arg}"
  return argv


def load_config(spec: str):
  """Calls `get_config(arg)` of the config file in `FILE[:ARG]` (as config_flags does);
  FILE as `config_path` finds it."""
  path, _, arg = spec.partition(":")
  path = config_path(path)
  mod_spec = importlib.util.spec_from_file_location("_cli_config", path)
  module = importlib.util.module_from_spec(mod_spec)
  mod_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def _keys_of(node) -> list[str]:
  try:
    return list(node.keys())
  except AttributeError:
    return []


def unknown_key(config, dotted: str) -> str | None:
  """None if `dotted` names a field of `config`, else the one-line error with the closest
  existing key."""
  node, done = config, []
  for part in dotted.split("."):
    keys = _keys_of(node)
    if not keys:  # a leaf (or a tuple/list index, as config_flags allows): not ours
      return None
    if part not in keys:
      where = ".".join(done)
      close = difflib.get_close_matches(part, keys, n=1, cutoff=0.6)
      msg = f"unknown config key {dotted}"
      if close:
        fixed = ".".join(done + [close[0]] + dotted.split(".")[len(done) + 1:])
        return f"{msg}; did you mean {fixed}?"
      return f"{msg}; {where or 'the config'} has {', '.join(sorted(keys))}"
    node = node[part]
    done.append(part)
  return None


def bad_value(config, dotted: str, value: str | None) -> str | None:
  """None if `value` parses as the type of the (existing) number field `dotted`."""
  node = config
  for part in dotted.split("."):
    if part not in _keys_of(node):
      return None
    node = node[part]
  if value is None or isinstance(node, bool) or not isinstance(node, (int, float)):
    return None
  try:
    float(value) if isinstance(node, float) else int(value)
  except ValueError:
    kind = type(node).__name__
    return f"config key {dotted}={value!r} is not a{'n' if kind == 'int' else ''} {kind}"
  return None


def override_error(argv: Sequence[str], flag: str = "config") -> str | None:
  """The first unknown `--config.*` key (or unparsable number) of argv as a one-line
  message, or None."""
  overrides = _overrides(argv, flag)
  spec = _config_spec(argv, flag)
  if not overrides or not spec:
    return None
  config = load_config(spec)
  for key, value in overrides:
    msg = unknown_key(config, key) or bad_value(config, key, value)
    if msg:
      return msg
  return None


def _one_line(e: BaseException) -> str:
  """The innermost message of a (chained) exception, on one line."""
  while e.__cause__ is not None or (e.__context__ is not None
                                    and not e.__suppress_context__):
    e = e.__cause__ or e.__context__
  text = str(e.args[0]) if len(e.args) == 1 else str(e)
  return " ".join(text.split()) or type(e).__name__


def fail(message: str, code: int = EXIT_USAGE):
  print(f"error: {message}", file=sys.stderr)
  sys.exit(code)


def parse_flags(argv: Sequence[str], flag: str = "config") -> list[str]:
  """A flags_parser for `absl.app.run`: unknown override keys and any other flag error
  are one line on stderr and exit status 2. The config file is found as `config_path` finds
  it."""
  argv = list(argv)
  if any(a in ("--help", "-h", "--helpfull", "--helpshort", "-?") for a in argv[1:]):
    return app.parse_flags_with_usage(argv)
  try:
    argv = argv[:1] + resolve_config_flag(argv[1:], flag)
    msg = override_error(argv[1:], flag)
  except ConfigError as e:
    fail(str(e))
  except Exception as e:  # noqa: BLE001 - the config file itself fails: say why, on one line
    fail(f"loading --{flag}={_config_spec(argv[1:], flag)}: {_one_line(e)}")
  if msg:
    fail(msg)
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # noqa: BLE001 - flags.Error, or a value config_flags cannot parse
    fail(_one_line(e))
