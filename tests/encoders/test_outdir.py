"""encoders.outdir: writers replace only their own output, atomically."""
import os

import pytest

from encoders import outdir


def _fill(d, name="model.txt", text="new"):
  with open(os.path.join(d, name), "w") as f:
    f.write(text)


def test_absent_target_is_written_with_the_marker(tmp_path):
  out = tmp_path / "export"
  with outdir.atomic_dir(str(out), "test writer") as tmp:
    assert not out.exists()  # nothing at the target until the block ends
    _fill(tmp)
  assert (out / "model.txt").read_text() == "new"
  assert outdir.is_ours(str(out)) and outdir.writer_of(str(out)) == "test writer"
  assert [p.name for p in tmp_path.iterdir()] == ["export"]  # no temp dir left behind


def test_a_users_non_empty_directory_is_refused_and_untouched(tmp_path):
  out = tmp_path / "mine"
  out.mkdir()
  (out / "thesis.tex").write_text("years of work")
  with pytest.raises(outdir.OutputDirError, match="did not write"):
    with outdir.atomic_dir(str(out), "test writer"):
      raise AssertionError("the block must not run")
  assert (out / "thesis.tex").read_text() == "years of work"
  assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]
  with pytest.raises(outdir.OutputDirError):
    outdir.claim_dir(str(out), "test writer")
  assert not outdir.is_ours(str(out))


def test_a_file_at_the_target_is_refused(tmp_path):
  f = tmp_path / "notes.txt"
  f.write_text("keep")
  with pytest.raises(outdir.OutputDirError, match="not a directory"):
    with outdir.atomic_dir(str(f), "w"):
      pass
  assert f.read_text() == "keep"


def test_own_earlier_output_is_replaced_whole(tmp_path):
  out = tmp_path / "export"
  with outdir.atomic_dir(str(out), "w") as tmp:
    _fill(tmp, "old_only.txt", "old")
    _fill(tmp, text="old")
  with outdir.atomic_dir(str(out), "w") as tmp:
    _fill(tmp)
  assert sorted(p.name for p in out.iterdir()) == [outdir.MARKER, "model.txt"]
  assert (out / "model.txt").read_text() == "new"
  assert [p.name for p in tmp_path.iterdir()] == ["export"]


def test_a_crash_mid_write_keeps_the_old_output(tmp_path):
  out = tmp_path / "export"
  with outdir.atomic_dir(str(out), "w") as tmp:
    _fill(tmp, text="old")
  with pytest.raises(RuntimeError):
    with outdir.atomic_dir(str(out), "w") as tmp:
      _fill(tmp, text="half")
      raise RuntimeError("killed")
  assert (out / "model.txt").read_text() == "old"
  assert [p.name for p in tmp_path.iterdir()] == ["export"]


def test_a_user_file_appearing_during_the_write_is_not_overwritten(tmp_path):
  out = tmp_path / "export"
  with pytest.raises(outdir.OutputDirError):
    with outdir.atomic_dir(str(out), "w") as tmp:
      _fill(tmp)
      out.mkdir()
      (out / "user.txt").write_text("mine")
  assert (out / "user.txt").read_text() == "mine"


def test_claim_dir_accepts_empty_and_own(tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  assert outdir.claim_dir(str(empty), "run") == str(empty)
  assert outdir.is_ours(str(empty))
  _fill(str(empty))
  outdir.claim_dir(str(empty), "run")  # ours now, even though non-empty
  assert (empty / "model.txt").exists()


def test_modes_follow_the_umask(tmp_path):
  old = os.umask(0o022)
  try:
    with outdir.atomic_dir(str(tmp_path / "e"), "w") as tmp:
      _fill(tmp)
  finally:
    os.umask(old)
  assert oct(os.stat(tmp_path / "e").st_mode & 0o777) == oct(0o755)
  assert oct(os.stat(tmp_path / "e" / "model.txt").st_mode & 0o777) == oct(0o644)


def test_a_writers_own_check_runs_before_and_at_the_swap(tmp_path):
  out = tmp_path / "export"
  seen = []

  def check(p):
    seen.append(p)
    if os.path.isdir(p) and os.path.exists(os.path.join(p, "checkpoints")):
      raise outdir.OutputDirError(f"{p} is a work directory")

  with pytest.raises(outdir.OutputDirError, match="work directory"):
    with outdir.atomic_dir(str(out), "w", check=check) as tmp:
      _fill(tmp)
      outdir.claim_dir(str(out), "trainer")  # another writer's directory appears
      (out / "checkpoints").mkdir()
  assert seen == [str(out), str(out)]
  assert (out / "checkpoints").is_dir() and not (out / "model.txt").exists()


def test_writers_limit_which_marked_directories_count_as_ours(tmp_path):
  shards = tmp_path / "shards"
  outdir.claim_dir(str(shards), "launch.preprocess --out")
  (shards / "train-00000.arrayrecord").write_text("rows")
  with pytest.raises(outdir.OutputDirError, match="holds the output of launch.preprocess"):
    outdir.claim_dir(str(shards), "work directory", writers=("work directory",))
  assert outdir.writer_of(str(shards)) == "launch.preprocess --out"
  assert outdir.claim_dir(str(shards), "w", writers=("launch.preprocess",)) == str(shards)
  marked_only = tmp_path / "m"
  outdir.claim_dir(str(marked_only), "other")
  outdir.claim_dir(str(marked_only), "w", writers=("w",))  # only a marker: counts as empty
