"""Projections that bound a record's norm before noise, making sensitivity a public constant.

Both act row-wise on ``(n, d)`` tensors. A record already inside the ball is returned unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_dpot.privacy.validation import check_positive


def project_l2_ball(x: Tensor, radius: float) -> Tensor:
    """Euclidean projection onto {‖v‖₂ ≤ R}: v · min(1, R / ‖v‖₂)."""
    radius = check_positive("l2_radius", radius)
    norms = x.norm(dim=1, keepdim=True)
    return x * torch.clamp(radius / norms.clamp_min(torch.finfo(x.dtype).tiny), max=1.0)


def project_l1_ball(x: Tensor, radius: float) -> Tensor:
    """Exact Euclidean projection onto {‖v‖₁ ≤ R} (Duchi, Shalev-Shwartz, Singer, Chandra 2008,
    Fig. 1), O(d log d) per row.

    For a row v with ‖v‖₁ > R: sort u = |v| descending, ρ = max{j : u_j − (Σ_{i≤j} u_i − R)/j > 0},
    θ = (Σ_{i≤ρ} u_i − R)/ρ, and return sign(v)·max(|v| − θ, 0).
    """
    radius = check_positive("l1_radius", radius)
    abs_x = x.abs()
    outside = abs_x.sum(dim=1) > radius
    if not bool(outside.any()):
        return x.clone()
    v = abs_x[outside]
    u, _ = torch.sort(v, dim=1, descending=True)
    cumsum = u.cumsum(dim=1) - radius
    j = torch.arange(1, v.shape[1] + 1, device=x.device, dtype=x.dtype)
    rho = ((u - cumsum / j) > 0).to(x.dtype).mul(j).argmax(dim=1, keepdim=True)
    theta = cumsum.gather(1, rho) / (rho + 1).to(x.dtype)
    out = x.clone()
    out[outside] = torch.sign(x[outside]) * torch.clamp(v - theta, min=0.0)
    return out
