"""Exact 2-Wasserstein distance between generated and raw samples, on subsamples.

Reshetova et al. 2024, §IV-C report W₂(P_G(Z), P_X) where the target P_X is approximated by the
empirical distribution of the *non-privatized* data (train, and held-out "test" in §IV-D),
computed on mini-batches of size 200 with images flattened to 28² = 784-dimensional vectors.

For two uniform empirical measures with the same number of atoms,
μ = (1/n) Σᵢ δ_{xᵢ} and ν = (1/n) Σⱼ δ_{yⱼ}, the optimal transport plan is a permutation
(Birkhoff–von Neumann: the extreme points of the transport polytope with uniform marginals are
the permutation matrices /n), so the exact OT problem is the linear assignment problem

    W₂(μ, ν)² = min_{π ∈ Sₙ} (1/n) Σᵢ ‖xᵢ − y_{π(i)}‖²₂ ,

solved here exactly with ``scipy.optimize.linear_sum_assignment`` (Jonker–Volgenant).
No entropic regularization is involved: this is the unregularized W₂ used as an evaluation
metric, not the training loss.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import cdist
from torch import Tensor

from lightning_dpot.checks import check_positive_int

__all__ = ["w2_distance", "subsampled_w2"]

ArrayLike = Tensor | np.ndarray


def _as_matrix(name: str, value: ArrayLike) -> np.ndarray:
    """``(n, *shape)`` samples → ``(n, d)`` float64 matrix (each sample flattened)."""
    if isinstance(value, Tensor):
        value = value.detach().to("cpu", torch.float64).numpy()
    array = np.asarray(value, dtype=np.float64)
    if array.ndim < 1 or array.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one sample (n ≥ 1), got shape {array.shape}")
    matrix = array.reshape(array.shape[0], -1)
    if not np.isfinite(matrix).all():
        raise ValueError(f"{name} must contain only finite values")
    return matrix


def w2_distance(x: ArrayLike, y: ArrayLike, squared: bool = False) -> float:
    """Exact W₂ between the uniform empirical measures on ``x`` and ``y`` (same size n).

    W₂(μ_x, μ_y) = ( min_{π ∈ Sₙ} (1/n) Σᵢ ‖xᵢ − y_{π(i)}‖²₂ )^{1/2}, solved as a linear
    assignment problem (exact OT for uniform equal-size sets, see the module docstring).

    Args:
        x: ``(n, *shape)`` samples; each is flattened to a vector in R^d.
        y: ``(n, *shape)`` samples with the same n and d.
        squared: return W₂² instead of W₂.

    Returns:
        W₂ (or W₂²) in the units of the inputs, e.g. pixel values in [−1, 1] for images.
    """
    x_mat, y_mat = _as_matrix("x", x), _as_matrix("y", y)
    if x_mat.shape[0] != y_mat.shape[0]:
        raise ValueError(
            f"x and y must have the same number of samples for exact OT by assignment, "
            f"got {x_mat.shape[0]} and {y_mat.shape[0]}"
        )
    if x_mat.shape[1] != y_mat.shape[1]:
        raise ValueError(
            f"x and y must have the same dimension d, got {x_mat.shape[1]} and {y_mat.shape[1]}"
        )
    # Differences are formed explicitly (not ‖x‖² + ‖y‖² − 2⟨x, y⟩) so identical points cost 0.
    cost = cdist(x_mat, y_mat, metric="sqeuclidean")
    rows, cols = linear_sum_assignment(cost)
    w2_squared = float(cost[rows, cols].mean())
    return w2_squared if squared else math.sqrt(w2_squared)


def subsampled_w2(
    x: ArrayLike,
    y: ArrayLike,
    subsample: int = 200,
    repeats: int = 10,
    generator: torch.Generator | None = None,
) -> tuple[float, float]:
    """Mean and standard error of exact W₂ over random equal-size subsamples
    (Reshetova et al. 2024, §IV-C).

    For r = 1..R, draw index sets I_r ⊂ {1..n_x} and J_r ⊂ {1..n_y} of size m = ``subsample``
    uniformly without replacement (independently for x and y) and compute
    w_r = W₂(μ_{x[I_r]}, μ_{y[J_r]}) exactly (``w2_distance``). Returns

        mean = (1/R) Σ_r w_r,   stderr = s / √R,  s² = (1/(R−1)) Σ_r (w_r − mean)².

    The mini-batch estimate is biased upwards relative to W₂ between the full sets (it also
    includes the sampling error of two m-point empirical measures, which decays like m^{-1/d}
    in general); compare values only at the same ``subsample``. The paper uses m = 200.

    Args:
        x: generated samples ``(n_x, *shape)``.
        y: raw (non-privatized) samples ``(n_y, *shape)``, train or held-out split.
        subsample: m, the subsample size, 1 ≤ m ≤ min(n_x, n_y).
        repeats: R ≥ 1 independent subsample pairs; with R = 1 the standard error is ``nan``.
        generator: ``torch.Generator`` for the subsample draws (reproducibility without
            touching global seeds); ``None`` uses a fresh unseeded generator.

    Returns:
        ``(mean, stderr)`` of W₂ over the repeats.
    """
    subsample = check_positive_int("subsample", subsample)
    repeats = check_positive_int("repeats", repeats)
    x_mat, y_mat = _as_matrix("x", x), _as_matrix("y", y)
    largest = min(x_mat.shape[0], y_mat.shape[0])
    if subsample > largest:
        raise ValueError(
            f"subsample must lie in [1, min(len(x), len(y))] = [1, {largest}], got {subsample}"
        )
    if generator is None:
        generator = torch.Generator()
        generator.seed()
    values = np.empty(repeats)
    for r in range(repeats):
        rows_x = torch.randperm(x_mat.shape[0], generator=generator)[:subsample].numpy()
        rows_y = torch.randperm(y_mat.shape[0], generator=generator)[:subsample].numpy()
        values[r] = w2_distance(x_mat[rows_x], y_mat[rows_y])
    mean = float(values.mean())
    stderr = float(values.std(ddof=1) / math.sqrt(repeats)) if repeats > 1 else math.nan
    return mean, stderr
