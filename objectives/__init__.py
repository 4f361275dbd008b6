"""Pretraining objectives. Each provides what the one trainer needs: the modules it trains,
their init, its on-device batch transform, loss and summable metrics, and its export."""
from objectives.base import Objective, get_objective, register_objective
from objectives import mlm  # noqa: F401  (registers mlm, mlm_nsp)
