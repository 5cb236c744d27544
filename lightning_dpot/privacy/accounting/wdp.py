"""Wasserstein differential privacy (WDP) as stated in Yang et al. 2024 (AAAI 2024).

**WDP is a different notion from differential privacy.** A mechanism M is (μ, ε)-WDP
(Yang et al. 2024, Definition 3) when, for all adjacent D, D', the μ-Wasserstein distance between
the output distributions is at most ε:

    W_μ(Pr_M(D), Pr_M(D')) = (inf_γ ∫ ‖x − y‖^μ dγ(x, y))^(1/μ) ≤ ε,   μ ≥ 1.

Its ε is a distance in output units, not a log-likelihood ratio; it must never be reported or
compared as the ε of (ε, δ)-DP. Every result here is a :class:`WDPGuarantee` whose ``guarantee``
string reads "WDP (μ, ε) = ...".

What is implemented (formulas exactly as the paper states them):

* Laplace and Gaussian mechanisms, closed forms (Proposition 7, 8; Table 1).
* Conversions ε-DP → WDP and RDP → WDP (Proposition 9, 10).
* The Wasserstein accountant for the Poisson-subsampled Gaussian mechanism: per-step loss
  (Theorem 2) through the absolute moment of a Gaussian (Lemma 1, Kummer's function ₁F₁), summed
  over steps with the tail bound of Corollary 1 (generalized WDP, Definition 5, with failure
  probability δ and free parameter β > 0). The paper takes inf over the gradient distance d_t;
  a guarantee over all adjacent pairs needs the worst case, so d_t is set to the declared
  sensitivity Δ (the per-step loss is increasing in d_t, so this is the sup over d_t ≤ Δ).
  A data-dependent mode with observed distances exists only behind ``empirical=True`` and is
  labelled "no worst-case guarantee".

Caveats a reader should know (they concern the paper, not this transcription):

* For additive noise, the Wasserstein distance of Definition 3 between f(D) + N and f(D') + N
  is exactly ‖f(D) − f(D')‖ for every noise scale (translation coupling; W_μ ≥ W_1 ≥ mean
  shift). The closed forms of Propositions 7–8 are smaller than that for large noise; their
  proofs (eqs. 34, 43) bound ρ(x, y) by Δ for all coupled points, which does not hold for
  unbounded noise. They are implemented as the paper's accounting quantities, not as verified
  bounds on Definition 3.
* In Proposition 8 the sensitivity appears only inside the power, in Proposition 7 only outside
  (the KL term uses sensitivity 1). Both agree with their proofs for Δ = 1 (the setting of
  Fig. 1); for other Δ they are transcribed as printed.
* Corollary 1's ε grows with the noise multiplier: E|Z|^μ grows with Var(Z) = (2 − 2q + 2q²)σ².
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from scipy.special import gamma, hyp1f1

from lightning_dpot.checks import (
    check_delta,
    check_epsilon,
    check_nonnegative,
    check_positive,
    check_positive_int,
    check_probability,
)

__all__ = [
    "WDPGuarantee",
    "gaussian_absolute_moment",
    "subsampled_gaussian_wdp_loss",
    "wasserstein_accountant",
    "wdp_compose",
    "wdp_from_dp",
    "wdp_from_rdp",
    "wdp_gaussian",
    "wdp_laplace",
]

_NOT_DP = "a Wasserstein-distance notion, not an (ε, δ)-DP statement"


@dataclass(frozen=True)
class WDPGuarantee:
    """A WDP (μ, ε) statement of Yang et al. 2024; never an (ε, δ)-DP guarantee.

    Attributes:
        order: the Wasserstein order μ ≥ 1.
        epsilon: the WDP budget ε (a Wasserstein distance in the output's units).
        source: what was analysed, e.g. "gaussian mechanism".
        reference: where the formula is in Yang et al. 2024.
        parameters: the inputs, as (name, value) pairs.
        failure_probability: δ of generalized WDP (Definition 5) for the accountant, else None.
            It is the probability that the Wasserstein loss exceeds ε, not the δ of (ε, δ)-DP.
        worst_case: False only for the data-dependent (empirical) accountant mode.
        guarantee: human-readable label, always starting with "WDP (μ, ε)" or
            "generalized WDP (μ, ε)".
    """

    order: float
    epsilon: float
    source: str
    reference: str
    parameters: tuple[tuple[str, float], ...]
    failure_probability: float | None = None
    worst_case: bool = True
    guarantee: str = field(init=False)

    def __post_init__(self) -> None:
        head = f"WDP (μ, ε) = ({self.order:g}, {self.epsilon:.6g})"
        if self.failure_probability is not None:
            head = f"generalized {head} with failure probability {self.failure_probability:g}"
        scope = (
            "declared sensitivity, data-independent"
            if self.worst_case
            else "EMPIRICAL, data-dependent: no worst-case guarantee"
        )
        label = f"{head} [{self.source}; Yang et al. 2024, {self.reference}; {scope}]; {_NOT_DP}"
        object.__setattr__(self, "guarantee", label)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: notion, order, epsilon, guarantee, reference, parameters, ..."""
        result: dict[str, Any] = {
            "notion": "WDP",
            "guarantee": self.guarantee,
            "order": self.order,
            "epsilon": self.epsilon,
            "source": self.source,
            "reference": f"Yang et al. 2024, {self.reference}",
            "worst_case": self.worst_case,
            "parameters": dict(self.parameters),
        }
        if self.failure_probability is not None:
            result["failure_probability"] = self.failure_probability
        return result


def _check_order(order: float) -> float:
    """Wasserstein order μ: finite and ≥ 1."""
    order = float(order)
    if not math.isfinite(order) or order < 1.0:
        raise ValueError(
            f"order (Wasserstein order mu) must be a finite number >= 1, got {order!r}"
        )
    return order


def wdp_laplace(scale: float, sensitivity: float, order: float) -> WDPGuarantee:
    """WDP of the Laplace mechanism f(x) + Lap(0, λ), Yang et al. 2024, Proposition 7.

    ε = ½ Δ (√(2 [1/λ + exp(−1/λ) − 1]))^(1/μ),

    where 1/λ + e^(−1/λ) − 1 is the KL divergence (RDP of order 1) of Lap(0, λ) from
    Lap(1, λ) and λ is the Laplace scale (density ∝ exp(−|x|/λ)).

    Args:
        scale: Laplace scale λ > 0.
        sensitivity: sensitivity Δ > 0 (ℓ1 for the vector Laplace mechanism).
        order: Wasserstein order μ ≥ 1.
    """
    scale = check_positive("scale", scale)
    sensitivity = check_positive("sensitivity", sensitivity)
    order = _check_order(order)
    kl = 1.0 / scale + math.expm1(-1.0 / scale)
    epsilon = 0.5 * sensitivity * math.sqrt(2.0 * kl) ** (1.0 / order)
    return WDPGuarantee(
        order=order,
        epsilon=epsilon,
        source="laplace mechanism",
        reference="Proposition 7",
        parameters=(("scale", scale), ("sensitivity", sensitivity)),
    )


def wdp_gaussian(scale: float, sensitivity: float, order: float) -> WDPGuarantee:
    """WDP of the Gaussian mechanism f(x) + N(0, σ²), Yang et al. 2024, Proposition 8.

    ε = ½ (Δ / σ)^(1/μ).

    Args:
        scale: noise standard deviation σ > 0.
        sensitivity: ℓ2 sensitivity Δ > 0.
        order: Wasserstein order μ ≥ 1.
    """
    scale = check_positive("scale", scale)
    sensitivity = check_positive("sensitivity", sensitivity)
    order = _check_order(order)
    epsilon = 0.5 * (sensitivity / scale) ** (1.0 / order)
    return WDPGuarantee(
        order=order,
        epsilon=epsilon,
        source="gaussian mechanism",
        reference="Proposition 8",
        parameters=(("scale", scale), ("sensitivity", sensitivity)),
    )


def wdp_from_dp(epsilon: float, sensitivity: float, order: float) -> WDPGuarantee:
    """ε-DP (pure) implies WDP, Yang et al. 2024, Proposition 9.

    ε_WDP = ½ Δ (2 ε (e^ε − 1))^(1/(2μ)),

    from Pinsker's inequality and KL ≤ ε (e^ε − 1) (Dwork & Roth 2014, Lemma 3.18).

    Args:
        epsilon: pure DP parameter ε > 0.
        sensitivity: sensitivity Δ > 0 of the underlying query.
        order: Wasserstein order μ ≥ 1.
    """
    epsilon = check_epsilon("epsilon", epsilon)
    sensitivity = check_positive("sensitivity", sensitivity)
    order = _check_order(order)
    value = 0.5 * sensitivity * (2.0 * epsilon * math.expm1(epsilon)) ** (1.0 / (2.0 * order))
    return WDPGuarantee(
        order=order,
        epsilon=value,
        source="conversion from pure ε-DP",
        reference="Proposition 9",
        parameters=(("dp_epsilon", epsilon), ("sensitivity", sensitivity)),
    )


def wdp_from_rdp(
    rdp_epsilon: float, sensitivity: float, order: float, rdp_order: float = 1.0
) -> WDPGuarantee:
    """(α, ε)-RDP implies WDP, Yang et al. 2024, Proposition 10.

    ε_WDP = ½ Δ (2 ε_RDP)^(1/(2μ)),   for any RDP order α ≥ 1

    (the proof uses KL = D_1 ≤ D_α and Pinsker's inequality, so α only needs to be ≥ 1; it is
    recorded, not used).

    Args:
        rdp_epsilon: RDP parameter ε_RDP > 0 at order ``rdp_order``.
        sensitivity: sensitivity Δ > 0 of the underlying query.
        order: Wasserstein order μ ≥ 1.
        rdp_order: RDP order α ≥ 1.
    """
    rdp_epsilon = check_positive("rdp_epsilon", rdp_epsilon)
    sensitivity = check_positive("sensitivity", sensitivity)
    order = _check_order(order)
    rdp_order = float(rdp_order)
    if not math.isfinite(rdp_order) or rdp_order < 1.0:
        raise ValueError(f"rdp_order (alpha) must be a finite number >= 1, got {rdp_order!r}")
    value = 0.5 * sensitivity * (2.0 * rdp_epsilon) ** (1.0 / (2.0 * order))
    return WDPGuarantee(
        order=order,
        epsilon=value,
        source="conversion from Rényi DP",
        reference="Proposition 10",
        parameters=(
            ("rdp_epsilon", rdp_epsilon),
            ("rdp_order", rdp_order),
            ("sensitivity", sensitivity),
        ),
    )


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

    with E|Z|^μ from Lemma 1 (:func:`gaussian_absolute_moment`). The paper's pair is
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
