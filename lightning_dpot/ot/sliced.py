"""Sliced and Gaussian-smoothed sliced Wasserstein distances (the DP sliced-Wasserstein flow that
follows them: ``lightning_dpot.ot.sliced_flow``).

Notation (Sebag et al. 2023, §2.2 and §4). Records and particles are rows of ``x ∈ R^{n×d}``; the
``N_θ`` directions are the rows of ``theta ∈ R^{N_θ×d}``, each on the unit sphere S^{d-1}.
The projection of ``x`` on ``θ_j`` is ``⟨x, θ_j⟩``; all directions are handled at once as the
matrix ``x θᵀ ∈ R^{n×N_θ}`` (column ``j`` = the 1-D sample along ``θ_j``). Nothing here loops over
directions in Python; every function works on any device and floating dtype. The projections,
the flow's drift and the DP loss leave ``torch.autocast`` and upcast bfloat16 / float16 inputs
to float32 (``lightning_dpot.ot.precision``): under ``bf16-mixed`` training they still
run in full precision.

* Sliced Wasserstein (eq. 7): ``SW_p^p(μ, ν) = ∫_{S^{d-1}} W_p^p(θ#μ, θ#ν) dθ``, estimated with
  the given directions as ``(1/N_θ) Σ_j W_p^p(θ_j#μ, θ_j#ν)``. In 1-D,
  ``W_p^p(μ, ν) = ∫_0^1 |F_μ^{-1}(u) − F_ν^{-1}(u)|^p du`` (eq. 6), exact for empirical measures.
* Gaussian-smoothed sliced Wasserstein (eq. 11, Rakotomamonjy & Ralaivola 2021):
  ``G_σSW_p^p(μ, ν) = ∫ W_p^p(θ#μ * N(0, σ²), θ#ν * N(0, σ²)) dθ``; empirically, each projected
  sample receives its own N(0, σ²) draw. ``σ`` is in the units of the data (a standard deviation,
  not a variance). The private release of the data is exactly such noisy projections,
  ``XΘᵀ + Z`` (eq. 23; see ``lightning_dpot.methods.dpsw.sensitivity``).

Empirical quantile functions and CDFs use the linear interpolation of ``torch.quantile``
(``interpolation="linear"``): the i-th smallest of n values (0-based) sits at level ``i/(n−1)``,
and both functions interpolate linearly between these knots, so each is the other's inverse on
the range of the sample.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_dpot.checks import (
    check_nonnegative,
    check_positive_int,
)
from lightning_dpot.ot.precision import full_precision
from lightning_dpot.rng import NoiseSource, standard_normal

__all__ = [
    "dp_sliced_wasserstein_loss",
    "empirical_cdf",
    "empirical_quantile",
    "gaussian_smoothed_sliced_wasserstein",
    "noisy_projections",
    "project",
    "random_directions",
    "sliced_wasserstein",
    "wasserstein_1d_cost",
]


def random_directions(
    num_directions: int,
    dim: int,
    generator: torch.Generator | None = None,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """``N_θ`` i.i.d. directions uniform on the unit sphere S^{d-1}, as the rows of a tensor.

    ``θ = g / ‖g‖₂`` with ``g ~ N(0, I_d)`` (rotation invariance of the Gaussian).

    Args:
        num_directions: ``N_θ ≥ 1``.
        dim: the data dimension ``d ≥ 1``.
        generator: the random stream; its device is used when ``device`` is not given.
        device, dtype: of the result (default: the generator's device, the default dtype).

    Returns:
        ``(N_θ, d)`` tensor whose rows have unit ℓ2 norm.
    """
    num_directions = check_positive_int("num_directions", num_directions)
    dim = check_positive_int("dim", dim)
    if device is None and generator is not None:
        device = generator.device
    g = torch.randn(num_directions, dim, generator=generator, device=device, dtype=dtype)
    return g / torch.linalg.vector_norm(g, dim=1, keepdim=True)


def check_matrix(name: str, x: Tensor) -> None:
    if x.dim() != 2:
        raise ValueError(
            f"{name} must be a 2-D tensor (rows = samples), got shape {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise ValueError(f"{name} must have a floating dtype, got {x.dtype}")


@full_precision
def project(x: Tensor, theta: Tensor) -> Tensor:
    """Projections ``⟨x_i, θ_j⟩`` of every row of ``x`` on every direction: ``x θᵀ``.

    Args:
        x: ``(n, d)`` samples.
        theta: ``(N_θ, d)`` directions (unit rows, e.g. from ``random_directions``).

    Returns:
        ``(n, N_θ)``; column ``j`` is the sample projected on ``θ_j`` (``P^{θ_j}_# μ``).
    """
    check_matrix("x", x)
    check_matrix("theta", theta)
    if x.shape[1] != theta.shape[1]:
        raise ValueError(
            f"x has dimension {x.shape[1]} but theta has dimension {theta.shape[1]}; "
            "they must match"
        )
    return x @ theta.transpose(0, 1)


def standard_normal_like(t: Tensor, generator: NoiseSource | None) -> Tensor:
    return standard_normal(tuple(t.shape), generator, device=t.device, dtype=t.dtype)


def noisy_projections(
    x: Tensor,
    theta: Tensor,
    noise_scale: float,
    generator: NoiseSource | None = None,
) -> Tensor:
    """Gaussian-smoothed projections ``x θᵀ + σ Z`` with ``Z`` i.i.d. N(0, 1) (eq. 23's form).

    Each entry gets its own draw, so column ``j`` is a sample of ``θ_j#μ * N(0, σ²)``. This is the
    plain operation on public quantities (e.g. the particles); the private release of data, which
    checks the norm bound its sensitivity needs, is
    ``lightning_dpot.methods.dpsw.sensitivity.gaussian_sliced_release``.

    Args:
        x: ``(n, d)`` samples.
        theta: ``(N_θ, d)`` directions.
        noise_scale: the standard deviation ``σ ≥ 0``; ``σ = 0`` returns the plain projections
            and draws nothing from ``generator``.
        generator: the random stream of ``Z`` (on ``x``'s device).

    Returns:
        ``(n, N_θ)``.
    """
    noise_scale = check_nonnegative("noise_scale", noise_scale)
    proj = project(x, theta)
    if noise_scale == 0.0:
        return proj
    return proj + noise_scale * standard_normal_like(proj, generator)


def empirical_quantile(sorted_values: Tensor, levels: Tensor) -> Tensor:
    """Linearly interpolated empirical quantile function ``F^{-1}``, batched over rows.

    For a row ``s_0 ≤ … ≤ s_{n−1}`` and a level ``u ∈ [0, 1]``, with ``r = u (n − 1)``,
    ``F^{-1}(u) = s_⌊r⌋ + (r − ⌊r⌋)(s_{⌊r⌋+1} − s_⌊r⌋)`` — the convention of
    ``torch.quantile(..., interpolation="linear")``. Levels outside [0, 1] are clamped. This form
    (rather than ``torch.quantile`` itself) takes a different set of levels in every row, which the
    flow needs; it is differentiable in ``sorted_values``.

    Args:
        sorted_values: ``(B, n)``, each row sorted ascending (``n ≥ 1``).
        levels: ``(B, m)`` levels in [0, 1], row ``b`` queried against row ``b``.

    Returns:
        ``(B, m)`` quantiles.
    """
    if sorted_values.dim() != 2 or levels.dim() != 2 or sorted_values.shape[0] != levels.shape[0]:
        raise ValueError(
            "sorted_values and levels must be 2-D with the same number of rows, got shapes "
            f"{tuple(sorted_values.shape)} and {tuple(levels.shape)}"
        )
    n = sorted_values.shape[1]
    if n == 0:
        raise ValueError("sorted_values must hold at least one value per row, got 0")
    if n == 1:
        return sorted_values.expand(-1, levels.shape[1])
    position = levels.clamp(0.0, 1.0) * (n - 1)
    lower = position.floor().long().clamp_(max=n - 2)
    frac = (position - lower.to(position.dtype)).to(sorted_values.dtype)
    below = torch.gather(sorted_values, 1, lower)
    above = torch.gather(sorted_values, 1, lower + 1)
    return below + frac * (above - below)


def empirical_cdf(sorted_values: Tensor, points: Tensor) -> Tensor:
    """Linearly interpolated empirical CDF ``F``, the inverse of ``empirical_quantile``.

    For a row ``s_0 ≤ … ≤ s_{n−1}`` (``n ≥ 2``), ``F`` is the piecewise-linear function through
    the knots ``(s_i, i/(n−1))``: ``F(z) = 0`` for ``z < s_0``, ``1`` for ``z ≥ s_{n−1}``, and for
    ``s_{k−1} ≤ z < s_k``, ``F(z) = (k − 1 + (z − s_{k−1})/(s_k − s_{k−1}))/(n − 1)``, with ``k``
    found by ``torch.searchsorted(..., right=True)``. Then ``F^{-1}(F(z)) = z`` on
    ``[s_0, s_{n−1}]``. At tied values ``F`` jumps; it returns the level of the last tie.

    Args:
        sorted_values: ``(B, n)``, each row sorted ascending, ``n ≥ 2``.
        points: ``(B, m)``, row ``b`` evaluated against row ``b``.

    Returns:
        ``(B, m)`` levels in [0, 1].
    """
    if sorted_values.dim() != 2 or points.dim() != 2 or sorted_values.shape[0] != points.shape[0]:
        raise ValueError(
            "sorted_values and points must be 2-D with the same number of rows, got shapes "
            f"{tuple(sorted_values.shape)} and {tuple(points.shape)}"
        )
    n = sorted_values.shape[1]
    if n < 2:
        raise ValueError(f"the empirical CDF needs at least 2 values per row, got {n}")
    sorted_values = sorted_values.contiguous()
    points = points.to(sorted_values.dtype).contiguous()
    count = torch.searchsorted(sorted_values, points, right=True)  # #{i : s_i ≤ z} ∈ [0, n]
    k = count.clamp(1, n - 1)
    left = torch.gather(sorted_values, 1, k - 1)
    right = torch.gather(sorted_values, 1, k)
    frac = ((points - left) / (right - left)).clamp(0.0, 1.0)
    levels = ((k - 1).to(points.dtype) + frac) / (n - 1)
    levels = torch.where(count == 0, torch.zeros_like(levels), levels)
    return torch.where(count == n, torch.ones_like(levels), levels)


def _check_p(p: float) -> float:
    p = float(p)
    if not math.isfinite(p) or p < 1.0:
        raise ValueError(f"p must be a finite number >= 1, got {p!r}")
    return p


def wasserstein_1d_cost(x_proj: Tensor, y_proj: Tensor, p: float = 2.0) -> Tensor:
    """Exact 1-D optimal transport cost ``W_p^p`` between uniform empirical measures, per column.

    Column ``j`` of ``x_proj`` (``n`` values) and of ``y_proj`` (``m`` values) are two 1-D
    samples with weights ``1/n`` and ``1/m``. The monotone (sorted) coupling is optimal in 1-D, so
    ``W_p^p = ∫_0^1 |F_x^{-1}(u) − F_y^{-1}(u)|^p du`` (eq. 6) with the step quantile functions
    ``F_x^{-1}(u) = x_(⌈un⌉)``. For ``n = m`` this is ``(1/n) Σ_i |x_(i) − y_(i)|^p``; otherwise
    the integral is a finite sum over the merged breakpoints ``{i/n} ∪ {k/m}``, computed on the
    integer grid ``1/(nm)`` so that coinciding breakpoints are exact. Cost ``O((n + m) log)``
    per direction; differentiable in both inputs (through the sort).

    Args:
        x_proj: ``(n, N_θ)``.
        y_proj: ``(m, N_θ)``.
        p: the ground-cost exponent, ``p ≥ 1``.

    Returns:
        ``(N_θ,)`` tensor of ``W_p^p`` (the cost, not its ``1/p`` root).
    """
    p = _check_p(p)
    check_matrix("x_proj", x_proj)
    check_matrix("y_proj", y_proj)
    if x_proj.shape[1] != y_proj.shape[1]:
        raise ValueError(
            f"x_proj has {x_proj.shape[1]} directions but y_proj has {y_proj.shape[1]}; "
            "they must match"
        )
    n, m = x_proj.shape[0], y_proj.shape[0]
    if n == 0 or m == 0:
        raise ValueError(f"both samples must be non-empty, got sizes {n} and {m}")
    xs = torch.sort(x_proj, dim=0).values
    ys = torch.sort(y_proj, dim=0).values
    if n == m:
        return (xs - ys).abs().pow(p).mean(dim=0)
    device = x_proj.device
    grid = torch.cat(
        [
            torch.arange(1, n + 1, device=device, dtype=torch.int64) * m,
            torch.arange(1, m + 1, device=device, dtype=torch.int64) * n,
        ]
    )
    upper = torch.sort(grid).values  # breakpoints u·nm; interval (previous, upper]
    widths = torch.diff(upper, prepend=upper.new_zeros(1)).to(xs.dtype) / (n * m)
    x_index = torch.div(upper - 1, m, rounding_mode="floor")  # ⌈u n⌉ − 1
    y_index = torch.div(upper - 1, n, rounding_mode="floor")  # ⌈u m⌉ − 1
    gaps = (xs.index_select(0, x_index) - ys.index_select(0, y_index)).abs().pow(p)
    return (widths.unsqueeze(1) * gaps).sum(dim=0)


def sliced_wasserstein(x: Tensor, y: Tensor, theta: Tensor, p: float = 2.0) -> Tensor:
    """Monte Carlo sliced Wasserstein distance ``SW_p`` on the given directions (eq. 7).

    ``SW_p(x, y) = ((1/N_θ) Σ_j W_p^p(θ_j#x, θ_j#y))^{1/p}``, each 1-D term computed exactly by
    ``wasserstein_1d_cost`` (sorting; quantile functions for unequal sizes).

    Args:
        x: ``(n, d)``, y: ``(m, d)`` samples (uniform weights).
        theta: ``(N_θ, d)`` unit directions.
        p: exponent ``≥ 1``.

    Returns:
        0-d tensor ``SW_p`` (in the units of the data).
    """
    p = _check_p(p)
    cost = wasserstein_1d_cost(project(x, theta), project(y, theta), p=p)
    return cost.mean().pow(1.0 / p)


def gaussian_smoothed_sliced_wasserstein(
    x: Tensor,
    y: Tensor,
    theta: Tensor,
    noise_scale: float,
    generator: torch.Generator | None = None,
    p: float = 2.0,
) -> Tensor:
    """Empirical Gaussian-smoothed sliced Wasserstein distance ``G_σSW_p`` (eq. 11).

    ``G_σSW_p(x, y) = ((1/N_θ) Σ_j W_p^p(θ_j#x * N(0, σ²), θ_j#y * N(0, σ²)))^{1/p}``, with both
    smoothed measures represented by one noisy copy of every projected sample (independent draws
    for ``x`` then ``y`` from ``generator``). With ``σ = 0`` it is ``sliced_wasserstein``.

    Returns:
        0-d tensor.
    """
    p = _check_p(p)
    x_noisy = noisy_projections(x, theta, noise_scale, generator)
    y_noisy = noisy_projections(y, theta, noise_scale, generator)
    return wasserstein_1d_cost(x_noisy, y_noisy, p=p).mean().pow(1.0 / p)


@full_precision
def dp_sliced_wasserstein_loss(
    generated: Tensor,
    target_projections_noisy: Tensor,
    theta: Tensor,
    noise_scale: float,
    generator: torch.Generator | None = None,
    p: float = 2.0,
) -> Tensor:
    """DP sliced-Wasserstein loss of the DPSWgen baseline (Rakotomamonjy & Ralaivola 2021).

    ``L(G) = (1/N_θ) Σ_j W_p^p(θ_j#G * N(0, σ²), ν̃_j)``, where ``ν̃_j`` is column ``j`` of the
    private release ``Y Θᵀ + Z_Y`` (eq. 23) and the generated samples' projections receive the
    same noise level, ``G Θᵀ + σ Z_G`` (fresh ``Z_G`` from ``generator``), so that both sides are
    smoothed alike and the loss estimates ``G_σSW_p^p`` (eq. 11). Returned as the ``p``-th power
    (smooth at 0, unlike its root); differentiable in ``generated``. Only the release touches the
    data, so the loss is post-processing of it.

    Args:
        generated: ``(n, d)`` generator output (requires grad).
        target_projections_noisy: ``(m, N_θ)`` the released noisy target projections.
        theta: ``(N_θ, d)`` the directions used for the release.
        noise_scale: ``σ ≥ 0`` of the release.
        generator: random stream of the generated side's noise.
        p: exponent ``≥ 1``.

    Returns:
        0-d tensor, ``G_σSW_p^p`` estimate.
    """
    p = _check_p(p)
    check_matrix("target_projections_noisy", target_projections_noisy)
    if target_projections_noisy.shape[1] != theta.shape[0]:
        raise ValueError(
            f"target_projections_noisy has {target_projections_noisy.shape[1]} columns but theta "
            f"has {theta.shape[0]} directions; they must match"
        )
    generated_noisy = noisy_projections(generated, theta, noise_scale, generator)
    return wasserstein_1d_cost(generated_noisy, target_projections_noisy, p=p).mean()
