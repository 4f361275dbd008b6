"""Training objectives: pretraining (mlm, mlm_nsp, mlm_sop, rtd, replaced_mlm, distill)
and fine-tuning (finetune: a registered task of encoders/tasks/). Each gives the one
trainer what it needs (objectives/base.py): its modules, which are trained and which
frozen, init and an after-init hook, the batch transform, a loss as sums plus global
normalizers, metrics, FLOPs, a batch spec, baselines and export."""
from objectives.base import (Objective, get_objective, objective_class, prepare_config,
                             register_objective)
from objectives import mlm  # noqa: F401  (registers mlm, mlm_nsp, mlm_sop)
from objectives import rtd  # noqa: F401,E402  (registers rtd)
from objectives import distill  # noqa: F401,E402  (registers distill)
from objectives import rtd_mlm  # noqa: F401,E402  (registers replaced_mlm)
from objectives import finetune  # noqa: F401,E402  (registers finetune)
