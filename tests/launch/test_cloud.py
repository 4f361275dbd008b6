"""The launchers' --dry_run commands (launch/cloud/): exact gcloud / xpk / sbatch lines."""
import io
import shlex

import pytest

from launch.cloud import slurm, tpu_vm, xpk

TPU = ["--name", "bert-base", "--zone", "us-east5-a", "--project", "my-proj",
       "--accelerator_type", "v5p-8"]
TRAIN = ["--config", "configs/bert.py:base", "--workdir", "gs://b/runs/bert", "--",
         "--config.data.source=arrayrecord", "--config.data.path=/mnt/data/wiki"]
WHERE = ["--zone=us-east5-a", "--project=my-proj"]
PRETRAIN = ("python3 -m launch.pretrain --config configs/bert.py:base --workdir "
            "gs://b/runs/bert --multihost --config.data.source=arrayrecord "
            "--config.data.path=/mnt/data/wiki")


def _lines(out):
  return [line for line in out.getvalue().splitlines() if line and not line.startswith("#")]


def test_tpu_vm_up_spot_prints_create_setup_and_run_on_all_workers():
  out = io.StringIO()
  run = tpu_vm.main(["up", *TPU, "--capacity", "spot", "--dry_run", *TRAIN], out)
  assert run.commands[0] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "bert-base",
                             "--accelerator-type=v5p-8", "--version=v2-alpha-tpuv5", *WHERE,
                             "--spot"]
  assert run.commands[1][:2] == ["git", "archive"]
  assert run.commands[2][:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
  last = run.commands[-1]
  assert last[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "bert-base"]
  assert "--worker=all" in last
  remote = last[-1].removeprefix("--command=")
  assert remote == f"cd ~/encoder-zoo && {PRETRAIN} 2>&1 | tee -a ~/encoder_zoo.log"
  assert _lines(out) == [shlex.join(c) for c in run.commands]  # printed exactly


def test_tpu_vm_queued_create_and_delete():
  run = tpu_vm.main(["create", *TPU, "--capacity", "queued_spot", "--dry_run"], io.StringIO())
  assert run.commands[0] == ["gcloud", "compute", "tpus", "queued-resources", "create",
                             "bert-base-qr", "--node-id=bert-base", "--accelerator-type=v5p-8",
                             "--runtime-version=v2-alpha-tpuv5", *WHERE, "--spot"]
  assert run.commands[1][4] == "describe"
  run = tpu_vm.main(["delete", *TPU, "--capacity", "queued", "--dry_run"], io.StringIO())
  assert run.commands == [["gcloud", "compute", "tpus", "queued-resources", "delete",
                           "bert-base-qr", *WHERE, "--force", "--quiet"]]
  run = tpu_vm.main(["delete", *TPU, "--dry_run"], io.StringIO())
  assert run.commands == [["gcloud", "compute", "tpus", "tpu-vm", "delete", "bert-base",
                           *WHERE, "--quiet"]]
  run = tpu_vm.main(["logs", *TPU, "--dry_run"], io.StringIO())
  assert run.commands[0][-2:] == ["--worker=0", "--command=tail -n 200 -F ~/encoder_zoo.log"]


def test_tpu_vm_bad_arguments():
  with pytest.raises(ValueError, match="--name"):
    tpu_vm.main(["create", "--name", "Bad_Name", "--zone", "z", "--project", "p",
                 "--dry_run"], io.StringIO())
  with pytest.raises(ValueError, match="--config and --workdir"):
    tpu_vm.main(["run", *TPU, "--dry_run"], io.StringIO())


def test_xpk_workload_create():
  run = xpk.main(["create", "--cluster", "c1", "--project", "my-proj", "--zone",
                  "us-east5-a", "--workload", "bert-base", "--tpu_type", "v5p-128",
                  "--num_slices", "2", "--docker_image", "gcr.io/p/ez:1", "--spot",
                  "--dry_run", *TRAIN], io.StringIO())
  assert run.commands == [[
      "xpk", "workload", "create", "--cluster=c1", "--project=my-proj", "--zone=us-east5-a",
      "--workload=bert-base", "--tpu-type=v5p-128", "--num-slices=2",
      "--docker-image=gcr.io/p/ez:1", "--max-restarts=10", f"--command={PRETRAIN}",
      "--spot"]]
  with pytest.raises(ValueError, match="docker_image"):
    xpk.main(["create", "--cluster", "c1", "--project", "p", "--zone", "z", "--dry_run",
              *TRAIN], io.StringIO())


def test_slurm_script_per_gpu_and_per_node(tmp_path):
  out = io.StringIO()
  run = slurm.main(["--nodes", "2", "--gpus_per_node", "8", "--per", "gpu", "--requeue",
                    "--script", str(tmp_path / "job.sbatch"), "--dry_run", "--config",
                    "configs/bert.py:base", "--workdir", "/shared/run", "--",
                    "--config.model.dtype=bfloat16"], out)
  text = out.getvalue()
  assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\n#SBATCH --gpus-per-node=8" in text
  assert "#SBATCH --requeue" in text and "#SBATCH --signal=TERM@120" in text
  inner = ("export CUDA_VISIBLE_DEVICES=$SLURM_LOCALID; exec python3 -m launch.pretrain "
           "--config configs/bert.py:base --workdir /shared/run --multihost "
           "--config.model.dtype=bfloat16")
  assert f"srun --kill-on-bad-exit=1 bash -c {shlex.quote(inner)}" in text
  assert run.commands == [["sbatch", str(tmp_path / "job.sbatch")]]
  assert not (tmp_path / "job.sbatch").exists()  # dry run: nothing written
  out = io.StringIO()
  slurm.main(["--dry_run", "--config", "c.py", "--workdir", "/w"], out)
  assert "#SBATCH --ntasks-per-node=1\n" in out.getvalue()
  assert "CUDA_VISIBLE_DEVICES" not in out.getvalue()
