"""The dense softmin kernel: the ``N × M`` cost held in memory, the ``tensorized`` backend and
every multiscale backend's problem on cluster means."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_dpot.ot.costs import GroundCost
from lightning_dpot.ot.loop import Target, cold_start, converge

SUBNORMAL_FLOOR = -80.0


def lse_(buf: Tensor, dim: int) -> Tensor:
    """LSE of ``buf`` along ``dim``, computed in place in ``buf`` (its contents are lost).

    Exponents below −80 are raised to −80 before ``exp``: their terms (< e^{−80} ≈ 1.8e−35 each,
    against a largest term of 1) change the sum by a relative M·e^{−80}, and as float32
    subnormals they would make ``exp`` several times slower on x86 CPUs
    (docs/performance.md)."""
    top = buf.amax(dim, keepdim=True)
    # Shift by the max so the largest term is e^0 (no overflow); floor at −80 so exp never
    # meets a subnormal (a slow path on x86), at a relative cost below M·e^{−80}.
    buf.sub_(top).clamp_min_(SUBNORMAL_FLOOR).exp_()
    return top.squeeze(dim) + buf.sum(dim).log_()


class DenseKernel:
    """C held densely (no autograd), one reusable ``N × M`` work buffer for the sweeps; the
    differentiable pass recomputes C(x, y.detach()) or C(x.detach(), y)."""

    name = "dense"

    def __init__(self, cost: GroundCost, x: Tensor, y: Tensor) -> None:
        self.cost, self.x, self.y = cost, x, y
        self.matrix = cost(x.detach(), y.detach())
        # One buffer for every sweep: no N × M temporary per iteration.
        self.buffer = torch.empty_like(self.matrix)

    def relative_error(self, eps: float) -> float:
        return 0.0

    def softmin_x(self, eps: float, h_y: Tensor) -> Tensor:
        torch.add(h_y[None, :], self.matrix, alpha=-1.0 / eps, out=self.buffer)
        return -eps * lse_(self.buffer, 1)

    def softmin_y(self, eps: float, h_x: Tensor) -> Tensor:
        torch.add(h_x[:, None], self.matrix, alpha=-1.0 / eps, out=self.buffer)
        return -eps * lse_(self.buffer, 0)

    def softmin_x_grad(self, eps: float, h_y: Tensor) -> Tensor:
        return -eps * torch.logsumexp(h_y[None, :] - self.cost(self.x, self.y.detach()) / eps, 1)

    def softmin_y_grad(self, eps: float, h_x: Tensor) -> Tensor:
        return -eps * torch.logsumexp(h_x[:, None] - self.cost(self.x.detach(), self.y) / eps, 0)


def coarse_solve(
    cost: GroundCost,
    xc: Tensor,
    yc: Tensor,
    log_ac: Tensor,
    log_bc: Tensor,
    eps_list: list[float],
    target: Target,
) -> tuple[Tensor, Tensor, DenseKernel]:
    """Anneal the weighted cluster means' problem (dense) over ``eps_list``; where the list ends
    at λ, converge to ``tol`` there. Returns the means' (f, g = T(f)) and their kernel: the
    first stage of every multiscale start."""
    coarse = DenseKernel(cost, xc, yc)
    fc, gc = cold_start(coarse, log_ac, log_bc, eps_list)
    if eps_list[-1] == target.reg:
        _, fc, gc, _, _ = converge(coarse, log_ac, log_bc, fc, gc, target, grad=False)
    return fc, gc, coarse
