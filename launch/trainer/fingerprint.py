"""What a run is: the settings that change the model or the data it trains on, kept in
`WORKDIR/run_fingerprint.json`, so that a resume with other settings is refused instead
of continuing silently (e.g. `model.hidden_act` gelu -> relu: every shape the same).

Fingerprinted (`fingerprint(config)`, flat dotted keys):
- `model.*`, except how it is computed (`RUNTIME_MODEL_KEYS`: dtype, attention kernel,
  remat, scan, vocabulary padding) and the variant's name;
- `init_from`;
- `tokenizer.*`, except `train_sentences` (a trained tokenizer is cached in the work
  directory: a resume reuses it whatever this says);
- `data.*`, except `worker_count` and `bad_data` (how input is read and how bad input is
  reported, not which input trains);
- `objective.*`;
- `optimizer.name` (the optimizer state's structure).
Not fingerprinted: `train.*` (steps, logging, evals, seeds of a run already started, the
NaN policy, ...), `optimizer.*` numbers (a resume may change the learning rate),
`mesh.*` (a checkpoint restores onto another mesh), `checkpoint.*` and `logging.*`.

`compare(old, new, allowed)` -> the differing keys that `train.allow_config_change`
(comma-separated keys, or sections: `model` allows every `model.*` key) does not allow.
A longer (or shorter) `train.steps` is never a difference: it is not fingerprinted.
"""
from __future__ import annotations

import datetime
import json
import os
from typing import Any, Dict, List, Optional, Tuple

from etils import epath

FILE = "run_fingerprint.json"
RUNTIME_MODEL_KEYS = ("dtype", "attention_impl", "remat_policy", "scan_layers",
                      "vocab_pad_multiple", "relative_impl", "relative_block", "variant")
_SECTIONS = {
    "model": lambda k: k not in RUNTIME_MODEL_KEYS,
    "tokenizer": lambda k: k != "train_sentences",
    "data": lambda k: k not in ("worker_count", "bad_data"),
    "objective": lambda k: True,
    "optimizer": lambda k: k == "name",
}
TOP_KEYS = ("init_from",)


def _plain(value) -> Any:
  """A JSON value for a config value (tuples as lists, ConfigDicts as dicts)."""
  if hasattr(value, "to_dict"):
    value = value.to_dict()
  if isinstance(value, dict):
    return {str(k): _plain(v) for k, v in sorted(value.items())}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  return str(value)


def fingerprint(config) -> Dict[str, Any]:
  """{dotted key: JSON value} of the settings that make the run what it is."""
  out = {}
  for key in TOP_KEYS:
    if key in config:
      out[key] = _plain(config[key])
  for section, keep in _SECTIONS.items():
    if section not in config:
      continue
    for k, v in config[section].items():
      if keep(k):
        out[f"{section}.{k}"] = _plain(v)
  return out


def parse_allowed(text: str) -> List[str]:
  return [p.strip() for p in str(text or "").split(",") if p.strip()]


def allowed_entry_error(entry: str) -> Optional[str]:
  """None if `entry` of train.allow_config_change can name a fingerprinted key."""
  section = entry.split(".", 1)[0]
  if entry in TOP_KEYS or (section in _SECTIONS and (
      "." not in entry or _SECTIONS[section](entry.split(".", 1)[1].split(".")[0]))):
    return None
  return (f"train.allow_config_change names {entry!r}, which is not a fingerprinted setting "
          f"(sections {', '.join(_SECTIONS)}, {', '.join(TOP_KEYS)}, optimizer.name); "
          "it never stops a resume")


def _is_allowed(key: str, allowed: List[str]) -> bool:
  return any(key == a or key.startswith(a + ".") for a in allowed)


def compare(old: Dict[str, Any], new: Dict[str, Any],
            allowed: List[str] = ()) -> Tuple[Dict, Dict]:
  """-> (refused, accepted): {key: (old, new)} of the keys both sides have whose values
  differ. A key only one side has is no difference: a setting a newer version added
  (its default keeps the old behaviour), or one an older config.json lacked."""
  refused, accepted = {}, {}
  for key in sorted(set(old) & set(new)):
    a, b = old.get(key), new.get(key)
    if a == b:
      continue
    (accepted if _is_allowed(key, list(allowed)) else refused)[key] = (a, b)
  return refused, accepted


def _short(v) -> str:
  text = json.dumps(v)
  return text if len(text) <= 60 else text[:57] + "..."


def describe(diff: Dict) -> str:
  """`key: old -> new` pairs on one line."""
  return "; ".join(f"{k}: {_short(a)} -> {_short(b)}" for k, (a, b) in diff.items())


def refusal(workdir: str, step: int, refused: Dict) -> str:
  keys = ",".join(refused)
  return (f"work directory {workdir} holds a run (checkpoint of step {step}) with other "
          f"settings: {describe(refused)}. Use a new --workdir, or allow the change with "
          f"--config.train.allow_config_change='{keys}'")


def _path(workdir: str):
  if "://" in workdir:
    return epath.Path(workdir) / FILE
  return None


def read(workdir: str) -> Optional[Dict]:
  """The stored record ({"fingerprint": ..., "changes": [...]}) or None."""
  p = _path(workdir)
  try:
    text = p.read_text() if p is not None else open(os.path.join(workdir, FILE)).read()
  except (OSError, FileNotFoundError):
    return None
  return json.loads(text)


def legacy(workdir: str) -> Optional[Dict[str, Any]]:
  """The fingerprint of a work directory from before this file existed, rebuilt from its
  config.json (None when there is none). That file holds the config after the
  objective's changes: the model sized to the tokenizer, and with `init_from` the model
  and tokenizer from that directory, with a distillation teacher its tokenizer and
  architecture. Those keys are left out."""
  try:
    with open(os.path.join(workdir, "config.json")) as f:
      saved = json.load(f)
  except (OSError, ValueError):
    return None
  if not isinstance(saved, dict):
    return None
  fp = fingerprint(saved)
  prefixes = []
  if saved.get("init_from"):
    prefixes += ["model.", "tokenizer."]
  if (saved.get("objective") or {}).get("teacher"):
    prefixes += ["tokenizer.", "objective.teacher_model"]
  skip = ("model.vocab_size", "model.pad_token_id")
  return {k: v for k, v in fp.items()
          if k not in skip and not any(k.startswith(p) for p in prefixes)}


def write(workdir: str, fp: Dict[str, Any], accepted: Dict = None) -> None:
  """Stores `fp` (atomically), with the accepted changes appended to the record's
  history."""
  record = read(workdir) or {}
  changes = list(record.get("changes", []))
  if accepted:
    changes.append({"time": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "changed": {k: list(v) for k, v in accepted.items()}})
  text = json.dumps({"fingerprint": fp, "changes": changes}, indent=2)
  p = _path(workdir)
  if p is not None:
    p.write_text(text)
    return
  tmp = os.path.join(workdir, f".{FILE}.tmp")
  with open(tmp, "w") as f:
    f.write(text)
  os.replace(tmp, os.path.join(workdir, FILE))
