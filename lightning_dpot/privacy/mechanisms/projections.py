"""Projections that bound a record's norm before noise, making sensitivity a public constant.

Both act row-wise on ``(n, d)`` tensors. A record already inside the ball (its norm computed
in float64 is at most R) is returned unchanged.

The sensitivity 2R must hold for the output *as stored*, after rounding to its dtype. Rounding
each coordinate to a dtype with unit roundoff u = eps/2 scales its magnitude by at most 1 + u,
and so every ℓp norm. Rows outside the ball are therefore projected in float64 onto the ball
of radius R/(1 + u); a row whose rounded float64 norm still exceeds R (float64 cancellation in
the threshold can exceed u when the entries dwarf R) is scaled onto R/(1 + 2^k u), k = 1, 2, …,
until none does. Every output row then satisfies ‖v‖_p ≤ R, computed in float64.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lightning_dpot.checks import check_positive


def _l1_norms(x: Tensor) -> Tensor:
    return x.double().abs().sum(dim=1)


def _l2_norms(x: Tensor) -> Tensor:
    return torch.linalg.vector_norm(x.double(), dim=1)


def _inside_as_stored(
    projected: Tensor, x: Tensor, outside: Tensor, radius: float, norms: Callable
) -> Tensor:
    """Round the float64 ``projected`` rows of ``x`` (those marked ``outside``) to ``x.dtype``
    and shrink any whose float64 norm still exceeds ``radius`` (module docstring)."""
    out = x.clone()
    rows = projected.to(x.dtype)
    margin = torch.finfo(x.dtype).eps  # 2u
    while True:
        excess = norms(rows) > radius
        if not bool(excess.any()):
            break
        scale = radius / (norms(rows[excess]) * (1.0 + margin))
        rows[excess] = (rows[excess].double() * scale.unsqueeze(1)).to(x.dtype)
        margin *= 2.0
    out[outside] = rows
    return out


def project_l2_ball(x: Tensor, radius: float) -> Tensor:
    """Euclidean projection onto {‖v‖₂ ≤ R}: v · min(1, R / ‖v‖₂), exact in ``x.dtype``
    (module docstring)."""
    radius = check_positive("l2_radius", radius)
    norms = _l2_norms(x)
    outside = norms > radius
    if not bool(outside.any()):
        return x.clone()
    shrunk = radius / (1.0 + torch.finfo(x.dtype).eps / 2)
    v = x[outside].double()
    projected = v * (shrunk / norms[outside]).unsqueeze(1)
    return _inside_as_stored(projected, x, outside, radius, _l2_norms)


def project_l1_ball(x: Tensor, radius: float) -> Tensor:
    """Exact Euclidean projection onto {‖v‖₁ ≤ R} (Duchi, Shalev-Shwartz, Singer, Chandra 2008,
    Fig. 1), O(d log d) per row, inside the ball in ``x.dtype`` (module docstring).

    For a row v with ‖v‖₁ > R: sort u = |v| descending, ρ = max{j : u_j − (Σ_{i≤j} u_i − R)/j > 0},
    θ = (Σ_{i≤ρ} u_i − R)/ρ, and return sign(v)·max(|v| − θ, 0).
    """
    radius = check_positive("l1_radius", radius)
    outside = _l1_norms(x) > radius
    if not bool(outside.any()):
        return x.clone()
    shrunk = radius / (1.0 + torch.finfo(x.dtype).eps / 2)
    v = x[outside].double()
    u, _ = torch.sort(v.abs(), dim=1, descending=True)
    cumsum = u.cumsum(dim=1) - shrunk
    j = torch.arange(1, v.shape[1] + 1, device=x.device, dtype=torch.float64)
    rho = ((u - cumsum / j) > 0).double().mul(j).argmax(dim=1, keepdim=True)
    theta = cumsum.gather(1, rho) / (rho + 1).double()
    projected = torch.sign(v) * torch.clamp(v.abs() - theta, min=0.0)
    return _inside_as_stored(projected, x, outside, radius, _l1_norms)
