"""KeOps kernels for the O(N + M)-memory Sinkhorn backends: ``online`` and the truncated
``multiscale`` kernel.

KeOps (``pykeops``, the engine geomloss builds on) evaluates reductions such as

    LSE_j(h_j − C(x_i, y_j)/ε)

without ever storing the ``N × M`` matrix, on the CPU and the GPU, with autograd. Each formula
is compiled by the system C++ compiler (and CUDA on a GPU) on first use, about 5–15 s per
formula, dtype and dimension, and cached on disk (``pykeops.get_build_folder()``); later runs
load the compiled module at once.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import signal
import subprocess
import sys
from functools import lru_cache

import torch
from torch import Tensor

from lightning_dpot.ot.costs import GroundCost
from lightning_dpot.ot.dense import coarse_solve
from lightning_dpot.ot.loop import Target, anneal, coarse_then_fine

log = logging.getLogger(__name__)

KEOPS_MISSING = (
    "the '{backend}' backend needs KeOps: `pip install pykeops` (a dependency of lightning_dpot) "
    "and a working C++ compiler (g++ or clang; on a GPU also the CUDA headers). KeOps said: {err}"
)


@lru_cache(maxsize=1)
def keops_import_error() -> str | None:
    """``None`` when pykeops imports, else the reason it does not.

    pykeops prints its setup notices to stdout on import ("[KeOps] Warning : CUDA libraries
    not found or could not be loaded; Switching to CPU only", "cuda was detected, but driver
    API could not be initialized", …). They go to this module's debug log instead: stdout is
    kept for the commands' JSON, and the backends check the device themselves
    (``keops_cuda_error``)."""
    notices = io.StringIO()
    try:
        with contextlib.redirect_stdout(notices):
            import pykeops  # noqa: F401
            from pykeops.torch import generic_logsumexp  # noqa: F401
    except Exception as err:  # ImportError, or a broken build environment
        return f"{type(err).__name__}: {err}"
    finally:
        if notices.getvalue().strip():
            log.debug("pykeops on import: %s", notices.getvalue().strip())
    return None


_PROBE = """
import json, sys
import torch
from lightning_dpot.ot.keops import _probe_kernel
formula, params, dim, dtype, device = sys.argv[1:]
_probe_kernel(formula, json.loads(params), int(dim), getattr(torch, dtype), device)
"""


def keops_cuda_error(
    cost: GroundCost, dim: int, dtype: torch.dtype, device: torch.device | str
) -> str | None:
    """``None`` when the cost's Sinkhorn kernel (forward and gradient) compiles and runs under
    KeOps on ``device``, else the reason, found in a child process.

    KeOps' CUDA JIT can kill the process that calls it: with a toolkit it does not support
    (seen: KeOps 2.3, CUDA 13.0, an H100) its ``nvrtc`` compile step segfaults, which no
    ``except`` catches. The child takes the crash and the caller gets a message; the kernels a
    healthy child compiles land in KeOps' disk cache, so the caller then loads them at once.
    Checked once per (formula, dimension, dtype, device) and process.
    """
    params = json.dumps(dict(sorted(cost.keops_params.items())))
    return _child_error(cost.keops_formula, params, dim, str(dtype).split(".")[-1], str(device))


@lru_cache(maxsize=64)
def _child_error(formula: str, params: str, dim: int, dtype: str, device: str) -> str | None:
    log.info("KeOps: compiling and checking the kernel for %s on %s (child)", formula, device)
    args = [sys.executable, "-c", _PROBE, formula, params, str(dim), dtype, device]
    try:
        child = subprocess.run(args, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return f"KeOps' kernel for {formula!r} did not compile within 900 s on {device}"
    if child.returncode == 0:
        return None
    if child.returncode < 0:
        how = f"was killed by {signal.Signals(-child.returncode).name}"
    else:
        lines = [line for line in child.stderr.splitlines() if line.strip()]
        how = f"failed: {lines[-1] if lines else f'exit status {child.returncode}'}"
    return f"KeOps' kernel for {formula!r} on {device} {how} when compiled in a child process"


def _probe_kernel(
    formula: str, params: dict[str, float], dim: int, dtype: torch.dtype, device: str
) -> None:
    """Run the Sinkhorn kernel of ``formula`` forward and backward on a few points."""
    cost = GroundCost()
    cost.keops_formula, cost.keops_params = formula, params
    x, y = (torch.rand(n, dim, dtype=dtype, device=device, requires_grad=True) for n in (5, 7))
    h = torch.zeros(7, dtype=dtype, device=device, requires_grad=True)
    keops_softmin(cost, x, y, h, 0.5).sum().backward()
    if not all(torch.isfinite(t.grad).all() for t in (x, y, h)):
        raise RuntimeError("non-finite gradient")


@lru_cache(maxsize=64)
def _lse_routine(formula: str, params: tuple[str, ...], dim: int):
    from pykeops.torch import generic_logsumexp

    log.info(
        "KeOps: compiling the Sinkhorn kernel for %s in dimension %d on first use "
        "(once per formula, dtype and dimension; cached on disk)",
        formula,
        dim,
    )
    return generic_logsumexp(
        f"(B - P * ({formula}))",
        "A = Vi(1)",
        f"X = Vi({dim})",
        f"Y = Vj({dim})",
        "B = Vj(1)",
        "P = Pm(1)",
        *(f"{name} = Pm(1)" for name in params),
    )


def keops_softmin(
    cost: GroundCost,
    x: Tensor,
    y: Tensor,
    h: Tensor,
    eps: float,
    ranges: tuple | None = None,
) -> Tensor:
    """f_i = −ε LSE_j(h_j − C(x_i, y_j)/ε) for ``x`` (N, D), ``y`` (M, D), ``h`` (M,).

    ``ranges`` restricts the reduction to the kept blocks of a block-sparse (clustered) kernel
    (KeOps' ``ranges`` argument). Differentiable in ``x``, ``y`` and ``h``.
    """
    names = tuple(cost.keops_params)
    routine = _lse_routine(cost.keops_formula, names, x.shape[1])
    scalars = [x.new_tensor([1.0 / eps])] + [x.new_tensor([cost.keops_params[n]]) for n in names]
    out = routine(x, y, h.reshape(-1, 1), *scalars, ranges=ranges)
    return -eps * out.reshape(-1)


def clusterize(x: Tensor, weights: Tensor, scale: float):
    """Voxel-grid clustering of a weighted cloud (KeOps' ``grid_cluster``): cubes of side
    ``scale``; returns ``(perm, x_sorted, w_sorted, centroids, cluster_weights, ranges)`` with
    the points sorted so that each cluster is contiguous (``ranges[k] = [start, end)``)."""
    from pykeops.torch.cluster import cluster_ranges_centroids, grid_cluster

    labels = grid_cluster(x, scale)
    ranges, centroids, cluster_weights = cluster_ranges_centroids(x, labels, weights=weights)
    _, perm = torch.sort(labels.view(-1))
    return perm, x[perm], weights[perm], centroids, cluster_weights, ranges


def block_sparse_ranges(ranges_x: Tensor, ranges_y: Tensor, keep: Tensor) -> tuple[tuple, tuple]:
    """KeOps ranges of the kept cluster pairs ``keep`` (Kx, Ky), for the reduction over j and
    for the transposed reduction over i."""
    from pykeops.torch.cluster import from_matrix, swap_axes

    ranges_xy = from_matrix(ranges_x, ranges_y, keep)
    return ranges_xy, swap_axes(ranges_xy)


class KeOpsKernel:
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


def truncated_start(
    cost: GroundCost,
    x: Tensor,
    y: Tensor,
    log_a: Tensor,
    log_b: Tensor,
    eps_list: list[float],
    p: int,
    scale: float,
    truncate: float,
    target: Target,
) -> tuple[KeOpsKernel, Tensor, Tensor]:
    """The truncated multiscale kernel (Schmitzer 2016; geomloss' multiscale scheme) and
    (f, g = T(f)) at λ on the points.

    Anneal on the means of cubes of side ``scale`` while ε > scale^p (to convergence when the
    whole schedule stays above it), keep the cluster pairs with f_k + g_l > C_kl − truncate·ε,
    extrapolate the potentials to the points and finish the schedule there, block-sparse on
    the sorted clouds (differentiable gathers of x and y)."""
    perm_x, _, _, xc, ac, rx = clusterize(x.detach(), log_a.exp(), scale)
    perm_y, _, _, yc, bc, ry = clusterize(y.detach(), log_b.exp(), scale)
    log_ac, log_bc = ac.log(), bc.log()
    coarse_eps, fine_eps = coarse_then_fine(eps_list, scale, p)
    fc, gc, coarse = coarse_solve(cost, xc, yc, log_ac, log_bc, coarse_eps, target)
    eps = coarse_eps[-1]
    keep = fc[:, None] + gc[None, :] > coarse.matrix - truncate * eps
    ranges = block_sparse_ranges(rx, ry, keep)
    with torch.enable_grad():
        x, y = x[perm_x], y[perm_y]
    g = keops_softmin(cost, y.detach(), xc, log_ac + fc / eps, eps)
    f = keops_softmin(cost, x.detach(), yc, log_bc + gc / eps, eps)
    kernel = KeOpsKernel(cost, x, y, ranges)
    f, g = anneal(kernel, log_a, log_b, f, g, fine_eps)
    if len(fine_eps) < 2:  # no sweep on the points: g = T(f) at λ, as converge needs
        g = kernel.softmin_y(eps_list[-1], log_a + f / eps_list[-1])
    return kernel, f, g
