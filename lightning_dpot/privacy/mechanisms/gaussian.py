"""Calibrations of the Gaussian mechanism M(x) = f(x) + N(0, σ² I).

Three calibrations, each usable in both directions ((ε, δ) → σ and (σ, δ) → ε), for an
ℓ2-sensitivity Δ = sup ‖f(x) − f(x')‖₂:

* ``analytic`` (default) — Balle & Wang 2018, Thm. 8: the mechanism is (ε, δ)-DP iff
  δ ≥ Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ). Exact, hence the smallest σ; it reproduces
  the σ values of Reshetova et al. 2024 (e.g. Δ = 40, (25, 1e-4) → σ = 9.17).
* ``zhao`` — Zhao et al. 2019 (Reshetova et al. 2024, eq. (10)): σ = Δ (c + √(c² + ε)) / (ε√2),
  c² = ln(2 / (√(16δ + 1) − 1)).
* ``classical`` — Dwork & Roth 2014, Thm. A.1: σ = √(2 ln(1.25/δ)) Δ / ε, proven only for
  ε < 1 and refused otherwise.

The analytic calibration equals dp-accounting's ``get_sigma_gaussian`` / ``get_epsilon_gaussian``
(at σ/Δ) to 3e-13 relative, and δ its ``GaussianPrivacyLoss`` hockey-stick divergence to 2e-10
(the tests pin both). It is computed here, on scipy alone, because ``dpot account calibrate``
imports this module and nothing else of the accounting: importing dp-accounting (it loads
scipy.stats and scipy.signal) takes that command from 0.6 to 1.05 s on an idle 2-core machine and
past the 2 s budget under load (docs/privacy_accounting.md).
"""

from __future__ import annotations

import math
from typing import Literal

from scipy.optimize import brentq
from scipy.special import log_ndtr

from lightning_dpot.checks import check_delta, check_epsilon, check_positive

GaussianCalibration = Literal["analytic", "zhao", "classical"]
CALIBRATIONS: tuple[str, ...] = ("analytic", "zhao", "classical")


def analytic_gaussian_delta(sigma: float, epsilon: float, sensitivity: float) -> float:
    """Smallest δ for which N(0, σ²) noise on a Δ-sensitive query is (ε, δ)-DP (Balle & Wang,
    Thm. 8): δ = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ), evaluated in log space."""
    a = sensitivity / (2.0 * sigma)
    b = epsilon * sigma / sensitivity
    first = math.exp(log_ndtr(a - b))
    second = math.exp(epsilon + log_ndtr(-a - b))
    return max(first - second, 0.0)


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest σ with ``analytic_gaussian_delta(σ, ε, Δ) ≤ δ`` (root finding, rel. tol 1e-12),
    then 1e-9 relative above the root: brentq's root may lie on either side within its
    tolerance, and the step makes the returned σ the safe side, so that the ε
    ``analytic_gaussian_epsilon`` reports for it never exceeds ``epsilon``."""
    epsilon, delta = check_epsilon("epsilon", epsilon), check_delta("delta", delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    # δ(σ) decreases in σ; bracket the root in units of Δ.
    lo, hi = 1e-6, 1.0
    while analytic_gaussian_delta(hi * sensitivity, epsilon, sensitivity) > delta:
        hi *= 2.0
    root = brentq(
        lambda s: analytic_gaussian_delta(s * sensitivity, epsilon, sensitivity) - delta,
        lo,
        hi,
        xtol=1e-14,
        rtol=1e-12,
    )
    return root * (1.0 + 1e-9) * sensitivity


def analytic_gaussian_epsilon(sigma: float, delta: float, sensitivity: float) -> float:
    """Smallest ε with ``analytic_gaussian_delta(σ, ε, Δ) ≤ δ``; 0 if δ is met at ε = 0."""
    sigma = check_positive("sigma", sigma)
    delta = check_delta("delta", delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    if analytic_gaussian_delta(sigma, 0.0, sensitivity) <= delta:
        return 0.0
    hi = 1.0
    while analytic_gaussian_delta(sigma, hi, sensitivity) > delta:
        hi *= 2.0
    return brentq(
        lambda e: analytic_gaussian_delta(sigma, e, sensitivity) - delta, 0.0, hi, xtol=1e-15
    )


def _zhao_c(delta: float) -> float:
    return math.sqrt(math.log(2.0 / (math.sqrt(16.0 * delta + 1.0) - 1.0)))


def zhao_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Reshetova et al. 2024, eq. (10): σ = Δ (c + √(c² + ε)) / (ε√2)."""
    epsilon, delta = check_epsilon("epsilon", epsilon), check_delta("delta", delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    c = _zhao_c(delta)
    return sensitivity * (c + math.sqrt(c * c + epsilon)) / (epsilon * math.sqrt(2.0))


def zhao_epsilon(sigma: float, delta: float, sensitivity: float) -> float:
    """Inverse of ``zhao_sigma``: with s = σ√2/Δ, ε = (2sc + 1) / s²."""
    sigma = check_positive("sigma", sigma)
    delta = check_delta("delta", delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    s = sigma * math.sqrt(2.0) / sensitivity
    return (2.0 * s * _zhao_c(delta) + 1.0) / (s * s)


def classical_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """σ = √(2 ln(1.25/δ)) Δ / ε, valid only for ε < 1 (Dwork & Roth, Thm. A.1)."""
    epsilon, delta = check_epsilon("epsilon", epsilon), check_delta("delta", delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    if epsilon >= 1.0:
        raise ValueError(
            f"epsilon must be < 1 for the classical Gaussian calibration, got {epsilon!r}; "
            "use calibration='analytic' (exact for every epsilon)"
        )
    return math.sqrt(2.0 * math.log(1.25 / delta)) * sensitivity / epsilon


def classical_epsilon(sigma: float, delta: float, sensitivity: float) -> float:
    """Inverse of ``classical_sigma``; refused when the result is not < 1."""
    sigma = check_positive("sigma", sigma)
    delta = check_delta("delta", delta)
    sensitivity = check_positive("sensitivity", sensitivity)
    epsilon = math.sqrt(2.0 * math.log(1.25 / delta)) * sensitivity / sigma
    if epsilon >= 1.0:
        raise ValueError(
            f"sigma={sigma!r} gives epsilon={epsilon:.4g} >= 1 under the classical Gaussian "
            "calibration, where it is not valid; use calibration='analytic'"
        )
    return epsilon


def _check_calibration(calibration: str) -> None:
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")


def gaussian_sigma(
    epsilon: float, delta: float, sensitivity: float, calibration: GaussianCalibration = "analytic"
) -> float:
    """Noise std σ making the Gaussian mechanism (ε, δ)-DP for ℓ2-sensitivity Δ."""
    _check_calibration(calibration)
    fn = {"analytic": analytic_gaussian_sigma, "zhao": zhao_sigma, "classical": classical_sigma}
    return fn[calibration](epsilon, delta, sensitivity)


def gaussian_epsilon(
    sigma: float, delta: float, sensitivity: float, calibration: GaussianCalibration = "analytic"
) -> float:
    """ε guaranteed by noise std σ at δ for ℓ2-sensitivity Δ."""
    _check_calibration(calibration)
    fn = {
        "analytic": analytic_gaussian_epsilon,
        "zhao": zhao_epsilon,
        "classical": classical_epsilon,
    }
    return fn[calibration](sigma, delta, sensitivity)
