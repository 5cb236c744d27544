"""Unregularized minibatch OT (Reshetova et al. 2024, eq. 1 / eq. 13).

For two uniform batches of equal size the optimal plan is a permutation (Birkhoff–von Neumann),
found exactly by the assignment solver (Jonker–Volgenant, ``scipy.optimize.linear_sum_assignment``):

    W_p^p(x, y) = (1/B) Σ_i C_{i, σ*(i)},  σ* = argmin_σ Σ_i C_{i, σ(i)}.

The gradient flows through C at the fixed optimal σ* (Danskin's theorem). The solver is
O(B³) on the CPU, so above ``max_exact_batch`` (or for unequal sizes) the loss falls back to
an entropic OT with a small blur (1% of the diameter) and warns once.
"""

from __future__ import annotations

import warnings

import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

from lightning_dpot.ot.costs import lp_cost
from lightning_dpot.ot.entropic import EntropicOT
from lightning_dpot.ot.loop import SinkhornInfo
from lightning_dpot.ot.precision import full_precision


class ExactOT(nn.Module):
    """W_p^p between equal-size uniform batches via assignment; see module docstring."""

    def __init__(self, p: int, diameter: float, max_exact_batch: int = 2048) -> None:
        super().__init__()
        self.p, self.max_exact_batch = p, max_exact_batch
        self.cost = lp_cost(p)
        self._fallback = EntropicOT(p, entropic_reg=(0.01 * diameter) ** p, diameter=diameter)
        self._warned = False
        self.last_info: SinkhornInfo | None = None

    @full_precision
    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """W_p^p of ``x`` and ``y``, outside autocast in at least float32
        (``lightning_dpot.ot.precision``)."""
        if x.shape[0] != y.shape[0] or x.shape[0] > self.max_exact_batch:
            if not self._warned:
                warnings.warn(
                    f"ExactOT: batch sizes {x.shape[0]} and {y.shape[0]} are unequal or above "
                    f"max_exact_batch={self.max_exact_batch}; using entropic OT with a small "
                    "blur (1% of the diameter) instead of the exact assignment",
                    stacklevel=2,
                )
                self._warned = True
            value = self._fallback(x, y)
            self.last_info = self._fallback.last_info
            return value
        self.last_info = None
        cost = self.cost(x, y)
        rows, cols = linear_sum_assignment(cost.detach().cpu().double().numpy())
        rows_t = torch.as_tensor(rows, device=cost.device)
        cols_t = torch.as_tensor(cols, device=cost.device)
        return cost[rows_t, cols_t].mean()
