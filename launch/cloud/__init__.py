"""Launchers: the same `python -m launch.pretrain` on Cloud TPU VMs (`tpu_vm`), GKE TPU
slices through XPK (`xpk`) and SLURM GPU clusters (`slurm`). Each prints the exact commands
it would run with `--dry_run`; see docs/cloud_tpu.md."""
