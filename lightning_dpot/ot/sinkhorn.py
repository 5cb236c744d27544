r"""Entropic OT between uniform point clouds, solved to a stated tolerance.

    W_{c,λ}(a, b) = min_{π ∈ Π(a, b)} ⟨π, C⟩ + λ KL(π ‖ a⊗b)
                  = max_{f, g} ⟨a, f⟩ + ⟨b, g⟩ − λ(⟨a⊗b, e^{(f⊕g−C)/λ}⟩ − 1),

``C_ij = c(x_i, y_j)``, ``a_i = 1/N``, ``b_j = 1/M``. Log-domain Sinkhorn alternates the soft
c-transforms (Feydy et al. 2019, eq. 3.186 of Feydy's thesis)

    f_i ← −ε LSE_j(log b_j + (g_j − C_ij)/ε),   g_j ← −ε LSE_i(log a_i + (f_i − C_ij)/ε).

**Schedule.** ε-scaling (annealing) from ε₀ = diameter^p down to λ in ratios ``scaling^p``
(geomloss' schedule; ``diameter`` is a public bound on the distances, never estimated from the
data), then — unlike geomloss, which stops after one sweep at ε = λ — sweeps at ε = λ until the
row-marginal violation of the plan π_ij = a_i b_j e^{(f_i + g_j − C_ij)/λ},

    err = ‖π1 − a‖₁ = Σ_i a_i |e^{(f_i − f̃_i)/λ} − 1|,   f̃ = the next f-update,

is at most ``tol``, or ``max_iter`` sweeps are spent. Every checked pair has g = T(f) at λ
(the annealing's last g-update is at λ), so the column marginal of (f, g) is exact (within
ρ/(1 − ρ) with the Taylor kernel below), also on the first sweep. :class:`SinkhornInfo` reports
which. Translation-invariant costs are computed on clouds centred on their joint bounding box.

**Value and gradient.** The loop runs without autograd. A last update with gradients,
f = T(g*) with C(x, y.detach()) and g = T(f*) with C(x.detach(), y), gives the dual value
⟨a, f⟩ + ⟨b, g⟩ and the envelope-theorem gradient ∂W/∂x_i = Σ_j π̃_ij ∇_x c(x_i, y_j), with π̃
the plan of (f, g*) whose rows sum exactly to a (geomloss' "last extrapolation").

**Backends.**

* ``tensorized``: the dense ``N × M`` cost, computed once per solve; each sweep reuses one
  preallocated ``N × M`` buffer (no fresh temporaries per iteration).
* ``online``: KeOps reductions, O(N + M) memory in any dimension, CPU and GPU.
* ``multiscale`` (d ≤ 3), one of three kernels on the points, all after annealing on the
  centroids of a grid clustering:

  - p = 2 (``taylor``): the certified Taylor cluster expansion of
    :mod:`lightning_dpot.ot.expansion`, with cells sized so that its relative error ρ at λ is at
    most ``tol``/10, wherever it needs at most N·M/4 kernel evaluations (λ wide against the
    spread of the clouds, where truncation would keep every cluster pair). The centroids'
    problem is solved to ``tol`` at λ and extrapolated to the points; the sweeps at λ then run
    through the expansion, and ρ is added to the marginal error they report (:func:`_converge`).
  - p = 1 in d ≤ 2 (``laplace-d``): the exact ℓ1 softmin of :mod:`lightning_dpot.ot.laplace`
    (quadrant dominance sums over a grid of blocks plus the pairs that share a block; plain
    torch, float64, no KeOps). The centroids' problem (cubes of side ``cluster_scale``) is
    annealed while ε > cluster_scale^p (solved to ``tol`` when λ is above it) and extrapolated
    to the points exactly; the rest of the schedule and the sweeps at λ run on the points (at
    paper scale, 2,000 × 400,000 points, λ = 1.59: 2 sweeps, 0.35–0.5 s for value and gradient
    on one CPU thread, 1.3–1.9× geomloss' multiscale ℓ1 solve, whose gradient is off by 38%).
  - otherwise: clusters of side ``cluster_scale``; the annealing runs on their centroids while
    ε > cluster_scale^p, the potentials are then extrapolated to the points and the KeOps kernel
    is truncated to the cluster pairs with f_k + g_l > C_kl − truncate·ε (Schmitzer 2016;
    geomloss' multiscale scheme); the remaining sweeps run block-sparse on the points.
* ``newton``: the fixed-budget predictor–corrector Newton path on the semi-dual of
  :mod:`lightning_dpot.ot.newton` (dense, float64, potential of the smaller cloud), then — unless
  ``fixed_budget`` — Newton steps at λ until ``tol``. Sinkhorn needs O(diameter^p/λ) sweeps and
  more; this path's work is set by the sizes and λ/diameter^p alone (1 + ⌈log₂(diameter^p/λ)⌉
  stages, one M × M Cholesky factorization per step). With ``fixed_budget`` nothing but that
  work runs and no statistic of the solve is computed (private solves).
* ``auto``: ``newton`` when the smaller cloud has at most ``NEWTON_MAX_POINTS`` = 1,024 points
  and λ ≤ ``NEWTON_MAX_RATIO``·diameter^p = 5·10⁻⁴·diameter^p, where plain sweeps take
  thousands of iterations; otherwise, on the CPU, ``multiscale`` for the ℓ1 cost in d ≤ 2 from
  10⁵ pairs (the exact kernel beats dense sweeps from 9·10⁴ pairs) and for d ≤ 3 above ``2^20``
  pairs, ``online`` when the dense solve would need more than ``dense_memory_limit`` bytes
  (1 GiB), else ``tensorized``. On
  a GPU the dense sweeps are fast (2,000 × 400,000 points, p = 2: 0.6 s on an H100), so ``auto``
  stays dense while the solve fits in half the free device memory and only then takes
  ``multiscale`` (d ≤ 3) or ``online``. Without a working KeOps it warns once and stays dense
  (an explicit ``multiscale`` whose Taylor kernel applies is plain torch and runs anyway).
  On a GPU, each KeOps kernel is first compiled and run in a child process
  (:func:`~lightning_dpot.ot.keops.keops_cuda_error`): a CUDA toolchain KeOps cannot use crashes
  that child, not the training run.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import torch
from torch import Tensor

from lightning_dpot.checks import check_positive, check_positive_int
from lightning_dpot.ot.costs import GroundCost, LpCost
from lightning_dpot.ot.expansion import (
    CHUNK_ELEMENTS,
    Grid,
    cell_ratio,
    centroid_softmin,
    expanded_softmin,
    expansion_side,
    order_for,
    remainder,
)
from lightning_dpot.ot.graphs import CapturedPotentials
from lightning_dpot.ot.keops import (
    KEOPS_MISSING,
    block_sparse_ranges,
    clusterize,
    keops_cuda_error,
    keops_import_error,
    keops_softmin,
)
from lightning_dpot.ot.laplace import LaplaceKernel, cube_means, near_pair_count
from lightning_dpot.ot.newton import (
    FINAL_STEPS,
    halving_schedule,
    refine,
    semi_dual_potential,
    semi_dual_value,
)
from lightning_dpot.ot.precision import autocast_disabled, upcast

Backend = Literal["auto", "tensorized", "newton", "online", "multiscale"]
BACKENDS = ("auto", "tensorized", "newton", "online", "multiscale")
MULTISCALE_MIN_PAIRS = 2**20
NEWTON_MAX_POINTS = 1024
NEWTON_MAX_RATIO = 5e-4
LAPLACE_MIN_PAIRS = 10**5
LAPLACE_MAX_NEAR = 0.25


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


def epsilon_schedule(diameter: float, reg: float, p: int, scaling: float) -> list[float]:
    """ε_k = diameter^p · scaling^{pk} for the k with ε_k > λ, then λ (geomloss' ε-scaling)."""
    eps0 = max(diameter**p, reg)
    steps = max(0, math.ceil(math.log(eps0 / reg) / (p * -math.log(scaling))))
    return [eps0 * scaling ** (p * k) for k in range(steps) if eps0 * scaling ** (p * k) > reg] + [
        reg
    ]


def _lse_(buf: Tensor, dim: int) -> Tensor:
    """LSE of ``buf`` along ``dim``, computed in place in ``buf`` (its contents are lost).

    Exponents below −80 are raised to −80 before ``exp``: their terms (< e^{−80} ≈ 1.8e−35 each,
    against a largest term of 1) change the sum by a relative M·e^{−80}, but as float32
    subnormals they would make ``exp`` about 10× slower on x86 CPUs (measured: 2.5 ms vs 0.2 ms
    for 400 × 400 at λ = 10⁻³·diameter²)."""
    top = buf.amax(dim, keepdim=True)
    buf.sub_(top).clamp_min_(-80.0).exp_()
    return top.squeeze(dim) + buf.sum(dim).log_()


class _DenseKernel:
    """C held densely (no autograd), one reusable ``N × M`` work buffer for the sweeps; the
    differentiable pass recomputes C(x, y.detach()) or C(x.detach(), y)."""

    name = "dense"

    def __init__(self, cost: GroundCost, x: Tensor, y: Tensor) -> None:
        self.cost, self.x, self.y = cost, x, y
        self.matrix = cost(x.detach(), y.detach())
        self.buffer = torch.empty_like(self.matrix)

    def relative_error(self, eps: float) -> float:
        return 0.0

    def softmin_x(self, eps: float, h_y: Tensor) -> Tensor:
        torch.add(h_y[None, :], self.matrix, alpha=-1.0 / eps, out=self.buffer)
        return -eps * _lse_(self.buffer, 1)

    def softmin_y(self, eps: float, h_x: Tensor) -> Tensor:
        torch.add(h_x[:, None], self.matrix, alpha=-1.0 / eps, out=self.buffer)
        return -eps * _lse_(self.buffer, 0)

    def softmin_x_grad(self, eps: float, h_y: Tensor) -> Tensor:
        return -eps * torch.logsumexp(h_y[None, :] - self.cost(self.x, self.y.detach()) / eps, 1)

    def softmin_y_grad(self, eps: float, h_x: Tensor) -> Tensor:
        return -eps * torch.logsumexp(h_x[:, None] - self.cost(self.x.detach(), self.y) / eps, 0)


class _KeOpsKernel:
    """C evaluated on the fly by KeOps, optionally restricted to kept cluster blocks. A pass
    with gradients costs the same as one without, so the convergence check is that pass."""

    def __init__(self, cost: GroundCost, x: Tensor, y: Tensor, ranges=(None, None)) -> None:
        self.cost, self.x, self.y = cost, x, y
        self.ranges_xy, self.ranges_yx = ranges
        self.name = "keops" if ranges[0] is None else "keops-truncated"

    def relative_error(self, eps: float) -> float:
        return 0.0

    def softmin_x(self, eps: float, h_y: Tensor) -> Tensor:
        return keops_softmin(self.cost, self.x.detach(), self.y.detach(), h_y, eps, self.ranges_xy)

    def softmin_y(self, eps: float, h_x: Tensor) -> Tensor:
        return keops_softmin(self.cost, self.y.detach(), self.x.detach(), h_x, eps, self.ranges_yx)

    def softmin_x_grad(self, eps: float, h_y: Tensor) -> Tensor:
        with torch.enable_grad():
            return keops_softmin(self.cost, self.x, self.y.detach(), h_y, eps, self.ranges_xy)

    def softmin_y_grad(self, eps: float, h_x: Tensor) -> Tensor:
        with torch.enable_grad():
            return keops_softmin(self.cost, self.y, self.x.detach(), h_x, eps, self.ranges_yx)


class _TaylorKernel:
    """The p = 2 softmin through the certified cluster expansion of
    :mod:`lightning_dpot.ot.expansion`, on the clouds sorted into its grid cells
    (differentiable gathers of x and y), of order :func:`~lightning_dpot.ot.expansion.order_for`
    the dimension."""

    def __init__(self, x: Tensor, y: Tensor, grid_x: Grid, grid_y: Grid) -> None:
        self.grid_x, self.grid_y = grid_x, grid_y
        self.order = order_for(x.shape[1])
        self.name = f"taylor-{self.order}"
        with torch.enable_grad():
            self.x, self.y = x[grid_x.perm], y[grid_y.perm]

    def relative_error(self, eps: float) -> float:
        """ρ: every pair's weight, hence every sum of the softmin, within this relative error."""
        return remainder(2 * self.grid_x.radius * self.grid_y.radius / eps, self.order)

    def _softmin(
        self, query: Tensor, qgrid: Grid, source: Grid, h: Tensor, eps: float, grad: bool
    ) -> Tensor:
        return expanded_softmin(query, qgrid, source, h, eps, grad, self.order)

    def softmin_x(self, eps: float, h_y: Tensor) -> Tensor:
        return self._softmin(self.x, self.grid_x, self.grid_y, h_y, eps, False)

    def softmin_y(self, eps: float, h_x: Tensor) -> Tensor:
        return self._softmin(self.y, self.grid_y, self.grid_x, h_x, eps, False)

    def softmin_x_grad(self, eps: float, h_y: Tensor) -> Tensor:
        return self._softmin(self.x, self.grid_x, self.grid_y, h_y, eps, self.x.requires_grad)

    def softmin_y_grad(self, eps: float, h_x: Tensor) -> Tensor:
        return self._softmin(self.y, self.grid_y, self.grid_x, h_x, eps, self.y.requires_grad)


def _anneal(kernel, log_a: Tensor, log_b: Tensor, f: Tensor, g: Tensor, eps_list: list[float]):
    """For each consecutive (ε, ε') of ``eps_list``: f = T_ε(g), then g = T_ε'(f). With two or
    more ε, the returned (f, g) has g = T_{ε_last}(f), the start :func:`_converge` needs."""
    for eps, eps_next in zip(eps_list, eps_list[1:], strict=False):
        f = kernel.softmin_x(eps, log_b + g / eps)
        g = kernel.softmin_y(eps_next, log_a + f / eps_next)
    return f, g


def _converge(kernel, log_a, log_b, f, g, eps: float, tol: float, max_iter: int, grad: bool):
    """Sinkhorn sweeps at ε until ‖π1 − a‖₁ ≤ tol, from a pair with g = T(f).

    With g = T(f) the columns of the plan of (f, g) sum to b; each sweep computes f̃ = T(g),
    which measures its row violation, and on success (or at ``max_iter``) returns
    ``(f̃, f, g, sweeps, error)``: (f̃, g) is the final dual pair. Otherwise it goes on from f̃
    and g = T(f̃). With ``grad`` (KeOps and Taylor kernels) f̃ carries gradients to x.

    A kernel whose sums are within a relative ρ of the exact ones (``relative_error``) computes
    e^{(f − f̃)/ε} within a factor in [1/(1 + ρ), 1/(1 − ρ)] of the exact value, so the violation
    it measures, err̂, bounds the true one by err̂ + (1 + err̂)·ρ/(1 − ρ); that bound is what is
    tested and returned. (Its columns then sum to b within the same factor.)
    """
    a = log_a.exp()
    slack = kernel.relative_error(eps)
    slack /= 1 - slack
    softmin_x = kernel.softmin_x_grad if grad else kernel.softmin_x
    for sweep in range(1, max_iter + 1):
        f_next = softmin_x(eps, log_b + g / eps)
        measured = float((a * torch.expm1((f - f_next.detach()) / eps).abs()).sum())
        error = measured + (1 + measured) * slack
        if error <= tol or sweep == max_iter:
            return f_next, f, g, sweep, error
        f = f_next.detach()
        g = kernel.softmin_y(eps, log_a + f / eps)
    raise AssertionError("unreachable: max_iter >= 1")


class EntropicSolver:
    """W_{c,λ} with the convergence contract of the module docstring.

    Args:
        cost: the ground cost (dense and KeOps forms).
        p: the exponent of the cost's scale (distances^p): sets ε₀ = diameter^p and the ratio.
        entropic_reg: λ > 0, in cost units.
        diameter: public bound on the distances, so that diameter^p ≥ max C.
        scaling: ε-scaling ratio in (0, 1); the ratio per annealing step is scaling^p.
        tol: tolerance on ‖π1 − a‖₁ at ε = λ.
        max_iter: cap on the sweeps at ε = λ.
        backend: ``auto`` | ``tensorized`` | ``newton`` | ``online`` | ``multiscale``.
        truncate: multiscale kernel truncation, in units of ε.
        cluster_scale: multiscale grid side (default diameter / (√d · 2000^{1/d}), geomloss').
        dense_memory_limit: bytes above which ``auto`` leaves the dense backend (default: 1 GiB
            on the CPU, half the free memory of a GPU).
        taylor: multiscale with the p = 2 cost: use the certified Taylor cluster expansion
            (:mod:`~lightning_dpot.ot.expansion`, cells sized for ρ ≤ tol/10 at λ) where it
            needs at most a quarter of the N·M kernel evaluations, and the truncated KeOps
            kernel otherwise (always, with ``False``).
        warn_not_converged: warn (once) when a solve misses ``tol``.
        fixed_budget: solve with ``newton``'s fixed work only and return no
            :class:`SinkhornInfo`: nothing about a solve on private records (a stopping test, an
            iteration count, a marginal error) is computed.
        cuda_graphs: on a GPU, replay the ``newton`` path as one captured CUDA graph per
            problem shape (:mod:`~lightning_dpot.ot.graphs`); no effect on the CPU.

    Raises:
        ValueError: naming the parameter: an unknown ``backend``, ``fixed_budget`` with a
            backend other than ``auto``/``newton``, ``scaling`` outside (0, 1), ``tol`` outside
            (0, 2), or an ``entropic_reg``, ``diameter``, ``max_iter``, ``truncate``,
            ``cluster_scale`` or ``dense_memory_limit`` that is not > 0. At a solve: clouds
            that are not ``(N, D)`` and ``(M, D)`` with N, M ≥ 1, or ``multiscale`` with D > 3.
        RuntimeError: at a solve, ``online`` or ``multiscale`` named explicitly without a
            working KeOps (``auto`` falls back to ``tensorized``).

    Example::

        import torch
        from lightning_dpot.ot import EntropicSolver, lp_cost

        solver = EntropicSolver(lp_cost(2), p=2, entropic_reg=0.05, diameter=1.5)
        x, y = torch.rand(200, 2), torch.rand(150, 2)  # unit square: distances ≤ √2 ≤ 1.5
        value, info = solver(x, y)  # W_{c,λ}(x, y) and the SinkhornInfo of the solve
    """

    def __init__(
        self,
        cost: GroundCost,
        p: int,
        entropic_reg: float,
        diameter: float,
        scaling: float = 0.9,
        tol: float = 1e-3,
        max_iter: int = 2000,
        backend: Backend = "auto",
        truncate: float = 10.0,
        cluster_scale: float | None = None,
        dense_memory_limit: float | None = None,
        taylor: bool = True,
        warn_not_converged: bool = True,
        fixed_budget: bool = False,
        cuda_graphs: bool = False,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if fixed_budget and backend not in ("auto", "newton"):
            raise ValueError(
                f"fixed_budget=True solves with the 'newton' backend (work set by public sizes "
                f"only); backend must be 'auto' or 'newton', got {backend!r}"
            )
        if not 0.0 < scaling < 1.0:
            raise ValueError(f"scaling must lie in (0, 1), got {scaling!r}")
        if not 0.0 < tol < 2.0:
            raise ValueError(f"tol must lie in (0, 2) (a bound on ‖π1 − a‖₁), got {tol!r}")
        self.cost, self.p = cost, p
        self.entropic_reg = check_positive("entropic_reg", entropic_reg)
        self.diameter = check_positive("diameter", diameter)
        self.scaling, self.tol = float(scaling), float(tol)
        self.max_iter = check_positive_int("max_iter", max_iter)
        self.backend = backend
        self.truncate = check_positive("truncate", truncate)
        self.cluster_scale = (
            None if cluster_scale is None else check_positive("cluster_scale", cluster_scale)
        )
        self.dense_memory_limit = (
            None
            if dense_memory_limit is None
            else check_positive("dense_memory_limit", dense_memory_limit)
        )
        self.taylor = bool(taylor)
        self.fixed_budget = bool(fixed_budget)
        self.potential = CapturedPotentials() if cuda_graphs else semi_dual_potential
        self._keops_failed = False
        self._warned_not_converged = not warn_not_converged

    # -- backend choice ---------------------------------------------------------------------
    def dense_limit(self, device: torch.device) -> float:
        """Bytes the dense solve may take on ``device`` before ``auto`` leaves it."""
        if self.dense_memory_limit is not None:
            return self.dense_memory_limit
        if device.type == "cuda":
            return torch.cuda.mem_get_info(device)[0] / 2
        return float(2**30)

    def choose_backend(
        self, n: int, m: int, dim: int, device: torch.device | str = "cpu", itemsize: int = 4
    ) -> str:
        """The backend a solve of ``n × m`` points in dimension ``dim`` on ``device`` uses."""
        if self.fixed_budget or self.backend == "newton":
            return "newton"
        if self.backend != "auto":
            return self.backend
        device = torch.device(device)
        fits_dense = 3 * n * m * itemsize <= self.dense_limit(device)
        small = min(n, m) <= NEWTON_MAX_POINTS and 8 * n * m <= self.dense_limit(device)
        if small and self.entropic_reg <= NEWTON_MAX_RATIO * self.diameter**self.p:
            return "newton"
        if device.type == "cpu" and self._laplace(dim) and n * m >= LAPLACE_MIN_PAIRS:
            return "multiscale"  # the exact ℓ1 kernel: plain torch, no KeOps needed
        if self._keops_failed or keops_import_error() is not None:
            return "tensorized"
        if device.type == "cuda" and fits_dense:
            return "tensorized"
        if dim <= 3 and n * m > MULTISCALE_MIN_PAIRS:
            return "multiscale"
        return "tensorized" if fits_dense else "online"

    # -- solve ------------------------------------------------------------------------------
    def __call__(self, x: Tensor, y: Tensor) -> tuple[Tensor, SinkhornInfo | None]:
        """W_{c,λ}(x, y) for clouds ``(N, D)``, ``(M, D)``, and the :class:`SinkhornInfo`
        (``None`` with ``fixed_budget``: no statistic of the solve is computed)."""
        return self.solve_many([(x, y)])[0]

    def solve_many(
        self, pairs: Sequence[tuple[Tensor, Tensor]]
    ) -> list[tuple[Tensor, SinkhornInfo | None]]:
        """:meth:`__call__` on each ``(x, y)`` of ``pairs``. Where every pair takes the
        ``newton`` backend with the same sizes, the potentials come from one batched path (the
        same work per problem, a fraction of the dispatch: DP-Sinkhorn's two solves a step).

        Every solve runs outside ``torch.autocast`` with bfloat16 / float16 clouds upcast to
        float32 (:mod:`lightning_dpot.ot.precision`): under ``bf16-mixed`` training the costs,
        potentials and value keep full precision, and the gradient flows back through the cast."""
        with autocast_disabled(*(t for pair in pairs for t in pair)):
            pairs = [self._prepare(upcast(x), upcast(y)) for x, y in pairs]
            backends = [
                self.choose_backend(x.shape[0], y.shape[0], x.shape[1], x.device, x.element_size())
                for x, y in pairs
            ]
            if all(backend == "newton" for backend in backends):
                return self._newton_solve(pairs)
            return [
                self._newton_solve([pair])[0]
                if backend == "newton"
                else self._dispatch(backend, *pair)
                for backend, pair in zip(backends, pairs, strict=True)
            ]

    def _prepare(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """Checks the clouds' shapes; ``y`` in ``x``'s dtype, both centred (translation-invariant
        costs)."""
        if x.dim() != 2 or y.dim() != 2 or x.shape[1] != y.shape[1]:
            raise ValueError(
                f"x and y must be (N, D) and (M, D) clouds, got {tuple(x.shape)}, {tuple(y.shape)}"
            )
        if x.shape[0] == 0 or y.shape[0] == 0:
            raise ValueError("x and y must each hold at least one point")
        y = y.to(x.dtype)
        if self.cost.translation_invariant:
            # Centre both clouds on their joint bounding box: no cost changes, but ‖x‖² + ‖y‖²
            # − 2⟨x, y⟩ (dense p = 2) and the Taylor kernel's cell centres no longer cancel in
            # float32 far from the origin (offset 500: a 5e-3 marginal error reported as 5e-5).
            with torch.no_grad():
                low = torch.minimum(x.amin(0), y.amin(0))
                origin = (low + torch.maximum(x.amax(0), y.amax(0))) / 2
            x, y = x - origin, y - origin
        return x, y

    def _dispatch(self, backend: str, x: Tensor, y: Tensor) -> tuple[Tensor, SinkhornInfo]:
        """One solve of prepared clouds on ``backend`` (not ``newton``), with the fallbacks of
        ``auto``."""
        dim = x.shape[1]
        if backend == "multiscale":
            if dim > 3:
                raise ValueError(
                    f"backend='multiscale' is for dimension d <= 3, got d = {dim}; "
                    "use 'online' (any dimension, O(N + M) memory) or 'auto'"
                )
            grids = self._taylor_grids(x, y)
            laplace = grids is None and self._laplace_applies(x, y)
            if grids is not None or laplace:  # plain torch: no KeOps kernel
                return self._solve(backend, x, y, grids, laplace)
            if self.backend == "auto" and keops_import_error() is not None:
                return self._solve("tensorized", x, y)
        if backend in ("online", "multiscale"):
            error = keops_import_error()
            if error is not None:
                raise RuntimeError(KEOPS_MISSING.format(backend=backend, err=error))
            if x.is_cuda:
                error = keops_cuda_error(self.cost, dim, x.dtype, x.device)
                if error is not None and self.backend != "auto":
                    raise RuntimeError(error)
                if error is not None:
                    self._keops_failed = True
                    warnings.warn(
                        f"EntropicSolver: {error}; backend 'auto' uses the dense 'tensorized' "
                        "backend for the rest of this run",
                        stacklevel=2,
                    )
                    return self._solve("tensorized", x, y)
            try:
                return self._solve(backend, x, y)
            except Exception as err:
                if self.backend != "auto" or isinstance(err, torch.cuda.OutOfMemoryError):
                    raise
                self._keops_failed = True
                warnings.warn(
                    f"EntropicSolver: KeOps failed ({type(err).__name__}: {err}); backend 'auto' "
                    "falls back to the dense 'tensorized' backend for the rest of this run",
                    stacklevel=2,
                )
                backend = "tensorized"
        return self._solve(backend, x, y)

    def _solve(
        self,
        backend: str,
        x: Tensor,
        y: Tensor,
        grids: tuple[Grid, Grid] | None = None,
        laplace: bool = False,
    ) -> tuple[Tensor, SinkhornInfo]:
        """One solve on ``backend``; ``grids`` (multiscale only: :meth:`_taylor_grids`) selects
        the Taylor kernel, ``laplace`` (:meth:`_laplace_applies`) the exact ℓ1 kernel of
        :meth:`_laplace_start`."""
        eps_list = epsilon_schedule(self.diameter, self.entropic_reg, self.p, self.scaling)
        eps = self.entropic_reg
        log_a = x.new_full((x.shape[0],), -math.log(x.shape[0]))
        log_b = x.new_full((y.shape[0],), -math.log(y.shape[0]))
        with torch.no_grad():
            if grids is not None:
                kernel, f, g = self._taylor_start(x, y, log_a, grids, eps_list)
            elif laplace:
                kernel, f, g = self._laplace_start(x, y, log_a, log_b, eps_list)
            elif backend == "multiscale":
                kernel, f, g = self._truncated_start(x, y, log_a, log_b, eps_list)
            else:
                kernel = (_DenseKernel if backend == "tensorized" else _KeOpsKernel)(
                    self.cost, x, y
                )
                f = torch.zeros_like(log_a)
                g = kernel.softmin_y(eps_list[0], log_a)
                f, g = _anneal(kernel, log_a, log_b, f, g, eps_list)
            keops = backend != "tensorized"
            f_final, f, g, sweeps, error = _converge(
                kernel, log_a, log_b, f, g, eps, self.tol, self.max_iter, grad=keops
            )
        # The dual pair (f_final, g), g = T(f): gradients to x through f_final = T(g), to y
        # through g (module docstring).
        if not keops:
            f_final = kernel.softmin_x_grad(eps, log_b + g / eps)
        if kernel.y.requires_grad:
            g = kernel.softmin_y_grad(eps, log_a + f / eps)
        value = (log_a.exp() * f_final).sum() + (log_b.exp() * g).sum()
        info = SinkhornInfo(
            backend=backend,
            annealing_steps=len(eps_list) - 1,
            iterations=sweeps,
            marginal_error=error,
            tolerance=self.tol,
            converged=error <= self.tol,
            kernel=kernel.name,
            kernel_error=kernel.relative_error(eps),
        )
        self._warn_if_not_converged(info)
        return value, info

    def _newton_solve(
        self, pairs: list[tuple[Tensor, Tensor]]
    ) -> list[tuple[Tensor, SinkhornInfo | None]]:
        """The ``newton`` backend (:mod:`~lightning_dpot.ot.newton`): each cost in float64, the
        potential of the smaller cloud by the fixed-budget path (one batched path where the
        sizes agree), the value by the envelope theorem; unless ``fixed_budget``, further steps
        at λ until ``tol`` (or ``max_iter``)."""
        costs = []
        for x, y in pairs:
            cost = self.cost(x, y).double()
            # The Hessian is M × M: solve for the smaller side.
            costs.append(cost.T if cost.shape[1] > cost.shape[0] else cost)
        eps0 = max(self.diameter**self.p, self.entropic_reg)
        if len(costs) > 1 and len({cost.shape for cost in costs}) == 1:
            stacked = torch.stack([cost.detach() for cost in costs])
            potentials = list(self.potential(stacked, eps0, self.entropic_reg))
        else:
            potentials = [self.potential(cost, eps0, self.entropic_reg) for cost in costs]
        out: list[tuple[Tensor, SinkhornInfo | None]] = []
        for (x, _), cost, g in zip(pairs, costs, potentials, strict=True):
            if self.fixed_budget:
                out.append((semi_dual_value(cost, g, self.entropic_reg).to(x.dtype), None))
                continue
            g, steps, error = refine(cost, g, self.entropic_reg, self.tol, self.max_iter)
            info = SinkhornInfo(
                backend="newton",
                annealing_steps=len(halving_schedule(eps0, self.entropic_reg)) - 1,
                iterations=FINAL_STEPS + steps,
                marginal_error=error,
                tolerance=self.tol,
                converged=error <= self.tol,
                kernel="dense",
                kernel_error=0.0,
            )
            self._warn_if_not_converged(info)
            out.append((semi_dual_value(cost, g, self.entropic_reg).to(x.dtype), info))
        return out

    def _warn_if_not_converged(self, info: SinkhornInfo) -> None:
        if info.converged or self._warned_not_converged:
            return
        self._warned_not_converged = True
        warnings.warn(
            f"{info.backend} solve did not reach tol={self.tol:g} in max_iter={self.max_iter} "
            f"steps at λ={self.entropic_reg:g} (‖π1 − a‖₁ = {info.marginal_error:.3g}); raise "
            "max_iter or tol, or check that diameter bounds the data. Reported once; every solve "
            "is logged",
            stacklevel=4,
        )

    # -- multiscale -------------------------------------------------------------------------
    def _scale(self, dim: int) -> float:
        if self.cluster_scale is not None:
            return self.cluster_scale
        return self.diameter / (math.sqrt(dim) * 2000 ** (1.0 / dim))

    def _taylor_start(
        self, x: Tensor, y: Tensor, log_a: Tensor, grids: tuple[Grid, Grid], eps_list
    ):
        """The Taylor kernel on the clouds' grids (:meth:`_taylor_grids`) and (f, g = T(f)) on
        the points: the centroids' problem solved to ``tol`` at λ, and the potential of the
        cloud of the smaller cubes (y on a tie) extrapolated from its centroids to the other
        cloud's points (x's f to g, then f = T(g); or y's g to f). Those centroids are of cubes
        of half the side where the problem's matrix keeps within ``CHUNK_ELEMENTS``
        (2^d·K_x·K_y): the marginal error after one sweep falls 3× (20,000 points in [−1, 1]³
        against a noisy sphere: 1.9e-4 against 6.6e-4; the gradient's error 6e-4 against
        3.4e-3)."""
        grid_x, grid_y = grids
        finer_x = grid_x.side < grid_y.side
        cloud, fine = (x.detach(), grid_x) if finer_x else (y.detach(), grid_y)
        small = 2 ** x.shape[1] * len(grid_x) * len(grid_y) <= CHUNK_ELEMENTS
        if small and Grid.fits(cloud, fine.side / 2):
            fine = Grid(cloud, fine.side / 2)
        coarse_x, coarse_y = (fine, grid_y) if finer_x else (grid_x, fine)
        log_ac, log_bc = coarse_x.weights.log(), coarse_y.weights.log()
        fc, gc = self._coarse_solve(coarse_x.means, coarse_y.means, log_ac, log_bc, eps_list)[:2]
        kernel = _TaylorKernel(x, y, grid_x, grid_y)
        eps = eps_list[-1]
        if finer_x:
            g = centroid_softmin(grid_y, coarse_x.means, log_ac + fc / eps, eps)
            f = kernel.softmin_x(eps, g / eps - math.log(y.shape[0]))
        else:
            f = centroid_softmin(grid_x, coarse_y.means, log_bc + gc / eps, eps)
        return kernel, f, kernel.softmin_y(eps, log_a + f / eps)

    def _laplace(self, dim: int) -> bool:
        """Whether the exact ℓ1 kernel is for this cost and dimension: p = 1, d ≤ 2."""
        return isinstance(self.cost, LpCost) and self.cost.p == 1 and dim <= 2

    def _laplace_applies(self, x: Tensor, y: Tensor) -> bool:
        """Whether multiscale runs the exact ℓ1 kernel on these clouds: :meth:`_laplace` and at
        most ``LAPLACE_MAX_NEAR`` of the N·M pairs near (:func:`~lightning_dpot.ot.laplace.
        near_pair_count`: ties, e.g. points on a line, make most pairs near, and its memory
        grows with them); otherwise the truncated KeOps kernel runs."""
        if not self._laplace(x.shape[1]):
            return False
        return near_pair_count(x, y) <= LAPLACE_MAX_NEAR * x.shape[0] * y.shape[0]

    def _laplace_start(self, x: Tensor, y: Tensor, log_a: Tensor, log_b: Tensor, eps_list):
        """The exact ℓ1 kernel of :mod:`~lightning_dpot.ot.laplace` on the points and
        (f, g = T(f)) at λ there: the problem of the means of the cubes of side s =
        :meth:`_scale` annealed while ε > s^p (solved to ``tol`` when λ > s^p), its g
        extrapolated to f on the points (exactly, by the same kernel from the weighted means),
        then the rest of the schedule annealed on the points."""
        scale = self._scale(x.shape[1])
        (xc, ac), (yc, bc) = cube_means(x, scale), cube_means(y, scale)
        fine_eps = [eps for eps in eps_list if eps <= scale**self.p]
        coarse_eps = eps_list[: len(eps_list) - len(fine_eps)] or eps_list[:1]
        _, gc = self._coarse_solve(xc, yc, ac.log(), bc.log(), coarse_eps)[:2]
        eps = coarse_eps[-1]
        f = LaplaceKernel(x.detach(), yc).softmin_x(eps, bc.log() + gc / eps)
        kernel = LaplaceKernel(x, y)
        g = kernel.softmin_y(eps, log_a + f / eps)
        return (kernel, *_anneal(kernel, log_a, log_b, f, g, [eps, *fine_eps]))

    def _taylor_grids(self, x: Tensor, y: Tensor) -> tuple[Grid, Grid] | None:
        """The two clouds' grids for the Taylor kernel, or ``None`` where it
        does not apply: not the p = 2 cost or ``taylor=False``; a bound ρ = tol/10 below the
        dtype's rounding (100 ulps: tol < 1.2e-4 in float32), which the bound does not cover;
        coefficients (2/λ)^{k+1} beyond a ten-thousandth of the dtype's range (float32, order 4:
        λ < 2.5e-7); more than N·M/4 kernel evaluations; more grid cubes than int64 keys tell
        apart. The cubes of the two grids differ by
        :func:`~lightning_dpot.ot.expansion.cell_ratio`.

        The clouds arrive centred (:meth:`__call__`)."""
        if not (self.taylor and isinstance(self.cost, LpCost) and self.cost.p == 2):
            return None
        rho, order, finfo = self.tol / 10, order_for(x.shape[1]), torch.finfo(x.dtype)
        if rho < 100 * finfo.eps or (2 / self.entropic_reg) ** (order + 1) > finfo.max / 1e4:
            return None
        x, y = x.detach(), y.detach()
        side = expansion_side(self.entropic_reg, x.shape[1], rho, order)
        if not (Grid.fits(x, side) and Grid.fits(y, side)):
            return None
        grid_x, grid_y = Grid(x, side), Grid(y, side)
        n, m = x.shape[0], y.shape[0]
        ratio = cell_ratio(m * len(grid_x), n * len(grid_y), x.shape[1]) ** 0.5
        if ratio != 1 and Grid.fits(x, side / ratio) and Grid.fits(y, side * ratio):
            grid_x, grid_y = Grid(x, side / ratio), Grid(y, side * ratio)
        if len(grid_x) * m + n * len(grid_y) > n * m / 4:
            return None
        return grid_x, grid_y

    def _coarse_solve(self, xc, yc, log_ac, log_bc, eps_list: list[float]):
        """Anneal the weighted centroids' problem (dense) over ``eps_list``; where the list ends
        at λ, converge to ``tol`` there. Returns the centroids' (f, g = T(f)) and kernel."""
        coarse = _DenseKernel(self.cost, xc, yc)
        fc = torch.zeros_like(log_ac)
        gc = coarse.softmin_y(eps_list[0], log_ac)
        fc, gc = _anneal(coarse, log_ac, log_bc, fc, gc, eps_list)
        if eps_list[-1] == self.entropic_reg:
            reg, tol, max_iter = self.entropic_reg, self.tol, self.max_iter
            _, fc, gc, _, _ = _converge(
                coarse, log_ac, log_bc, fc, gc, reg, tol, max_iter, grad=False
            )
        return fc, gc, coarse

    def _truncated_start(self, x, y, log_a, log_b, eps_list: list[float]):
        """Anneal on the cluster centroids while ε > cluster_scale^p (to convergence when the
        whole schedule stays above it), truncate the kernel to the cluster pairs that carry
        mass, extrapolate the potentials to the points and finish the schedule there.

        Returns the block-sparse kernel on the sorted clouds (differentiable gathers of x and
        y) and (f, g = T(f)) at λ on the points."""
        scale = self._scale(x.shape[1])
        perm_x, _, _, xc, ac, rx = clusterize(x.detach(), log_a.exp(), scale)
        perm_y, _, _, yc, bc, ry = clusterize(y.detach(), log_b.exp(), scale)
        log_ac, log_bc = ac.log(), bc.log()
        fine_eps = [eps for eps in eps_list if eps <= scale**self.p]
        coarse_eps = eps_list[: len(eps_list) - len(fine_eps)] or eps_list[:1]
        fc, gc, coarse = self._coarse_solve(xc, yc, log_ac, log_bc, coarse_eps)
        eps = coarse_eps[-1]
        keep = fc[:, None] + gc[None, :] > coarse.matrix - self.truncate * eps
        ranges = block_sparse_ranges(rx, ry, keep)
        with torch.enable_grad():
            x, y = x[perm_x], y[perm_y]
        g = keops_softmin(self.cost, y.detach(), xc, log_ac + fc / eps, eps)
        f = keops_softmin(self.cost, x.detach(), yc, log_bc + gc / eps, eps)
        kernel = _KeOpsKernel(self.cost, x, y, ranges)
        f, g = _anneal(kernel, log_a, log_b, f, g, fine_eps)
        if len(fine_eps) < 2:  # no fine sweep: g = T(f) at λ for _converge
            g = kernel.softmin_y(eps_list[-1], log_a + f / eps_list[-1])
        return kernel, f, g
