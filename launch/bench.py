"""`python -m launch.bench`: step and loop benchmarks (the library: launch/perf/bench/)."""
import json
import logging
import sys

from absl import app, flags
from ml_collections import config_flags

from launch import cli
from launch.perf import runinfo
from launch.perf.bench import report, runs
from launch.perf.bench import embed, loop
from launch.trainer import hostmem


def _define_flags():
  if "mode" in flags.FLAGS:
    return flags.FLAGS
  config_flags.DEFINE_config_file("config", None, "config file[:arg]", lock_config=True)
  flags.DEFINE_enum("mode", "train", ["forward", "train", "loop", "embed"], "what to time "
                    "(loop: the whole training loop, launch/perf/bench/loop.py; embed: "
                    "pipelines.embed against sentence-transformers on --model, "
                    "launch/perf/bench/embed.py)")
  flags.DEFINE_string("model", "", "--mode embed: a sentence-transformers directory")
  flags.DEFINE_integer("texts", 1000, "--mode embed: texts per round")
  flags.DEFINE_integer("rounds", 3, "--mode embed: timed rounds (after one warm-up round)")
  flags.DEFINE_integer("long_every", 20, "--mode embed: every n-th text is a "
                       "multi-paragraph document (0: none)")
  flags.DEFINE_integer("steps", 100, "--mode loop: training steps (the first not timed)")
  flags.DEFINE_string("workdir", "", "--mode loop: run directory (default: a temporary "
                      "one; a kept one caches the tokenizer and data for the next run)")
  flags.DEFINE_integer("batch", 8, "rows per step (the global batch; --mode embed: "
                       "texts per batch, default 32)")
  flags.DEFINE_integer("seq", 0, "sequence length (0: config.data.seq_len)")
  flags.DEFINE_integer("iters", 10, "timed iterations (with --packed: documents = "
                       "batch * iters)")
  flags.DEFINE_integer("warmup", 2, "untimed iterations after compiling")
  flags.DEFINE_bool("compare_hf", False, "also time transformers' PyTorch model")
  flags.DEFINE_string("packed", "", "document length distribution: time packed vs padded "
                      "documents (uniform:LO:HI, lognormal:MEDIAN:SIGMA, fixed:N)")
  flags.DEFINE_integer("pad_multiple", 16, "--packed: pad each batch to a multiple of this")
  flags.DEFINE_integer("passes", 2, "--packed: timed passes over the documents (best kept)")
  flags.DEFINE_integer("seed", 0, "seed of the synthetic batches")
  flags.DEFINE_enum("malloc", "tuned", ["tuned", "system"], "host allocator: tuned "
                    "(launch/trainer/hostmem.py, as launch.pretrain) or glibc's defaults")
  flags.DEFINE_string("json", "", "also write the full result to this JSON file")
  return flags.FLAGS


def main(argv):
  del argv
  for noisy in ("absl", "jax", "orbax"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  F = _define_flags()
  if F.malloc == "tuned":  # before JAX's CPU client starts (launch/trainer/hostmem.py)
    hostmem.tune_malloc()
  config = F.config
  if F.mode == "embed":
    if not F.model:
      raise SystemExit("--mode embed needs --model DIR (a sentence-transformers directory)")
    batch = F.batch if F["batch"].present else 32  # sentence-transformers' default
    result = embed.bench_embed(F.model, F.texts, batch, F.rounds, F.long_every, F.seed)
    result["machine"] = runinfo.machine_info()
    result["command"] = "python -m launch.bench " + " ".join(sys.argv[1:])
    if F.json:
      with open(F.json, "w") as f:
        json.dump(result, f, indent=1, default=str)
    return 0
  if config is None:
    raise SystemExit("--config is required (e.g. --config configs/bert.py:base)")
  if F.packed and F.compare_hf:
    raise SystemExit("--packed and --compare-hf do not combine: transformers' BERT has no "
                     "segment-aware attention for packed rows")
  if F.mode == "loop":
    if F.packed:
      raise SystemExit("--mode loop times the pipeline's own rows; --packed does not apply")
    result = loop.bench_loop(config, F.steps, F.compare_hf, F.workdir)
  elif F.packed:
    result = runs.bench_packed(config, F.packed, F.mode, F.batch, F.seq, F.iters,
                               F.pad_multiple, F.passes, F.seed)
  else:
    result = runs.bench_step(config, F.mode, F.batch, F.seq, F.iters, F.warmup,
                             F.compare_hf, F.seed)
  result["machine"] = runinfo.machine_info()
  result["malloc"] = F.malloc
  result["command"] = "python -m launch.bench " + " ".join(sys.argv[1:])
  print(report.format_report(result))
  if F.json:
    with open(F.json, "w") as f:
      json.dump(result, f, indent=1, default=str)
  return 0


if __name__ == "__main__":
  _define_flags()
  app.run(main, argv=runinfo.normalize_argv(sys.argv), flags_parser=cli.parse_flags)
