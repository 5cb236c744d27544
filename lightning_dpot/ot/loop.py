r"""The log-domain Sinkhorn loop, over a declared softmin kernel.

A kernel holds the cost C_ij = c(x_i, y_j) between two clouds and evaluates the soft
c-transforms

    softmin_x(ε, h)_i = −ε LSE_j(h_j − C_ij/ε),   softmin_y(ε, h)_j = −ε LSE_i(h_i − C_ij/ε),

so that f ← softmin_x(ε, log b + g/ε) and g ← softmin_y(ε, log a + f/ε) are one Sinkhorn sweep
(Feydy et al. 2019). The loop below never looks inside a kernel; the dense, KeOps, Taylor and
exact ℓ1 kernels (``lightning_dpot.ot.dense``, ``lightning_dpot.ot.keops``,
``lightning_dpot.ot.taylor``, ``lightning_dpot.ot.laplace``) all plug in, as geomloss'
``sinkhorn_loop`` takes its softmin as an argument.

**Schedule.** ε-scaling from ε₀ = diameter^p down to λ in ratios ``scaling^p`` (geomloss'
schedule; ``diameter`` is a public bound on the distances), then sweeps at ε = λ until the
row-marginal violation of the plan π_ij = a_i b_j e^{(f_i + g_j − C_ij)/λ},

    err = ‖π1 − a‖₁ = Σ_i a_i |e^{(f_i − f̃_i)/λ} − 1|,   f̃ = the next f-update,

is at most ``tol`` (``converge``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Protocol

import torch
from torch import Tensor


@dataclass(frozen=True)
class SinkhornInfo:
    """What one solve did: the backend and its kernel (``dense``, ``keops``,
    ``keops-truncated``, ``taylor-k`` or ``laplace-d``), the annealing sweeps, the sweeps
    (Newton steps) at the target ε, the final marginal violation ‖π1 − a‖₁ and whether it
    met ``tolerance``. ``kernel_error`` is the kernel's certified relative error ρ at λ (0 for
    exact kernels); ``marginal_error`` already includes it."""

    backend: str
    annealing_steps: int
    iterations: int
    marginal_error: float
    tolerance: float
    converged: bool
    kernel: str
    kernel_error: float

    def as_dict(self) -> dict:
        return asdict(self)


class SoftminKernel(Protocol):
    """The soft c-transforms of one pair of clouds ``x`` (N, D) and ``y`` (M, D).

    ``softmin_x`` / ``softmin_y`` run without autograd (the sweeps); ``softmin_x_grad`` /
    ``softmin_y_grad`` are the same maps differentiable in ``x`` / ``y`` (the last, envelope
    pass). ``relative_error(ε)`` is a certified bound ρ on the relative error of every sum the
    kernel forms at ε (0 for exact kernels); ``name`` goes into ``SinkhornInfo``."""

    name: str
    x: Tensor
    y: Tensor

    def relative_error(self, eps: float) -> float: ...

    def softmin_x(self, eps: float, h_y: Tensor) -> Tensor: ...

    def softmin_y(self, eps: float, h_x: Tensor) -> Tensor: ...

    def softmin_x_grad(self, eps: float, h_y: Tensor) -> Tensor: ...

    def softmin_y_grad(self, eps: float, h_x: Tensor) -> Tensor: ...


@dataclass(frozen=True)
class Target:
    """Where a solve stops: ε = λ (``reg``), ‖π1 − a‖₁ ≤ ``tol``, at most ``max_iter`` sweeps."""

    reg: float
    tol: float
    max_iter: int


def epsilon_schedule(diameter: float, reg: float, p: int, scaling: float) -> list[float]:
    """ε_k = diameter^p · scaling^{pk} for the k with ε_k > λ, then λ (geomloss' ε-scaling)."""
    eps0 = max(diameter**p, reg)
    steps = max(0, math.ceil(math.log(eps0 / reg) / (p * -math.log(scaling))))
    return [eps0 * scaling ** (p * k) for k in range(steps) if eps0 * scaling ** (p * k) > reg] + [
        reg
    ]


def anneal(
    kernel: SoftminKernel, log_a: Tensor, log_b: Tensor, f: Tensor, g: Tensor, eps_list: list[float]
) -> tuple[Tensor, Tensor]:
    """For each consecutive (ε, ε') of ``eps_list``: f = T_ε(g), then g = T_ε'(f). With two or
    more ε, the returned (f, g) has g = T_{ε_last}(f), the start ``converge`` needs."""
    for eps, eps_next in zip(eps_list, eps_list[1:], strict=False):
        f = kernel.softmin_x(eps, log_b + g / eps)
        g = kernel.softmin_y(eps_next, log_a + f / eps_next)
    return f, g


def cold_start(
    kernel: SoftminKernel, log_a: Tensor, log_b: Tensor, eps_list: list[float]
) -> tuple[Tensor, Tensor]:
    """(f, g = T(f)) at ``eps_list[-1]`` from f = 0, annealed over the whole list."""
    f = torch.zeros_like(log_a)
    g = kernel.softmin_y(eps_list[0], log_a)
    return anneal(kernel, log_a, log_b, f, g, eps_list)


def converge(
    kernel: SoftminKernel,
    log_a: Tensor,
    log_b: Tensor,
    f: Tensor,
    g: Tensor,
    target: Target,
    grad: bool,
) -> tuple[Tensor, Tensor, Tensor, int, float]:
    """Sinkhorn sweeps at ε = λ until ‖π1 − a‖₁ ≤ tol, from a pair with g = T(f).

    With g = T(f) the columns of the plan of (f, g) sum to b; each sweep computes f̃ = T(g),
    which measures its row violation, and on success (or at ``max_iter``) returns
    ``(f̃, f, g, sweeps, error)``: (f̃, g) is the final dual pair. Otherwise it goes on from f̃
    and g = T(f̃). With ``grad`` (kernels whose differentiable pass costs no more than a plain
    one) f̃ carries gradients to x.

    A kernel whose sums are within a relative ρ of the exact ones (``relative_error``) computes
    e^{(f − f̃)/ε} within a factor in [1/(1 + ρ), 1/(1 − ρ)] of the exact value, so the violation
    it measures, err̂, bounds the true one by err̂ + (1 + err̂)·ρ/(1 − ρ); that bound is what is
    tested and returned. (Its columns then sum to b within the same factor.)
    """
    eps = target.reg
    a = log_a.exp()
    slack = kernel.relative_error(eps)
    slack /= 1 - slack
    softmin_x = kernel.softmin_x_grad if grad else kernel.softmin_x
    for sweep in range(1, target.max_iter + 1):
        f_next = softmin_x(eps, log_b + g / eps)
        # expm1 keeps the small violations exact that 1 − e^{…} would round to 0 in float32.
        measured = float((a * torch.expm1((f - f_next.detach()) / eps).abs()).sum())
        error = measured + (1 + measured) * slack
        if error <= target.tol or sweep == target.max_iter:
            return f_next, f, g, sweep, error
        f = f_next.detach()
        g = kernel.softmin_y(eps, log_a + f / eps)
    raise AssertionError("unreachable: max_iter >= 1")


def coarse_then_fine(eps_list: list[float], side: float, p: int) -> tuple[list[float], list[float]]:
    """Split a schedule at a cluster side s: the ε > s^p (annealed on cluster means; at least
    the first ε) and the ε ≤ s^p (on the points)."""
    fine = [eps for eps in eps_list if eps <= side**p]
    return eps_list[: len(eps_list) - len(fine)] or eps_list[:1], fine
