"""Optimal-transport losses."""

from lightning_dpot.ot.costs import (
    GroundCost,
    LpCost,
    MixedL2L1Cost,
    l1_cost,
    lp_cost,
    squared_euclidean_cost,
)
from lightning_dpot.ot.entropic import EntropicOT
from lightning_dpot.ot.exact import ExactOT
from lightning_dpot.ot.reference import (
    entropic_plan_newton,
    sinkhorn_log_domain,
    sinkhorn_log_plan,
)
from lightning_dpot.ot.sinkhorn import EntropicSolver, SinkhornInfo

__all__ = [
    "EntropicOT",
    "EntropicSolver",
    "ExactOT",
    "GroundCost",
    "LpCost",
    "MixedL2L1Cost",
    "SinkhornInfo",
    "entropic_plan_newton",
    "l1_cost",
    "lp_cost",
    "sinkhorn_log_domain",
    "sinkhorn_log_plan",
    "squared_euclidean_cost",
]
