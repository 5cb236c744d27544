"""Entropic optimal transport between uniform point clouds (paper 001 eq. 17).

    W_{p,λ}(μ, ν) = min_{π ∈ Π(μ, ν)} ⟨π, C⟩ + λ · KL(π ‖ μ⊗ν),   C_ij = ‖x_i − y_j‖_p^p.

Solved with geomloss' ε-scaling Sinkhorn (Feydy et al. 2019) with our own cost, so the value is
exactly W_{p,λ} (geomloss' built-in p = 2 cost is ½‖·‖² and its p = 1 cost is Euclidean, not
ℓ1; see SPEC §4). geomloss' temperature is ε = blur^p, hence ``blur = λ^(1/p)``; the annealing
starts at ``diameter^p``, where ``diameter`` must bound ‖x − y‖_p — a fixed public value here,
never estimated from data (that would also cost a host sync per step).
"""

from __future__ import annotations

import math

import torch
from geomloss import SamplesLoss
from torch import Tensor, nn

from lightning_dpot.ot.costs import lp_cost
from lightning_dpot.privacy.validation import check_positive


class EntropicOT(nn.Module):
    """W_{p,λ} (``debias=False``) or the Sinkhorn divergence
    S = W_{p,λ}(x, y) − ½ W_{p,λ}(x, x) − ½ W_{p,λ}(y, y) (``debias=True``).

    Args:
        p: 1 (ℓ1 cost) or 2 (squared Euclidean cost).
        reg: entropic regularization λ > 0 (paper 001: λ = p·σ^p).
        diameter: public upper bound on ‖x − y‖_p.
        scaling: ε-scaling ratio in [0.9, 1); geomloss' default 0.5 under-converges.
        debias: return the Sinkhorn divergence instead of W_{p,λ}.
    """

    def __init__(
        self, p: int, reg: float, diameter: float, scaling: float = 0.95, debias: bool = False
    ) -> None:
        super().__init__()
        self.p, self.reg = p, check_positive("entropic_reg", reg)
        self.diameter = check_positive("diameter", diameter)
        if not 0.9 <= scaling < 1.0:
            raise ValueError(f"scaling must lie in [0.9, 1), got {scaling!r}")
        self.scaling, self.debias = scaling, debias
        self._loss = SamplesLoss(
            "sinkhorn",
            p=p,
            blur=reg ** (1.0 / p),
            scaling=scaling,
            diameter=max(self.diameter, reg ** (1.0 / p)),
            cost=lp_cost(p),
            debias=debias,
            backend="tensorized",
        )

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """``x``: (N, D), ``y``: (M, D), uniform weights; returns a scalar."""
        return self._loss(x, y)


def _sinkhorn_log_potentials(x: Tensor, y: Tensor, p: int, reg: float, iterations: int):
    """Plain log-domain Sinkhorn for W_{p,λ}, uniform weights a, b:
    f ← −λ LSE_j(log b_j + (g_j − C_ij)/λ), g ← −λ LSE_i(log a_i + (f_i − C_ij)/λ)."""
    cost = lp_cost(p)(x, y)
    log_a = torch.full((x.shape[0],), -math.log(x.shape[0]), dtype=x.dtype)
    log_b = torch.full((y.shape[0],), -math.log(y.shape[0]), dtype=x.dtype)
    f = torch.zeros_like(log_a)
    g = torch.zeros_like(log_b)
    for _ in range(iterations):
        f = -reg * torch.logsumexp(log_b[None, :] + (g[None, :] - cost) / reg, dim=1)
        g = -reg * torch.logsumexp(log_a[:, None] + (f[:, None] - cost) / reg, dim=0)
    return f, g, cost, log_a, log_b


def sinkhorn_log_domain(x: Tensor, y: Tensor, p: int, reg: float, iterations: int = 2000) -> Tensor:
    """W_{p,λ} = ⟨a, f⟩ + ⟨b, g⟩ at convergence of plain log-domain Sinkhorn; a slow reference
    for tests."""
    f, g, _, log_a, log_b = _sinkhorn_log_potentials(x, y, p, reg, iterations)
    return (log_a.exp() * f).sum() + (log_b.exp() * g).sum()


def sinkhorn_log_plan(x: Tensor, y: Tensor, p: int, reg: float, iterations: int = 2000) -> Tensor:
    """The entropic plan π_ij = a_i b_j exp((f_i + g_j − C_ij)/λ) of W_{p,λ}; a slow reference
    for tests."""
    f, g, cost, log_a, log_b = _sinkhorn_log_potentials(x, y, p, reg, iterations)
    return torch.exp(log_a[:, None] + log_b[None, :] + (f[:, None] + g[None, :] - cost) / reg)
