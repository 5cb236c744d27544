r"""Slow, independent references for entropic OT, for tests and benchmarks (dense, float64).

Neither uses ε-scaling, KeOps or the solver of ``lightning_dpot.ot.sinkhorn``:

* ``sinkhorn_log_domain`` / ``sinkhorn_log_plan``: plain log-domain Sinkhorn at the
  target λ from zero potentials, until ‖π1 − a‖₁ ≤ ``tol``.
* ``entropic_plan_newton``: Newton's method on the concave semi-dual (Cuturi & Peyré 2018)

      F(g) = ⟨b, g⟩ − λ Σ_i a_i log Σ_j b_j e^{(g_j − C_ij)/λ},
      ∇F_j = b_j − Σ_i π_ij,   ∇²F = −(1/λ)(diag(π^T 1) − π^T diag(1/a) π),

  with π_ij = a_i b_j e^{(g_j − C_ij)/λ} / Σ_k b_k e^{(g_k − C_ik)/λ}, which converges
  quadratically where plain Sinkhorn crawls (λ ≪ max C, e.g. 10⁻³·diameter^p); it is
  continued in λ from max C by halving, Newton's basin shrinking with λ. Unlike the package's
  ``newton`` backend (``lightning_dpot.ot.newton``: Cholesky with a ridge, a fixed number of
  steps, a tangent predictor), each stage here runs least-squares Newton steps with backtracking
  until the tolerance, or until no ascent is left at a residual of at most 10⁻⁷ (rounding:
  at λ = 10⁻⁶·max C, C/λ ≈ 10⁶ and the residual stalls near 10⁻⁹).

The value is the primal ⟨π, C⟩ + λ KL(π ‖ a⊗b), its gradient in x the envelope-theorem
Σ_j π_ij ∇_x c(x_i, y_j).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_dpot.ot.costs import GroundCost, lp_cost


def _uniform_logs(n: int, m: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    return (
        torch.full((n,), -math.log(n), dtype=dtype),
        torch.full((m,), -math.log(m), dtype=dtype),
    )


def _sinkhorn_log_potentials(x: Tensor, y: Tensor, p: int, reg: float, tol: float, max_iter: int):
    cost = lp_cost(p)(x, y)
    log_a, log_b = _uniform_logs(x.shape[0], y.shape[0], x.dtype)
    f = torch.zeros_like(log_a)
    g = -reg * torch.logsumexp(log_a[:, None] + (f[:, None] - cost) / reg, dim=0)
    for _ in range(max_iter):
        f_next = -reg * torch.logsumexp(log_b[None, :] + (g[None, :] - cost) / reg, dim=1)
        error = (log_a.exp() * torch.expm1((f - f_next) / reg).abs()).sum()
        f = f_next
        g = -reg * torch.logsumexp(log_a[:, None] + (f[:, None] - cost) / reg, dim=0)
        if error <= tol:
            return f, g, cost, log_a, log_b
    raise RuntimeError(
        f"reference Sinkhorn: ‖π1 − a‖₁ = {float(error):.3g} > tol={tol} after {max_iter} sweeps"
    )


def sinkhorn_log_domain(
    x: Tensor, y: Tensor, p: int, reg: float, tol: float = 1e-10, max_iter: int = 200_000
) -> Tensor:
    """W_{p,λ} = ⟨a, f⟩ + ⟨b, g⟩ of plain log-domain Sinkhorn run to ``tol``."""
    f, g, _, log_a, log_b = _sinkhorn_log_potentials(x, y, p, reg, tol, max_iter)
    return (log_a.exp() * f).sum() + (log_b.exp() * g).sum()


def sinkhorn_log_plan(
    x: Tensor, y: Tensor, p: int, reg: float, tol: float = 1e-10, max_iter: int = 200_000
) -> Tensor:
    """The plan π_ij = a_i b_j exp((f_i + g_j − C_ij)/λ) of plain log-domain Sinkhorn."""
    f, g, cost, log_a, log_b = _sinkhorn_log_potentials(x, y, p, reg, tol, max_iter)
    return torch.exp(log_a[:, None] + log_b[None, :] + (f[:, None] + g[None, :] - cost) / reg)


STALL_FLOOR = 1e-7


def entropic_plan_newton(
    x: Tensor,
    y: Tensor,
    p: int,
    reg: float,
    tol: float = 1e-9,
    max_iter: int = 100,
    cost_fn: GroundCost | None = None,
) -> Tensor:
    """The optimal entropic plan of W_{c,λ} by damped Newton on the semi-dual (module
    docstring), to ‖∇F‖₁ = ‖π^T 1 − b‖₁ ≤ ``tol`` (or a stall at most 10⁻⁷); rows sum exactly
    to a. Newton's basin shrinks with λ, so it is continued from λ = max C down to ``reg`` by
    halving, each stage started at the previous stage's optimum. The cost is ``cost_fn``, by
    default ‖x − y‖_p^p."""
    x, y = x.double(), y.double()
    cost = (cost_fn or lp_cost(p))(x, y).detach()
    log_a, log_b = _uniform_logs(x.shape[0], y.shape[0], x.dtype)
    a, b = log_a.exp(), log_b.exp()
    stages = [max(float(cost.max()), reg) * 0.5**k for k in range(400)]
    stages = [lam for lam in stages if lam > reg] + [reg]

    def plan_and_objective(g: Tensor, lam: float) -> tuple[Tensor, Tensor]:
        logits = log_b[None, :] + (g[None, :] - cost) / lam
        lse = torch.logsumexp(logits, dim=1)
        plan = torch.exp(log_a[:, None] + logits - lse[:, None])
        return plan, (b * g).sum() - lam * (a * lse).sum()

    g = torch.zeros_like(log_b)
    for lam in stages:
        plan, objective = plan_and_objective(g, lam)
        for _ in range(max_iter):
            grad = b - plan.sum(0)
            if grad.abs().sum() <= tol:
                break
            hessian = (torch.diag(plan.sum(0)) - plan.T @ (plan / a[:, None])) / lam
            # F is invariant under g + c: solve on the complement of the constant direction.
            step = torch.linalg.lstsq(hessian, grad[:, None], rcond=None).solution[:, 0]
            step = step - step.mean()
            t = 1.0
            new_plan, new_objective = plan_and_objective(g + step, lam)
            while new_objective < objective and t > 1e-14:
                t *= 0.5
                new_plan, new_objective = plan_and_objective(g + t * step, lam)
            if (new_objective < objective or t < 1e-3) and grad.abs().sum() <= STALL_FLOOR:
                break  # no (full) ascent left: the residual is at rounding level
            g, plan, objective = g + t * step, new_plan, new_objective
        else:
            raise RuntimeError(
                f"Newton reference: ‖π^T1 − b‖₁ = {float(grad.abs().sum()):.3g} > {tol} at λ={lam}"
            )
    return plan


def entropic_value(plan: Tensor, cost: Tensor, reg: float) -> Tensor:
    """⟨π, C⟩ + λ KL(π ‖ a⊗b) for a plan with uniform marginals a, b."""
    n, m = plan.shape
    positive = plan > 0
    kl = (plan[positive] * (plan[positive] * n * m).log()).sum()
    return (plan * cost).sum() + reg * kl


def entropic_gradient(plan: Tensor, x: Tensor, y: Tensor, p: int) -> Tensor:
    """∂W_{p,λ}/∂x_i = Σ_j π_ij ∇_x c(x_i, y_j): 2(x_i − y_j) for p = 2, sign(x_i − y_j) for
    p = 1 (envelope theorem)."""
    diff = x[:, None, :].double() - y[None, :, :].double()
    return (plan[..., None] * (2.0 * diff if p == 2 else diff.sign())).sum(1)
