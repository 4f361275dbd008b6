"""launch.aot_table: the rows and topologies of the AOT table, its cells from launch.aot's
reports (fits, does not fit, failed), the reuse of kept reports, and the in-place update
of a markdown file's marked block (refused without the markers, nothing written)."""
import json
import os

import pytest

from launch.perf import aot_table as T


def _report(mfu=0.5, fits=True, programs=(("the train step", 100.0), ("twin", 50.0))):
  return {"fits": fits, "memory": {"total": 6.5 * 2**30}, "estimated_step_s": 0.2,
          "estimated_mfu": mfu, "compile_programs": [list(p) for p in programs],
          "compile_s": 100.0}


def test_every_family_is_a_row_on_both_topologies():
  names = [r.name for r in T.ROWS]
  assert len(set(names)) == len(names)
  for family in ("bert", "roberta", "albert", "electra", "deberta", "modernbert",
                 "distilbert"):
    assert any(r.args[1].startswith(f"configs/{family}.py") for r in T.ROWS), family
  assert T.TOPOLOGIES == ("v5p:2x2x1", "v6e:2x2")
  row = T.select(["modernbert-base-8192"])[0]
  assert row.argv("v5p:2x2x1")[row.argv("v5p:2x2x1").index("--global_batch") + 1] == "64"
  assert row.argv("v6e:2x2")[row.argv("v6e:2x2").index("--global_batch") + 1] == "16"
  with pytest.raises(ValueError, match="unknown rows"):
    T.select(["bert-huge"])


def test_cells_say_what_each_run_gave():
  assert T.cell(_report()) == "6.50 GiB | 200.0 ms | **50.0%** | 150 s"
  assert T.cell(_report(fits=False)).startswith("does not fit: needs 6.5 GiB")
  assert T.cell({"error": "exit 2"}).startswith("failed (exit 2)")
  table = T.render(T.select(["bert-base"]), ["v5p:2x2x1", "v6e:2x2"],
                   {("bert-base", "v5p:2x2x1"): _report()}, "python -m launch.aot_table")
  lines = table.splitlines()
  assert lines[-3] == "| BERT-base MLM + NSP | v5p:2x2x1 | 6.50 GiB | 200.0 ms | **50.0%** | 150 s |"
  assert lines[-1] == "Not run yet: bert-base on v6e:2x2."


def test_kept_reports_are_reused_and_not_compiled_again(tmp_path, monkeypatch):
  row = T.select(["bert-base"])[0]
  out = str(tmp_path)
  with open(T.report_path(out, row, "v5p:2x2x1"), "w") as f:
    json.dump(_report(0.61), f)
  ran = []
  monkeypatch.setattr(T, "run_one",
                      lambda r, topo, *a: ran.append(topo) or dict(_report(0.3), wall_s=1.0))
  got = T.campaign([row], ["v5p:2x2x1", "v6e:2x2"], out, log=lambda s: None)
  assert ran == ["v6e:2x2"] and got["bert-base", "v5p:2x2x1"]["estimated_mfu"] == 0.61
  T.campaign([row], ["v5p:2x2x1"], out, force=True, log=lambda s: None)
  assert ran == ["v6e:2x2", "v5p:2x2x1"]


def test_update_replaces_only_the_marked_block(tmp_path):
  doc = tmp_path / "b.md"
  doc.write_text(f"# B\nbefore\n{T.START}\nold table\n{T.END}\nafter\n")
  T.update(str(doc), "| new |")
  assert doc.read_text() == f"# B\nbefore\n{T.START}\n| new |\n{T.END}\nafter\n"
  plain = tmp_path / "c.md"
  plain.write_text("no markers\n")
  with pytest.raises(ValueError, match="aot-table"):
    T.update(str(plain), "| new |")
  assert plain.read_text() == "no markers\n"
  assert sorted(os.listdir(tmp_path)) == ["b.md", "c.md"]  # no temporary file left
