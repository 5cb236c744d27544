r"""Entropic OT of small dense problems at small λ: predictor–corrector Newton on the semi-dual,
with a fixed amount of work.

For a cost matrix C (N × M), uniform weights a = 1/N, b = 1/M and temperature ε, the semi-dual
(Cuturi & Peyré 2018) keeps the rows exact, f = T_ε(g), and maximizes over g ∈ ℝ^M

    F_ε(g) = ⟨b, g⟩ − ε Σ_i a_i LSE_j((g_j − C_ij)/ε + log b_j),
    ∇F_ε = b − π^T 1,   −ε ∇²F_ε = H = diag(π^T 1) − N π^T π,

π_ij = a_i softmax_j((g_j − C_ij)/ε). Plain Sinkhorn needs O(max C/ε) sweeps and more (18,000–
31,000 at ε = 10⁻⁵·max C on 50 × 70 clouds); Newton converges quadratically, but only inside a
basin that shrinks with ε. The solve therefore follows the path g*(ε) from ε₀ = diameter^p (a
public bound on C) down to λ by halving (ε_{k+1} = ε_k/2), with

* one **corrector** Newton step per stage (five at λ): d = ε H_r⁻¹ ∇F, with the ridge
  H_r = H + (0.1·min(1, r)² + 10⁻¹³)/M · I, r = ‖∇F‖₁ (Levenberg–Marquardt: columns that carry no
  mass and disconnected supports stay solvable, and the ridge vanishes like r², which keeps the
  quadratic rate), the step capped at ‖d‖_∞ ≤ 8ε, and the best of g + t·d, t ∈ {1, ½, ¼, ⅛},
  taken in one batched pass;
* a **predictor** between stages, the tangent of the path by the implicit-function theorem,
  H dg*/dε = Σ_i π_ij (ℓ_ij − ℓ̄_i)/N with ℓ_ij = (g_j − C_ij)/ε and ℓ̄_i = Σ_j π_ij ℓ_ij/a_i: the
  best of g + s (ε_{k+1} − ε_k) dg*/dε, s ∈ {0, ½, 1}. Without it each halving starts at a
  marginal error of about 0.3, outside Newton's basin.

The work — 1 + ⌈log₂(ε₀/λ)⌉ stages, one Cholesky factorization per step — is a function of
(N, M, ε₀, λ) only (problems of equal sizes run as one batch, B × the arithmetic for one
problem's dispatch): no stopping test runs on the data, so a solve on private records reveals
nothing through its iteration count (the residual r that sizes the ridge never leaves the solve;
a factorization that fails, never seen outside non-finite input, takes a diagonal step instead,
chosen on the device). Nor does the solve read any value back to the host: on a GPU it runs
without a synchronization, and its fixed sequence of kernels can be captured once and replayed
(``lightning_dpot.ot.graphs``). Measured (``benchmarks/stress_newton.py``) on 4,160 random
and adversarial 50 × (1…80) problems of DP-Sinkhorn's cost (duplicates, ties, corner points,
outliers, disjoint classes) at λ/ε₀ = 10⁻³…10⁻⁶: no ‖π^T 1 − b‖₁ above 1.4·10⁻⁴ against a
tolerance of 10⁻³ (docs/performance.md). The schedule must start at or above the true cost
scale: ε₀ from the declared data bounds, never estimated from the data, and every point inside
them. The solve runs in float64 (at λ = 0.05, g/λ ≈ 10⁴, beyond float32's resolution).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from lightning_dpot.ot.loop import SinkhornInfo, Target

CORRECTOR_STEPS = (1.0, 0.5, 0.25, 0.125)
PREDICTOR_STEPS = (0.0, 0.5, 1.0)
FINAL_STEPS = 5
STEP_CAP = 8.0
RIDGE = 0.1
BATCH_ELEMENTS = 2**18  # largest n·m·candidates buffer of one pass per problem (2 MB, float64)


@functools.cache
def _candidate_steps(dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """The corrector's and the predictor's step lengths as tensors on ``device``, made once: a
    tensor built from host data is a copy to the device, which waits for it."""
    return (
        torch.tensor(CORRECTOR_STEPS, dtype=dtype, device=device),
        torch.tensor(PREDICTOR_STEPS, dtype=dtype, device=device),
    )


def halving_schedule(eps0: float, reg: float) -> list[float]:
    """ε_k = ε₀·2^{−k} while above λ, then λ: 1 + ⌈log₂(ε₀/λ)⌉ values (just λ if ε₀ ≤ λ)."""
    out, eps = [], float(eps0)
    while eps > reg * (1 + 1e-12):
        out.append(eps)
        eps *= 0.5
    return out + [float(reg)]


def _objective(cost: Tensor, candidates: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """F_ε at ``candidates`` (B, T, M) for ``cost`` (B, N, M): (F (B, T), the row-shifted
    exponentials e^{z − max z} (B, T, N, M), their row sums)."""
    n, m = cost.shape[-2:]
    z = (candidates[:, :, None, :] - cost[:, None]).div_(eps)
    top = z.amax(-1, keepdim=True)
    z.sub_(top).exp_()
    sums = z.sum(-1, keepdim=True)
    objective = candidates.sum(-1) / m - eps * (top + sums.log()).squeeze(-1).sum(-1) / n
    return objective, z, sums


def _best(cost: Tensor, g: Tensor, d: Tensor, steps: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """argmax_t F_ε(g + t d) over ``steps`` for each problem of the batch (``cost`` (B, N, M),
    ``g`` and ``d`` (B, M)): (g + t*·d, the row softmax N·π of that potential). The candidates
    are evaluated together where T·N·M ≤ ``BATCH_ELEMENTS``; otherwise in chunks, and the
    softmax is recomputed once at the winner (memory stays at one N × M buffer per problem)."""
    batch, n, m = cost.shape
    rows = torch.arange(batch, device=cost.device)
    # Chunks sized per problem: a problem solved in a batch makes the same choices, bit for bit,
    # as solved alone.
    chunks = steps.split(max(1, BATCH_ELEMENTS // (n * m)))
    if len(chunks) == 1:
        candidates = g[:, None, :] + steps[None, :, None] * d[:, None, :]
        objective, z, sums = _objective(cost, candidates, eps)
        k = objective.argmax(1)
        return candidates[rows, k], z[rows, k].div_(sums[rows, k])
    candidates = (g[:, None, :] + c[None, :, None] * d[:, None, :] for c in chunks)
    objective = torch.cat([_objective(cost, c, eps)[0] for c in candidates], 1)
    best = g + steps[objective.argmax(1)][:, None] * d
    return best, torch.softmax((best[:, None, :] - cost) / eps, -1)


def _solve_spd(h: Tensor, rhs: Tensor) -> Tensor:
    """H⁻¹ rhs by batched Cholesky (``h`` (B, M, M), ``rhs`` (B, M)), with no host
    synchronization: a problem whose factorization fails (H not positive definite in floating
    point, seen only for non-finite input) takes the Jacobi direction rhs / diag(H) instead,
    chosen on the device (diag(H) ≥ ridge/M > 0)."""
    factor, info = torch.linalg.cholesky_ex(h)
    # Two triangular solves (L Lᵀ x = rhs): ``cholesky_solve`` checks an error code on the host.
    half = torch.linalg.solve_triangular(factor, rhs[..., None], upper=False)
    solution = torch.linalg.solve_triangular(factor.mT, half, upper=True)[..., 0]
    jacobi = rhs / h.diagonal(dim1=-2, dim2=-1)
    return torch.where((info == 0)[:, None], solution, jacobi)


def _hessian(softmax: Tensor, mass: Tensor, ridge: Tensor) -> Tensor:
    """H = diag(π^T 1) − N π^T π + ridge·I per problem, with ``softmax`` = N π (rows sum to 1)
    and ``ridge`` (B,)."""
    n, m = softmax.shape[-2:]
    h = (softmax.mT @ softmax).mul_(-1.0 / n)
    h.diagonal(dim1=-2, dim2=-1).add_(mass + ridge[:, None] / m)
    return h


def _residual(softmax: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Column mass π^T 1, the semi-dual gradient b − π^T 1 and its ℓ1 norm r, per problem."""
    n, m = softmax.shape[-2:]
    mass = softmax.sum(-2) / n
    grad = 1.0 / m - mass
    return mass, grad, grad.abs().sum(-1)


