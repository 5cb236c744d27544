"""The Wasserstein accountant of Yang et al. 2024 (AAAI 2024) for the Poisson-subsampled Gaussian
mechanism: the per-step loss (Theorem 2) through the absolute moment of a Gaussian (Lemma 1),
summed over steps with the tail bound of Corollary 1. The notion, its caveats and the
single-mechanism closed forms are in ``lightning_dpot.privacy.accounting.wdp``; every result
is a WDP guarantee, never an (ε, δ)-DP statement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy.special import gamma, hyp1f1

from lightning_dpot.checks import (
    check_delta,
    check_nonnegative,
    check_positive,
    check_positive_int,
    check_probability,
)
from lightning_dpot.privacy.accounting.wdp import WDPGuarantee, _check_order

__all__ = [
    "gaussian_absolute_moment",
    "subsampled_gaussian_wdp_loss",
    "wasserstein_accountant",
    "wdp_compose",
]


def gaussian_absolute_moment(mean: float, std: float, order: float) -> float:
    """Raw absolute moment E|Z|^μ of Z ~ N(m, s²), Yang et al. 2024, Lemma 1 (Winkelbauer 2012,
    eq. 17).

    E|Z|^μ = (2 s²)^(μ/2) Γ((μ + 1)/2) / √π · ₁F₁(−μ/2; 1/2; −m² / (2 s²)),

    with ₁F₁ Kummer's confluent hypergeometric function (``scipy.special.hyp1f1``). In
    Yang et al. 2024, m = q d_t and s² = Var = (2 − 2q + 2q²) σ².

    Args:
        mean: m (any real).
        std: s > 0.
        order: μ ≥ 1.
    """
    mean = float(mean)
    if not math.isfinite(mean):
        raise ValueError(f"mean must be a finite number, got {mean!r}")
    std = check_positive("std", std)
    order = _check_order(order)
    variance = std * std
    kummer = float(hyp1f1(-order / 2.0, 0.5, -(mean * mean) / (2.0 * variance)))
    return (
        (2.0 * variance) ** (order / 2.0)
        * float(gamma((order + 1.0) / 2.0))
        / math.sqrt(math.pi)
        * kummer
    )


def subsampled_gaussian_wdp_loss(
    noise_std: float,
    sample_rate: float,
    distance: float,
    order: float,
    num_components: int = 1,
) -> float:
    """Per-step WDP loss of the Poisson-subsampled Gaussian mechanism, Yang et al. 2024, Theorem 2.

    loss_t = [Σ_{i=1}^{n} E|Z_ti|^μ]^(1/μ) = (n · E|Z|^μ)^(1/μ),
    Z ~ N(q d_t, (2 − 2q + 2q²) σ²),

    with E|Z|^μ from Lemma 1 (``gaussian_absolute_moment``). The paper's pair is
    Pr_M(D) = (1 − q) N(0, σ²) + q N(d_t, σ²) versus Pr_M(D') = N(0, σ²) (add/remove adjacency
    under Poisson sampling); n is the number of components of Z_t, each distributed as above
    (n = 1 treats the released vector's difference as one coordinate of norm d_t).

    Args:
        noise_std: Gaussian noise standard deviation σ > 0 (noise multiplier × sensitivity).
        sample_rate: Poisson sampling rate q ∈ (0, 1].
        distance: gradient distance d_t = ‖g_t − g'_t‖₂ ≥ 0.
        order: Wasserstein order μ ≥ 1.
        num_components: n ≥ 1.
    """
    noise_std = check_positive("noise_std", noise_std)
    sample_rate = check_probability("sample_rate", sample_rate)
    distance = check_nonnegative("distance", distance)
    order = _check_order(order)
    num_components = check_positive_int("num_components", num_components)
    q = sample_rate
    variance = (2.0 - 2.0 * q + 2.0 * q * q) * noise_std**2
    moment = gaussian_absolute_moment(q * distance, math.sqrt(variance), order)
    return (num_components * moment) ** (1.0 / order)


def wdp_compose(step_losses: Sequence[float], beta: float, delta: float) -> float:
    """Wasserstein accountant tail bound, Yang et al. 2024, Corollary 1 (from Theorem 1).

    ε = Σ_t loss_t − log(δ) / β,

    so that Pr[W_μ ≥ ε] ≤ exp(β Σ_t loss_t − β ε) = δ (generalized WDP, Definition 5).

    Args:
        step_losses: per-step losses loss_t ≥ 0 (Theorem 2).
        beta: the free parameter β > 0 of Theorem 1.
        delta: failure probability δ ∈ (0, 1) of generalized WDP.
    """
    beta = check_positive("beta", beta)
    delta = check_delta("delta", delta)
    total = 0.0
    for index, loss in enumerate(step_losses):
        total += check_nonnegative(f"step_losses[{index}]", loss)
    return total - math.log(delta) / beta


def wasserstein_accountant(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    sensitivity: float,
    order: float,
    beta: float,
    delta: float,
    *,
    num_components: int = 1,
    observed_distances: Sequence[float] | None = None,
    empirical: bool = False,
) -> WDPGuarantee:
    """Generalized WDP (μ, ε) of T steps of the Poisson-subsampled Gaussian mechanism.

    Yang et al. 2024, Lemma 1 + Theorem 2 + Corollary 1, with noise standard deviation
    σ = noise_multiplier · Δ:

        ε = Σ_{t=1}^{T} (n · E|Z_t|^μ)^(1/μ) − log(δ)/β,   Z_t ~ N(q d_t, (2 − 2q + 2q²) σ²).

    Default (worst case): d_t = Δ for every step. The per-step loss is increasing in d_t, so this
    is the supremum over adjacent pairs whose gradient distance is at most the sensitivity
    (the paper writes an infimum over d_t, which would not bound the worst case).

    Empirical mode (``empirical=True`` with ``observed_distances``, one d_t per step): uses
    data-dependent distances, as the authors' experiments do. It carries **no worst-case
    guarantee** and is labelled so.

    Args:
        noise_multiplier: z > 0, noise standard deviation divided by the sensitivity.
        sample_rate: Poisson sampling rate q ∈ (0, 1].
        steps: number of steps T ≥ 1.
        sensitivity: ℓ2 sensitivity Δ > 0 of one step's sum of clipped gradients
            (the clipping norm under add/remove adjacency).
        order: Wasserstein order μ ≥ 1.
        beta: Theorem 1's β > 0.
        delta: failure probability δ ∈ (0, 1) of generalized WDP (Definition 5); it is not the
            δ of (ε, δ)-DP.
        num_components: n ≥ 1 in Theorem 2's sum over components.
        observed_distances: T observed distances d_t ≥ 0 (empirical mode only).
        empirical: must be True to use ``observed_distances``.
    """
    noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
    sample_rate = check_probability("sample_rate", sample_rate)
    steps = check_positive_int("steps", steps)
    sensitivity = check_positive("sensitivity", sensitivity)
    order = _check_order(order)
    beta = check_positive("beta", beta)
    delta = check_delta("delta", delta)
    num_components = check_positive_int("num_components", num_components)
    noise_std = noise_multiplier * sensitivity
    parameters: tuple[tuple[str, float], ...] = (
        ("noise_multiplier", noise_multiplier),
        ("sample_rate", sample_rate),
        ("steps", steps),
        ("sensitivity", sensitivity),
        ("beta", beta),
        ("num_components", num_components),
    )
    if observed_distances is None:
        if empirical:
            raise ValueError(
                "empirical=True needs observed_distances (one gradient distance d_t per step)"
            )
        step_loss = subsampled_gaussian_wdp_loss(
            noise_std, sample_rate, sensitivity, order, num_components
        )
        epsilon = wdp_compose([step_loss] * steps, beta, delta)
        source = "Poisson-subsampled Gaussian, worst-case sensitivity"
        worst_case = True
    else:
        if not empirical:
            raise ValueError(
                "observed_distances are data-dependent and give no worst-case guarantee; pass "
                "empirical=True to use them, or omit them for the worst-case accountant"
            )
        distances = [
            check_nonnegative(f"observed_distances[{i}]", d)
            for i, d in enumerate(observed_distances)
        ]
        if len(distances) != steps:
            raise ValueError(
                f"observed_distances must hold one distance per step (steps={steps}), "
                f"got {len(distances)}"
            )
        losses = [
            subsampled_gaussian_wdp_loss(noise_std, sample_rate, d, order, num_components)
            for d in distances
        ]
        epsilon = wdp_compose(losses, beta, delta)
        source = "Poisson-subsampled Gaussian, observed gradient distances"
        worst_case = False
    return WDPGuarantee(
        order=order,
        epsilon=epsilon,
        source=source,
        reference="Lemma 1, Theorem 2, Corollary 1",
        parameters=parameters,
        failure_probability=delta,
        worst_case=worst_case,
    )
