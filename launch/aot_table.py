"""`python -m launch.aot_table`: every family's train step priced by `launch.aot` on
v5p:2x2x1 and v6e:2x2, one compile after another, as one markdown table (the library:
launch/perf/aot_table.py). `--update docs/benchmarks.md` puts it between the file's
`<!-- aot-table -->` markers."""
import shlex
import sys

from absl import app, flags

from launch.perf import aot_table

flags.DEFINE_string("out", ".cache/aot_table", "directory of the per-run JSON reports (a "
                    "report already there is reused: an interrupted campaign continues)")
flags.DEFINE_list("only", [], "rows to run (default: all); names: "
                  + ", ".join(r.name for r in aot_table.ROWS))
flags.DEFINE_list("topologies", list(aot_table.TOPOLOGIES), "topologies to price on")
flags.DEFINE_string("update", "", "a markdown file whose <!-- aot-table --> block becomes "
                    "the table (default: print it)")
flags.DEFINE_bool("force", False, "compile again rows whose report is already in --out")
flags.DEFINE_float("timeout", 3600, "seconds one compile may take before its row says so")
flags.DEFINE_string("extra", "", "more launch.aot arguments for every row (e.g. "
                    "'--config.model.num_hidden_layers=2')")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  try:
    rows = aot_table.select(FLAGS.only)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  reports = aot_table.campaign(rows, FLAGS.topologies, FLAGS.out, shlex.split(FLAGS.extra),
                               FLAGS.force, FLAGS.timeout,
                               log=lambda s: print(s, file=sys.stderr, flush=True))
  table = aot_table.render(rows, FLAGS.topologies, reports,
                           "python -m launch.aot_table " + " ".join(sys.argv[1:]))
  if FLAGS.update:
    try:
      aot_table.update(FLAGS.update, table)
    except ValueError as e:
      print(f"error: {e}", file=sys.stderr)
      return 2
    print(f"the table ({len(reports)} runs) is in {FLAGS.update}")
  else:
    print(table)
  return 0


if __name__ == "__main__":
  app.run(main)
