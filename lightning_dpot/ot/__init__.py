"""Optimal-transport losses."""

from lightning_dpot.ot.costs import l1_cost, lp_cost, squared_euclidean_cost
from lightning_dpot.ot.entropic import EntropicOT, sinkhorn_log_domain, sinkhorn_log_plan
from lightning_dpot.ot.exact import ExactOT

__all__ = [
    "EntropicOT",
    "ExactOT",
    "l1_cost",
    "lp_cost",
    "sinkhorn_log_domain",
    "sinkhorn_log_plan",
    "squared_euclidean_cost",
]
