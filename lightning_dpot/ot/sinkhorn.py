r"""Entropic OT between uniform point clouds, solved to a stated tolerance.

    W_{c,λ}(a, b) = min_{π ∈ Π(a, b)} ⟨π, C⟩ + λ KL(π ‖ a⊗b)
                  = max_{f, g} ⟨a, f⟩ + ⟨b, g⟩ − λ(⟨a⊗b, e^{(f⊕g−C)/λ}⟩ − 1),

``C_ij = c(x_i, y_j)``, ``a_i = 1/N``, ``b_j = 1/M``. ``EntropicSolver`` anneals ε from
diameter^p down to λ and then — unlike geomloss, which stops after one sweep at ε = λ — sweeps
at λ until the row-marginal violation ‖π1 − a‖₁ is at most ``tol`` or ``max_iter`` sweeps are
spent (``lightning_dpot.ot.loop``, the one Sinkhorn loop, over a declared
``SoftminKernel``). Every checked pair has g = T(f) at λ, so the
column marginal of (f, g) is exact (within ρ/(1 − ρ) with the Taylor kernel), also on the first
sweep; ``SinkhornInfo`` reports which. Translation-invariant costs are computed on clouds
centred on their joint bounding box.

**Value and gradient.** The loop runs without autograd. A last update with gradients,
f = T(g*) with C(x, y.detach()) and g = T(f*) with C(x.detach(), y), gives the dual value
⟨a, f⟩ + ⟨b, g⟩ and the envelope-theorem gradient ∂W/∂x_i = Σ_j π̃_ij ∇_x c(x_i, y_j), with π̃
the plan of (f, g*) whose rows sum exactly to a (geomloss' "last extrapolation").

**Backends**, each a kernel module with its own start:

* ``tensorized`` (``lightning_dpot.ot.dense``): the dense ``N × M`` cost, computed once per
  solve, and one reusable ``N × M`` buffer for the sweeps.
* ``online`` (``lightning_dpot.ot.keops``): KeOps reductions, O(N + M) memory in any
  dimension, CPU and GPU.
* ``multiscale`` (d ≤ 3), after annealing on the means of a grid clustering, one of three
  kernels on the points: for p = 2 where the kernel is wide, the certified Taylor cluster
  expansion (``lightning_dpot.ot.taylor``, relative error ρ ≤ ``tol``/10 at λ, added to the
  reported marginal error); for the ℓ1 cost in d ≤ 2, the exact kernel of
  ``lightning_dpot.ot.laplace`` (plain torch, float64); otherwise the KeOps kernel
  truncated to the cluster pairs that carry mass (Schmitzer 2016; geomloss' multiscale scheme).
* ``newton`` (``lightning_dpot.ot.newton``): the fixed-budget predictor–corrector Newton
  path on the semi-dual (dense, float64, potential of the smaller cloud), then — unless
  ``fixed_budget`` — Newton steps at λ until ``tol``. Its work is set by the sizes and
  λ/diameter^p alone; with ``fixed_budget`` nothing but that work runs and no statistic of the
  solve is computed (private solves).
* ``auto``: the rule of ``lightning_dpot.ot.backend``. Without a working KeOps it warns once
  and stays dense (an explicit ``multiscale`` whose Taylor or ℓ1 kernel applies is plain torch
  and runs anyway). On a GPU each KeOps kernel is first compiled and run in a child process
  (``keops_cuda_error``): a CUDA toolchain KeOps cannot use crashes
  that child, not the training run.

Measured speed and accuracy of every backend: docs/performance.md.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

from lightning_dpot.checks import check_positive, check_positive_int
from lightning_dpot.ot.backend import BACKENDS, Backend, Problem, auto_backend
from lightning_dpot.ot.costs import GroundCost, LpCost
from lightning_dpot.ot.dense import DenseKernel
from lightning_dpot.ot.expansion import Grid
from lightning_dpot.ot.graphs import CapturedPotentials
from lightning_dpot.ot.keops import (
    KEOPS_MISSING,
    KeOpsKernel,
    keops_cuda_error,
    keops_import_error,
    truncated_start,
)
from lightning_dpot.ot.laplace import is_l1_kernel_cost, laplace_applies, laplace_start
from lightning_dpot.ot.loop import (
    SinkhornInfo,
    SoftminKernel,
    Target,
    cold_start,
    converge,
    epsilon_schedule,
)
from lightning_dpot.ot.newton import semi_dual_potential, solve_costs
from lightning_dpot.ot.precision import autocast_disabled, upcast
from lightning_dpot.ot.taylor import taylor_grids, taylor_start

__all__ = ["BACKENDS", "Backend", "EntropicSolver", "SinkhornInfo", "epsilon_schedule"]


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
            (``lightning_dpot.ot.expansion``, cells sized for ρ ≤ tol/10 at λ) where it
            needs at most a quarter of the N·M kernel evaluations, and the truncated KeOps
            kernel otherwise (always, with ``False``).
        warn_not_converged: warn (once) when a solve misses ``tol``.
        fixed_budget: solve with ``newton``'s fixed work only and return no
            ``SinkhornInfo``: nothing about a solve on private records (a stopping test, an
            iteration count, a marginal error) is computed.
        cuda_graphs: on a GPU, replay the ``newton`` path as one captured CUDA graph per
            problem shape (``lightning_dpot.ot.graphs``); no effect on the CPU.

    Raises:
        ValueError: naming the parameter: an unknown ``backend``, ``fixed_budget`` with a
            backend other than ``auto``/``newton``, ``scaling`` outside (0, 1), ``tol`` outside
            (0, 2), or an ``entropic_reg``, ``diameter``, ``max_iter``, ``truncate``,
            ``cluster_scale`` or ``dense_memory_limit`` that is not > 0. At a solve: clouds
            that are not ``(N, D)`` and ``(M, D)`` with N, M ≥ 1, or ``multiscale`` with D > 3.
        RuntimeError: at a solve, ``online`` or ``multiscale`` named explicitly without a
            working KeOps (``auto`` falls back to ``tensorized``).

    Example::

        >>> import torch
        >>> from lightning_dpot.ot import EntropicSolver, lp_cost
        >>> _ = torch.manual_seed(0)
        >>> solver = EntropicSolver(lp_cost(2), p=2, entropic_reg=0.05, diameter=1.5)
        >>> x, y = torch.rand(200, 2), torch.rand(150, 2)  # unit square: distances ≤ √2 ≤ 1.5
        >>> value, info = solver(x, y)  # W_{c,λ}(x, y) and the SinkhornInfo of the solve
        >>> info.backend, info.converged, info.marginal_error <= 1e-3
        ('tensorized', True, True)
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

    @property
    def target(self) -> Target:
        """Where a solve stops, read from the current ``entropic_reg``, ``tol``, ``max_iter``."""
        return Target(self.entropic_reg, self.tol, self.max_iter)

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
        return auto_backend(
            Problem(n, m, dim, itemsize, device.type),
            self.entropic_reg,
            self.diameter**self.p,
            self.dense_limit(device),
            is_l1_kernel_cost(self.cost, dim),
            lambda: not self._keops_failed and keops_import_error() is None,
        )

    # -- solve ------------------------------------------------------------------------------
    def __call__(self, x: Tensor, y: Tensor) -> tuple[Tensor, SinkhornInfo | None]:
        """W_{c,λ}(x, y) for clouds ``(N, D)``, ``(M, D)``, and the ``SinkhornInfo``
        (``None`` with ``fixed_budget``: no statistic of the solve is computed)."""
        return self.solve_many([(x, y)])[0]

    def solve_many(
        self, pairs: Sequence[tuple[Tensor, Tensor]]
    ) -> list[tuple[Tensor, SinkhornInfo | None]]:
        """``__call__`` on each ``(x, y)`` of ``pairs``. Where every pair takes the
        ``newton`` backend with the same sizes, the potentials come from one batched path (the
        same work per problem, a fraction of the dispatch: DP-Sinkhorn's two solves a step).

        Every solve runs outside ``torch.autocast`` with bfloat16 / float16 clouds upcast to
        float32 (``lightning_dpot.ot.precision``): under ``bf16-mixed`` training the costs,
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
            multiscale = self._multiscale_kernel(x, y)
            if multiscale[0] != "truncated":  # plain torch: no KeOps kernel
                return self._solve(backend, x, y, multiscale)
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
                    return self._fall_back_to_dense(error, x, y)
            truncated = ("truncated", None) if backend == "multiscale" else None
            try:
                return self._solve(backend, x, y, truncated)
            except Exception as err:
                if self.backend != "auto" or isinstance(err, torch.cuda.OutOfMemoryError):
                    raise
                return self._fall_back_to_dense(f"KeOps failed ({type(err).__name__}: {err})", x, y)
        return self._solve(backend, x, y)

    def _fall_back_to_dense(self, why: str, x: Tensor, y: Tensor) -> tuple[Tensor, SinkhornInfo]:
        """``auto`` after a KeOps failure: dense for this solve and the rest of the run."""
        self._keops_failed = True
        warnings.warn(
            f"EntropicSolver: {why}; backend 'auto' uses the dense 'tensorized' backend for the "
            "rest of this run",
            stacklevel=3,
        )
        return self._solve("tensorized", x, y)

    def _multiscale_kernel(self, x: Tensor, y: Tensor) -> tuple[str, tuple[Grid, Grid] | None]:
        """The kernel ``multiscale`` runs on these clouds: ``taylor`` with its grids
        (``taylor_grids``), ``laplace``
        (``laplace_applies``) or the KeOps ``truncated``."""
        grids = self._taylor_grids(x, y)
        if grids is not None:
            return "taylor", grids
        return ("laplace" if laplace_applies(self.cost, x, y) else "truncated"), None

    def _taylor_grids(self, x: Tensor, y: Tensor) -> tuple[Grid, Grid] | None:
        """The Taylor kernel's grids, or ``None``: not the p = 2 cost, ``taylor=False``, or
        ``taylor_grids`` says it does not apply."""
        if not (self.taylor and isinstance(self.cost, LpCost) and self.cost.p == 2):
            return None
        return taylor_grids(x, y, self.entropic_reg, self.tol)

    def _start(
        self,
        backend: str,
        multiscale: tuple[str, tuple[Grid, Grid] | None] | None,
        x: Tensor,
        y: Tensor,
        log_a: Tensor,
        log_b: Tensor,
        eps_list: list[float],
    ) -> tuple[SoftminKernel, Tensor, Tensor]:
        """The kernel of ``backend`` (of ``multiscale``: ``_multiscale_kernel``) on these
        clouds and its (f, g = T(f)) at λ."""
        if multiscale is None:
            kernel = (DenseKernel if backend == "tensorized" else KeOpsKernel)(self.cost, x, y)
            return (kernel, *cold_start(kernel, log_a, log_b, eps_list))
        name, grids = multiscale
        if grids is not None:
            return taylor_start(self.cost, x, y, log_a, grids, eps_list, self.target)
        scale, target = self._scale(x.shape[1]), self.target
        if name == "laplace":
            return laplace_start(self.cost, x, y, log_a, log_b, eps_list, self.p, scale, target)
        return truncated_start(
            self.cost, x, y, log_a, log_b, eps_list, self.p, scale, self.truncate, target
        )

    def _solve(
        self,
        backend: str,
        x: Tensor,
        y: Tensor,
        multiscale: tuple[str, tuple[Grid, Grid] | None] | None = None,
    ) -> tuple[Tensor, SinkhornInfo]:
        """One solve on ``backend`` (not ``newton``; ``multiscale``: its kernel): start,
        converge, the envelope pass."""
        eps_list = epsilon_schedule(self.diameter, self.entropic_reg, self.p, self.scaling)
        eps = self.entropic_reg
        log_a = x.new_full((x.shape[0],), -math.log(x.shape[0]))
        log_b = x.new_full((y.shape[0],), -math.log(y.shape[0]))
        # The KeOps kernels' differentiable pass costs what a plain one does: the convergence
        # check is that pass. The others recompute it once at the end.
        grad_in_loop = backend != "tensorized"
        with torch.no_grad():
            kernel, f, g = self._start(backend, multiscale, x, y, log_a, log_b, eps_list)
            f_final, f, g, sweeps, error = converge(
                kernel, log_a, log_b, f, g, self.target, grad=grad_in_loop
            )
        # The dual pair (f_final, g), g = T(f): gradients to x through f_final = T(g), to y
        # through g (module docstring).
        if not grad_in_loop:
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
        """The ``newton`` backend (``solve_costs``) on each pair's
        float64 cost; values back in the clouds' dtype."""
        costs = [self.cost(x, y).double() for x, y in pairs]
        eps0 = max(self.diameter**self.p, self.entropic_reg)
        solved = solve_costs(costs, eps0, self.target, self.fixed_budget, self.potential)
        out: list[tuple[Tensor, SinkhornInfo | None]] = []
        for (x, _), (value, info) in zip(pairs, solved, strict=True):
            if info is not None:
                self._warn_if_not_converged(info)
            out.append((value.to(x.dtype), info))
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

    def _scale(self, dim: int) -> float:
        """The multiscale cluster side: ``cluster_scale``, or diameter / (√d · 2000^{1/d})
        (geomloss')."""
        if self.cluster_scale is not None:
            return self.cluster_scale
        return self.diameter / (math.sqrt(dim) * 2000 ** (1.0 / dim))