def _correct(cost: Tensor, g: Tensor, softmax: Tensor, eps: float, steps: Tensor):
    """One corrector step at ε (module docstring): ridge 0.1·min(1, r)²/M, step capped at 8ε in
    ∞-norm, the best of ``steps``. Returns (g, softmax) after the step."""
    mass, grad, r = _residual(softmax)
    # H is singular along constants (g + c has the same value): the ridge makes it definite,
    # and shrinks like r² so that near the solution the step is Newton's and converges fast.
    ridge = RIDGE * r.clamp(max=1.0) ** 2 + 1e-13
    d = _solve_spd(_hessian(softmax, mass, ridge), eps * grad)
    # Far from the solution the quadratic model is poor: cap the step at 8ε in ∞-norm.
    d.mul_((STEP_CAP * eps / d.abs().amax(-1, keepdim=True)).clamp_(max=1.0))
    return _best(cost, g, d, steps, eps)


def semi_dual_potential(cost: Tensor, eps0: float, reg: float) -> Tensor:
    """g ≈ argmax F_λ (module docstring) for a dense ``cost`` (N, M), or a batch of them
    (B, N, M) solved together, by the fixed-budget predictor–corrector path from ε₀ to λ;
    float64, no autograd. Column potentials only: the rows follow exactly as f = T_λ(g)."""
    with torch.no_grad():
        single = cost.dim() == 2
        cost = cost.detach().to(torch.float64).contiguous()
        if single:
            cost = cost[None]
        n, m = cost.shape[-2:]
        corrector, predictor = _candidate_steps(cost.dtype, cost.device)
        schedule = halving_schedule(eps0, reg)
        g = cost.new_zeros(cost.shape[0], m)
        softmax = torch.softmax(-cost / schedule[0], -1)
        for stage, eps in enumerate(schedule):
            last = stage == len(schedule) - 1
            for _ in range(FINAL_STEPS if last else 1):
                g, softmax = _correct(cost, g, softmax, eps, corrector)
            if last:
                break
            eps_next = schedule[stage + 1]
            logits = (g[:, None, :] - cost) / eps
            centred = logits - (softmax * logits).sum(-1, keepdim=True)
            mass, _, r = _residual(softmax)
            tangent = _solve_spd(
                _hessian(softmax, mass, 1e-6 * r + 1e-13), (softmax * centred).sum(-2) / n
            )
            g, softmax = _best(cost, g, (eps_next - eps) * tangent, predictor, eps_next)
        return g[0] if single else g


