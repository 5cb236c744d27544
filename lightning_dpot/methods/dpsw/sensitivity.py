"""Sensitivity and release of random projections ``X ↦ XΘᵀ`` (Sebag et al. 2023, §4.3,
Lemma 1).

The DP sliced-Wasserstein flow touches the private data only through the release (eq. 23)

    M(X) = X Θᵀ + Z,   Z ∈ R^{n×N_θ} i.i.d. N(0, σ²),

with ``Θ ∈ R^{N_θ×d}`` of ``N_θ`` directions drawn uniformly on S^{d-1}, independently of the
data (this module writes directions as rows; the paper's ``Θ`` is ``d × N_θ``, the same matrix
transposed). Records are ℓ2-normalised, ``‖x_i‖₂ ≤ 1`` (latents on the unit sphere; see
docs/dpswflow.md), so two datasets that differ in one record (replace-one) differ by a row
``x − x'`` with ``‖x − x'‖₂ ≤ 2``.

**The bound w (Lemma 1, Rakotomamonjy & Ralaivola 2021).** For a fixed unit vector ``u`` and
``θ`` uniform on S^{d-1}, ``⟨θ, u⟩² ~ Beta(1/2, (d−1)/2)``: values in [0, 1], mean ``1/d``,
variance ``2(d−1)/(d²(d+2))``. So ``S(u) = ‖uΘᵀ‖₂² = Σ_j ⟨θ_j, u⟩²`` is a sum of ``N_θ``
i.i.d. such terms, mean ``N_θ/d``, variance ``2N_θ(d−1)/(d²(d+2))``, and always ``S ≤ N_θ``.
``w(N_θ, δ_s)`` is an upper (1 − δ_s)-quantile bound: ``P_Θ(S(u) > w) ≤ δ_s`` for every fixed
unit ``u``. Then, with probability ≥ 1 − δ_s over Θ,

    ‖XΘᵀ − X'Θᵀ‖_F = ‖x − x'‖₂ · ‖uΘᵀ‖₂ ≤ 2·sqrt(w(N_θ, δ_s))   (u = (x − x')/‖x − x'‖),

the ℓ2 sensitivity used to calibrate the Gaussian mechanism (the factor 2 is paper §5.2's
"additional factor of 2" from normalisation). Forms of ``w``:

* ``"bernstein"`` — eq. (25), Bernstein's inequality for [0, 1]-valued terms:
  ``w = N_θ/d + (2/3) ln(2/δ_s) + (2/d) sqrt(N_θ (d−1)/(d+2) ln(2/δ_s))``. A rigorous bound
  (the ``2/δ_s`` is the printed, two-sided form; one side would need ``1/δ_s``). Loose.
* ``"clt"`` — eq. (26), the normal approximation the paper uses in practice (``N_θ > 30``):
  ``w = N_θ/d + (z_{1−δ_s}/d) sqrt(2N_θ(d−1)/(d+2))``, ``z_{1−δ_s} = Φ^{-1}(1 − δ_s)``.
  **Not a bound**: the sum of Beta terms is right-skewed, so its true tail beyond this ``w``
  exceeds ``δ_s``. Monte Carlo (4·10⁵ draws, ``N_θ = 70``, ``d = 8``): ``P(S > w)`` ≈ 1.4·δ_s at
  δ_s = 10⁻², 2.2·δ_s at 10⁻³, 3.6·δ_s at 10⁻⁴, and the gap grows as δ_s shrinks.
* ``"chernoff"`` — not in the paper: Chernoff's bound with the exact moment generating function
  of the Beta term, ``E e^{t⟨θ,u⟩²} = ₁F₁(1/2; d/2; t)`` (Kummer's function), so
  ``w = min_{t>0} (N_θ ln ₁F₁(1/2; d/2; t) + ln(1/δ_s)) / t``. Rigorous (any ``t`` gives a valid
  bound; the minimisation only tightens it) and within about 10 % of the true quantile at the
  paper's settings.
* ``"auto"`` — Sebag et al. 2023, §4.3: ``"clt"`` when ``N_θ > 30``, else ``"bernstein"``.

Every form is capped at ``N_θ`` (``S ≤ N_θ`` surely); for ``d = 1``, ``S = N_θ`` exactly.

**δ_s and the reported δ.** The bound fails on an event of probability ≤ δ_s over the draw of
Θ for a *fixed* pair of records. With Θ drawn from a public seed the adversary may pick the pair
knowing Θ, so the package does not rely on it:
``SlicedGaussianRelease`` checks
``‖Θ‖²_op ≤ w`` on every draw, the sensitivity then holds surely, and δ carries no δ_s term
(the paper reports ``δ + k·δ_s``, a union bound over ``k`` draws).

The accountant sees the release as a Gaussian mechanism with noise multiplier
``σ / sensitivity`` (``sliced_noise_multiplier``). The sensitivity here is for replace-one
neighbouring datasets, as in the paper.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from scipy import optimize, special, stats
from torch import Tensor

from lightning_dpot.checks import (
    check_delta,
    check_nonnegative,
    check_positive,
    check_positive_int,
    check_unit_ball,
)
from lightning_dpot.ot.sliced import noisy_projections
from lightning_dpot.rng import NoiseSource

WBound = Literal["auto", "bernstein", "clt", "chernoff"]
W_BOUNDS: tuple[str, ...] = ("auto", "bernstein", "clt", "chernoff")
CLT_MIN_DIRECTIONS = 30  # Sebag et al. 2023, §4.3: the CLT form for N_θ > 30

__all__ = [
    "CLT_MIN_DIRECTIONS",
    "W_BOUNDS",
    "WBound",
    "check_release_inputs",
    "gaussian_sliced_release",
    "projection_bound_w",
    "sliced_noise_multiplier",
    "sliced_sensitivity",
    "sliced_sigma",
]


def _w_bernstein(num_directions: int, dim: int, delta_s: float) -> float:
    log_term = math.log(2.0 / delta_s)
    return (
        num_directions / dim
        + (2.0 / 3.0) * log_term
        + (2.0 / dim) * math.sqrt(num_directions * (dim - 1) / (dim + 2) * log_term)
    )


def _w_clt(num_directions: int, dim: int, delta_s: float) -> float:
    z = float(stats.norm.isf(delta_s))  # Φ^{-1}(1 − δ_s), accurate for small δ_s
    return num_directions / dim + (z / dim) * math.sqrt(
        2.0 * num_directions * (dim - 1) / (dim + 2)
    )


def _w_chernoff(num_directions: int, dim: int, delta_s: float) -> float:
    log_inv_delta = math.log(1.0 / delta_s)

    def bound(log_t: float) -> float:
        t = math.exp(log_t)
        mgf = float(special.hyp1f1(0.5, dim / 2.0, t))  # ≤ e^t, finite for t ≤ 700
        if not math.isfinite(mgf) or mgf <= 0.0:
            return math.inf
        return (num_directions * math.log(mgf) + log_inv_delta) / t

    # Every t > 0 gives a valid bound; a grid then a bounded refinement finds a tight one.
    log_grid = np.linspace(math.log(1e-3), math.log(700.0), 161)
    values = [bound(s) for s in log_grid]
    best = int(np.argmin(values))
    lo, hi = log_grid[max(best - 1, 0)], log_grid[min(best + 1, len(log_grid) - 1)]
    refined = optimize.minimize_scalar(bound, bounds=(lo, hi), method="bounded")
    return min(values[best], float(refined.fun))


def projection_bound_w(
    num_directions: int, dim: int, delta_s: float, method: WBound = "auto"
) -> float:
    """``w(N_θ, δ_s)``: ``P_Θ(‖uΘᵀ‖₂² > w) ≤ δ_s`` for a fixed unit ``u`` (eqs. 24–26).

    See the module docstring for the distribution of ``‖uΘᵀ‖₂²`` and the four forms.

    Args:
        num_directions: ``N_θ ≥ 1``.
        dim: data dimension ``d ≥ 1``.
        delta_s: failure probability ``δ_s ∈ (0, 1)`` for a fixed direction.
        method: ``"auto"`` (eq. 26 if ``N_θ > 30``, else eq. 25), ``"bernstein"`` (eq. 25),
            ``"clt"`` (eq. 26, an approximation, not a bound) or ``"chernoff"`` (rigorous, tight).

    Returns:
        ``w``, capped at ``N_θ``.
    """
    num_directions = check_positive_int("num_directions", num_directions)
    dim = check_positive_int("dim", dim)
    delta_s = check_delta("delta_s", delta_s)
    if method not in W_BOUNDS:
        raise ValueError(f"method must be one of {W_BOUNDS}, got {method!r}")
    if method == "auto":
        method = "clt" if num_directions > CLT_MIN_DIRECTIONS else "bernstein"
    if dim == 1:
        return float(num_directions)  # θ = ±1: ‖uΘᵀ‖² = N_θ exactly
    if method == "bernstein":
        w = _w_bernstein(num_directions, dim, delta_s)
    elif method == "clt":
        w = _w_clt(num_directions, dim, delta_s)
    else:
        w = _w_chernoff(num_directions, dim, delta_s)
    return min(w, float(num_directions))


def sliced_sensitivity(
    num_directions: int, dim: int, delta_s: float, method: WBound = "auto"
) -> float:
    """ℓ2 (Frobenius) sensitivity of ``X ↦ XΘᵀ`` for records with ``‖x‖₂ ≤ 1``.

    ``Δ = 2·sqrt(w(N_θ, δ_s))`` (Lemma 1 with ``‖x − x'‖₂ ≤ 2``, paper §5.2), valid with
    probability ≥ 1 − δ_s over Θ for a fixed pair; the package's release checks ‖Θ‖²_op ≤ w on
    every draw instead (``lightning_dpot.methods.dpsw.sliced_release``). Arguments as in
    ``projection_bound_w``.
    """
    return 2.0 * math.sqrt(projection_bound_w(num_directions, dim, delta_s, method))


def sliced_noise_multiplier(sigma: float, sensitivity: float) -> float:
    """Noise multiplier of the release for the accountant: ``σ / Δ`` (``σ = 0``: no privacy)."""
    sigma = check_nonnegative("sigma", sigma)
    sensitivity = check_positive("sensitivity", sensitivity)
    return sigma / sensitivity


def sliced_sigma(noise_multiplier: float, sensitivity: float) -> float:
    """Noise standard deviation of the release for a noise multiplier: ``σ = multiplier · Δ``."""
    noise_multiplier = check_nonnegative("noise_multiplier", noise_multiplier)
    sensitivity = check_positive("sensitivity", sensitivity)
    return noise_multiplier * sensitivity


def check_release_inputs(x: Tensor, theta: Tensor, norm_tolerance: float = 1e-5) -> None:
    """Everything ``gaussian_sliced_release`` refuses, checked without releasing anything.

    ``x`` must be a 2-D floating tensor of finite records with ``‖x_i‖₂ ≤ 1 + norm_tolerance``
    (``check_unit_ball``: the error names how many records
    fail and the first index, never a norm), ``norm_tolerance`` in ``[0, 1e-3]`` and ``theta``
    an ``(N_θ ≥ 1, d)`` matrix of unit rows (``|‖θ_j‖ − 1| ≤ 1e-4``).

    Raises:
        ValueError: naming the first check that fails.
    """
    norm_tolerance = check_nonnegative("norm_tolerance", norm_tolerance)
    if norm_tolerance > 1e-3:
        raise ValueError(f"norm_tolerance must lie in [0, 1e-3], got {norm_tolerance!r}")
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"x must be a 2-D floating tensor, got {x.dtype} {tuple(x.shape)}")
    check_unit_ball(x, "x", norm_tolerance)
    if theta.dim() != 2 or theta.shape[0] < 1 or theta.shape[1] != x.shape[1]:
        raise ValueError(
            f"theta must be a 2-D tensor of N_θ >= 1 {x.shape[1]}-dimensional directions (rows), "
            f"got shape {tuple(theta.shape)}"
        )
    theta_norms = torch.linalg.vector_norm(theta.detach().to(x.dtype), dim=1)
    if not bool(((theta_norms - 1.0).abs() <= 1e-4).all()):
        raise ValueError(
            "theta rows must be unit vectors (directions on the sphere, |‖θ_j‖ − 1| <= 1e-4), "
            f"got norms in [{float(theta_norms.min())!r}, {float(theta_norms.max())!r}]"
        )


def gaussian_sliced_release(
    x: Tensor,
    theta: Tensor,
    sigma: float,
    generator: NoiseSource | None = None,
    *,
    norm_tolerance: float = 1e-5,
) -> Tensor:
    """The private release ``M(X) = XΘᵀ + Z``, ``Z`` i.i.d. N(0, σ²) (Sebag et al. 2023, eq. 23).

    Refuses non-finite records, records with ``‖x_i‖₂ > 1 + norm_tolerance`` (the sensitivity
    bound rests on ``‖x_i‖₂ ≤ 1``: normalise before releasing, never after) and directions that
    are not unit vectors (``|‖θ_j‖ − 1| > 1e-4``), by ``check_release_inputs``. Rows within
    the tolerance are scaled onto the unit ball, ``x_i / (max(1, ‖x_i‖₂) · max(1, max_j ‖θ_j‖₂))``,
    so the bound holds exactly despite rounding. The input is detached: a release is a value, not
    part of a graph. Θ must be drawn independently of the data
    (``lightning_dpot.ot.sliced.random_directions``); the package calls it only through
    ``SlicedGaussianRelease``, which checks Θ.

    Args:
        x: ``(n, d)`` private records, ``‖x_i‖₂ ≤ 1``.
        theta: ``(N_θ, d)`` unit directions.
        sigma: noise standard deviation ``σ ≥ 0`` (``0``: the non-private ε = ∞ run).
        generator: the random stream of ``Z`` (on ``x``'s device).
        norm_tolerance: allowed rounding excess of ``‖x_i‖₂`` over 1, in ``[0, 1e-3]``.

    Returns:
        ``(n, N_θ)`` released projections, column ``j`` ↔ ``θ_j``.
    """
    sigma = check_nonnegative("sigma", sigma)
    check_release_inputs(x, theta, norm_tolerance)
    x = x.detach()
    norms = torch.linalg.vector_norm(x, dim=1)
    theta = theta.detach().to(x.dtype)
    theta_norms = torch.linalg.vector_norm(theta, dim=1)
    # ‖uΘᵀ‖² ≤ max_j ‖θ_j‖² · Σ_j ⟨θ_j/‖θ_j‖, u⟩²: dividing by max(1, max_j ‖θ_j‖) too keeps the
    # bound exact when rounding leaves a direction's norm slightly above 1.
    scale = norms.clamp(min=1.0) * theta_norms.max().clamp(min=1.0)
    return noisy_projections(x / scale.unsqueeze(1), theta, sigma, generator)
