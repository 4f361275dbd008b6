"""`python -m launch.aot`: the real sharded train step compiled ahead of time for a Cloud
TPU topology on this machine (the library: launch/perf/aot.py)."""
import json
import logging
import os
import sys
import time

import jax
from absl import app, flags
from ml_collections import config_flags

from launch import cli
from launch.perf import kernel_cost, runinfo
from launch.perf.aot import (AotError, EXIT_DOES_NOT_FIT, EXIT_FITS, EXIT_USAGE,
                             compile_train_step, find_libtpu, format_report,
                             libtpu_requirement, parse_mesh, quiet_libtpu_env)


def _define_flags():
  if "topology" in flags.FLAGS:
    return flags.FLAGS
  config_flags.DEFINE_config_file("config", None, "config file[:arg]", lock_config=True)
  flags.DEFINE_string("topology", None, "Cloud TPU topology, e.g. v5p:2x2x1, v5e:4x4, "
                      "v4:2x2x1, v6e:2x2")
  flags.DEFINE_integer("global_batch", None, "rows per train step over the whole slice")
  flags.DEFINE_integer("seq", 0, "sequence length (0: config.data.seq_len)")
  flags.DEFINE_string("mesh", "", "data,fsdp,tensor (one may be -1); default: config.mesh")
  flags.DEFINE_float("hbm_gib", 0.0, "override the HBM capacity per device (GiB)")
  flags.DEFINE_string("json", "", "also write the report to this JSON file")
  flags.DEFINE_float("kernel_efficiency", kernel_cost.DEFAULT_EFFICIENCY,
                     "fraction of the roofline the Pallas kernels reach (launch/perf/kernel_cost.py)")
  flags.DEFINE_integer("breakdown", 0, "also print where XLA's part of the time goes: the "
                       "N largest op groups by the compiler's per-op cycle estimates "
                       "(launch/perf/op_costs.py); 0: off")
  flags.mark_flags_as_required(["config", "topology", "global_batch"])
  return flags.FLAGS


def main(argv):
  del argv
  for noisy in ("absl", "jax", "orbax"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  F = _define_flags()
  try:
    mesh = parse_mesh(F.mesh) if F.mesh else None
    report = compile_train_step(F.config, F.topology, F.global_batch, F.seq, mesh,
                                F.hbm_gib or None, F.kernel_efficiency, F.breakdown)
  except AotError as e:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_USAGE
  report["command"] = "python -m launch.aot " + " ".join(sys.argv[1:])
  report["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
  print(format_report(report))
  if F.json:
    with open(F.json, "w") as f:
      json.dump(report, f, indent=1, default=str)
  return EXIT_FITS if report["fits"] else EXIT_DOES_NOT_FIT


def _entry():
  if find_libtpu() is None:
    req = libtpu_requirement()
    print("error: libtpu is not installed, and the TPU compiler comes with it. Install it "
          f"with `pip install 'encoder-zoo[tpu]'` (or `pip install '{req}'`), or without "
          f"touching this environment: `pip install --target .cache/libtpu '{req}'` in "
          "the repository, or point $TPU_LIBRARY_PATH at a libtpu.so.", file=sys.stderr)
    sys.exit(EXIT_USAGE)
  quiet_libtpu_env()
  if not os.environ.get("JAX_PLATFORMS"):  # the host runs nothing; TPU is compile-only
    jax.config.update("jax_platforms", "cpu")
  _define_flags()
  app.run(main, argv=runinfo.normalize_argv(sys.argv), flags_parser=cli.parse_flags)


if __name__ == "__main__":
  _entry()
