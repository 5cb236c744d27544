"""Pairwise ground costs C_ij = c(x_i, y_j) for point clouds ``(..., N, D)`` and ``(..., M, D)``.

None of them builds an ``N × M × D`` intermediate: the ℓ1 cost uses ``torch.cdist`` (a fused
kernel in forward and backward), the squared Euclidean cost the expansion ‖x‖² + ‖y‖² − 2⟨x, y⟩.
"""

from __future__ import annotations

import torch
from torch import Tensor


def l1_cost(x: Tensor, y: Tensor) -> Tensor:
    """C_ij = ‖x_i − y_j‖₁ (the p = 1 cost matched to the Laplace mechanism)."""
    return torch.cdist(x, y, p=1.0)


def squared_euclidean_cost(x: Tensor, y: Tensor) -> Tensor:
    """C_ij = ‖x_i − y_j‖₂² (the p = 2 cost matched to the Gaussian mechanism)."""
    xx = (x * x).sum(-1, keepdim=True)
    yy = (y * y).sum(-1, keepdim=True).transpose(-1, -2)
    return (xx + yy - 2.0 * x @ y.transpose(-1, -2)).clamp_min(0.0)


def lp_cost(p: int):
    """The cost ‖x − y‖_p^p for p ∈ {1, 2}."""
    if p == 1:
        return l1_cost
    if p == 2:
        return squared_euclidean_cost
    raise ValueError(f"p must be 1 or 2, got {p!r}")
