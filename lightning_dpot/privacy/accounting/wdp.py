"""Wasserstein differential privacy (WDP) as stated in Yang et al. 2024 (AAAI 2024).

**WDP is a different notion from differential privacy.** A mechanism M is (μ, ε)-WDP
(Yang et al. 2024, Definition 3) when, for all adjacent D, D', the μ-Wasserstein distance between
the output distributions is at most ε:

    W_μ(Pr_M(D), Pr_M(D')) = (inf_γ ∫ ‖x − y‖^μ dγ(x, y))^(1/μ) ≤ ε,   μ ≥ 1.

Its ε is a distance in output units, not a log-likelihood ratio; it must never be reported or
compared as the ε of (ε, δ)-DP. Every result here is a ``WDPGuarantee`` whose ``guarantee``
string reads "WDP (μ, ε) = ...".

What is implemented (formulas exactly as the paper states them):

* Laplace and Gaussian mechanisms, closed forms (Proposition 7, 8; Table 1).
* Conversions ε-DP → WDP and RDP → WDP (Proposition 9, 10).
* The Wasserstein accountant for the Poisson-subsampled Gaussian mechanism
  (``lightning_dpot.privacy.accounting.wdp_accountant``): per-step loss
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
from dataclasses import dataclass, field
from typing import Any

from lightning_dpot.checks import (
    check_epsilon,
    check_positive,
)

__all__ = ["WDPGuarantee", "wdp_from_dp", "wdp_from_rdp", "wdp_gaussian", "wdp_laplace"]

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
