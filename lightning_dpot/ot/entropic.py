"""Entropic optimal transport between uniform point clouds (Reshetova et al. 2024, eq. 17).

    W_{p,λ}(μ, ν) = min_{π ∈ Π(μ, ν)} ⟨π, C⟩ + λ · KL(π ‖ μ⊗ν),   C_ij = ‖x_i − y_j‖_p^p.

Solved by ``EntropicSolver`` with the exact cost (ℓ1 for p = 1,
‖·‖₂² for p = 2), so the value is exactly W_{p,λ} in the cost's own units: no blur conversion is
needed. (geomloss' built-in p = 2 cost is ½‖·‖², with which W_{2,λ}(‖·‖²) = 2·OT_{λ/2}(½‖·‖²), i.e.
blur = √(λ/2) and the value doubled; its p = 1 cost is Euclidean, not ℓ1; see
docs/design.md#entropic-p-wgan.) The annealing starts at ``diameter^p``, where ``diameter`` must
bound ‖x − y‖_p: a fixed public value, never estimated from data.

Every solve ends at the target λ only once the marginal violation is below ``tol``; the last
solve's ``SinkhornInfo`` is kept in ``last_info``.
"""

from __future__ import annotations

from torch import Tensor, nn

from lightning_dpot.ot.costs import lp_cost
from lightning_dpot.ot.sinkhorn import Backend, EntropicSolver, SinkhornInfo


class EntropicOT(nn.Module):
    """W_{p,λ} (``debias=False``) or the Sinkhorn divergence
    S = W_{p,λ}(x, y) − ½ W_{p,λ}(x, x) − ½ W_{p,λ}(y, y) (``debias=True``).

    Args:
        p: 1 (ℓ1 cost) or 2 (squared Euclidean cost).
        entropic_reg: entropic regularization λ > 0 (Reshetova et al. 2024: λ = p·σ^p).
        diameter: public upper bound on ‖x − y‖_p.
        scaling: ε-scaling ratio in (0, 1) (annealing only; convergence is set by ``tol``).
        debias: return the Sinkhorn divergence instead of W_{p,λ}.
        tol: tolerance on the row-marginal violation ‖π1 − a‖₁ at ε = λ.
        max_iter: cap on the Sinkhorn sweeps at ε = λ.
        backend: ``auto`` | ``tensorized`` | ``newton`` | ``online`` | ``multiscale``
            (``lightning_dpot.ot.sinkhorn``).

    Raises:
        ValueError: ``p`` other than 1 or 2, or an argument that
            ``EntropicSolver`` refuses (named in the message);
            at a call, clouds that are not ``(N, D)`` and ``(M, D)``.
        RuntimeError: at a call, ``online`` or ``multiscale`` without a working KeOps.

    Example::

        >>> import torch
        >>> from lightning_dpot.ot import EntropicOT
        >>> _ = torch.manual_seed(0)
        >>> loss_fn = EntropicOT(p=2, entropic_reg=0.05, diameter=1.5, debias=True)
        >>> x = torch.rand(128, 2, requires_grad=True)  # unit square: distances ≤ √2 ≤ 1.5
        >>> loss = loss_fn(x, torch.rand(128, 2))  # the Sinkhorn divergence, a scalar
        >>> loss.backward()
        >>> loss.shape, x.grad.shape, loss_fn.last_info.converged
        (torch.Size([]), torch.Size([128, 2]), True)
    """

    def __init__(
        self,
        p: int,
        entropic_reg: float,
        diameter: float,
        scaling: float = 0.9,
        debias: bool = False,
        tol: float = 1e-3,
        max_iter: int = 2000,
        backend: Backend = "auto",
    ) -> None:
        super().__init__()
        self.p, self.debias = p, debias
        self.solver = EntropicSolver(
            lp_cost(p), p, entropic_reg, diameter, scaling, tol, max_iter, backend=backend
        )
        self.entropic_reg, self.diameter = self.solver.entropic_reg, self.solver.diameter
        self.last_info: SinkhornInfo | None = None

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """``x``: (N, D), ``y``: (M, D), uniform weights; returns a scalar."""
        value, self.last_info = self.solver(x, y)
        if not self.debias:
            return value
        xx, _ = self.solver(x, x)
        yy, _ = self.solver(y, y)
        return value - 0.5 * xx - 0.5 * yy