def column_violation(cost: Tensor, g: Tensor, reg: float) -> Tensor:
    """‖π^T 1 − b‖₁ of the plan with rows f = T_λ(g) (exact row marginals), per problem: the
    solve's error, for non-private diagnostics only."""
    with torch.no_grad():
        return _residual(torch.softmax((g[..., None, :] - cost.to(g.dtype)) / reg, -1))[2]


def semi_dual_value(cost: Tensor, g: Tensor, reg: float) -> Tensor:
    """W = ⟨a, T_λ(g)⟩ + ⟨b, g⟩ at a fixed (detached) g, per problem: by the envelope theorem its
    gradient in the points is that of W_{c,λ} at the optimum, ∂W/∂x_i = Σ_j π_ij ∇_x c(x_i, y_j)
    (and the same for y), through ``cost``'s autograd graph."""
    m = cost.shape[-1]
    g = g.to(cost.dtype)
    f = -reg * torch.logsumexp((g[..., None, :] - cost) / reg - math.log(m), dim=-1)
    return f.mean(-1) + g.mean(-1)


def refine(
    cost: Tensor, g: Tensor, reg: float, tol: float, max_steps: int
) -> tuple[Tensor, int, float]:
    """Corrector steps at λ on one problem (``cost`` (N, M)) until ‖π^T 1 − b‖₁ ≤ ``tol`` or
    ``max_steps``: a data-dependent number of steps, for non-private solves only. Returns g,
    the steps taken and the final ‖π^T 1 − b‖₁."""
    with torch.no_grad():
        cost = cost.detach().to(torch.float64)[None]
        corrector = _candidate_steps(cost.dtype, cost.device)[0]
        g = g[None]
        softmax = torch.softmax((g[:, None, :] - cost) / reg, -1)
        for step in range(max_steps):
            error = float(_residual(softmax)[2])
            if error <= tol:
                return g[0], step, error
            g, softmax = _correct(cost, g, softmax, reg, corrector)
        return g[0], max_steps, float(_residual(softmax)[2])


def solve_costs(
    costs: Sequence[Tensor],
    eps0: float,
    target: Target,
    fixed_budget: bool,
    potential: Callable[[Tensor, float, float], Tensor] = semi_dual_potential,
) -> list[tuple[Tensor, SinkhornInfo | None]]:
    """The ``newton`` backend on float64 cost matrices (autograd graphs to the points): each
    problem's potential on its smaller side by the fixed-budget path (one batched path where
    the shapes agree), its value by the envelope theorem (``semi_dual_value``); unless
    ``fixed_budget``, further steps at λ until ``tol`` (or ``max_iter``) and a
    ``SinkhornInfo`` (``None`` with ``fixed_budget``)."""
    # The Hessian is M × M: solve for the smaller side.
    costs = [cost.T if cost.shape[1] > cost.shape[0] else cost for cost in costs]
    if len(costs) > 1 and len({cost.shape for cost in costs}) == 1:
        stacked = torch.stack([cost.detach() for cost in costs])
        potentials = list(potential(stacked, eps0, target.reg))
    else:
        potentials = [potential(cost, eps0, target.reg) for cost in costs]
    out: list[tuple[Tensor, SinkhornInfo | None]] = []
    for cost, g in zip(costs, potentials, strict=True):
        if fixed_budget:
            out.append((semi_dual_value(cost, g, target.reg), None))
            continue
        g, steps, error = refine(cost, g, target.reg, target.tol, target.max_iter)
        info = SinkhornInfo(
            backend="newton",
            annealing_steps=len(halving_schedule(eps0, target.reg)) - 1,
            iterations=FINAL_STEPS + steps,
            marginal_error=error,
            tolerance=target.tol,
            converged=error <= target.tol,
            kernel="dense",
            kernel_error=0.0,
        )
        out.append((semi_dual_value(cost, g, target.reg), info))
    return out
