"""KeOps kernels for the O(N + M)-memory Sinkhorn backends.

KeOps (``pykeops``, the engine geomloss builds on) evaluates reductions such as

    LSE_j(h_j − C(x_i, y_j)/ε)

without ever storing the ``N × M`` matrix, on the CPU and the GPU, with autograd. Each formula
is compiled by the system C++ compiler (and CUDA on a GPU) on first use, about 5–15 s per
formula, dtype and dimension, and cached on disk (``pykeops.get_build_folder()``); later runs
load the compiled module at once.
"""

from __future__ import annotations

import logging
from functools import lru_cache

import torch
from torch import Tensor

from lightning_dpot.ot.costs import GroundCost

log = logging.getLogger(__name__)

KEOPS_MISSING = (
    "the '{backend}' backend needs KeOps: `pip install pykeops` (a dependency of lightning_dpot) "
    "and a working C++ compiler (g++ or clang; on a GPU also the CUDA headers). KeOps said: {err}"
)


@lru_cache(maxsize=1)
def keops_import_error() -> str | None:
    """``None`` when pykeops imports, else the reason it does not."""
    try:
        import pykeops  # noqa: F401
        from pykeops.torch import generic_logsumexp  # noqa: F401
    except Exception as err:  # ImportError, or a broken build environment
        return f"{type(err).__name__}: {err}"
    return None


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
