"""Amplification by shuffling for pure ε0-LDP reports (Feldman, McMillan, Talwar 2021).

Setting. Each of ``n`` users applies an ε0-DP local randomizer (pure LDP, δ0 = 0) to its own record,
and the ``n`` reports are released in a uniformly random order (or, equivalently, the records were
shuffled before a data-independent privatization, the argument of Reshetova et al. 2024, §IV-A). The
shuffled release is then (ε, δ)-DP in the central model with respect to **replace-one adjacency**
(datasets differing in one user's record), with ε much smaller than ε0. δ here is only the failure
probability of the amplification bound; the local reports have none.

Reference: V. Feldman, A. McMillan, K. Talwar, "Hiding among the clones: a simple and nearly
optimal analysis of privacy amplification by shuffling", FOCS 2021 (arXiv:2012.12803), below
"FMT21". Both bounds are reimplemented from the paper's mathematics.

* **Closed form** (FMT21, Theorem 3.1). For ε0 ≤ log(n / (16 log(2/δ))),

      ε = log(1 + (e^ε0 − 1)/(e^ε0 + 1) · (8 √(e^ε0 log(4/δ)) / √n + 8 e^ε0 / n)).

* **Numerical bound** (FMT21, the "clones" reduction and its numerical evaluation). The shuffled
  outputs on adjacent datasets are post-processings of the pair

      P = (A + Δ, C − A + 1 − Δ),   Q = (A + 1 − Δ, C − A + Δ),
      C ~ Bin(n − 1, e^−ε0),  A ~ Bin(C, 1/2),  Δ ~ Bern(e^ε0 / (e^ε0 + 1)),

  so the release is (ε, δ(ε))-DP with δ(ε) = max(D_{e^ε}(P‖Q), D_{e^ε}(Q‖P)), where
  D_{e^ε}(P‖Q) = Σ_o max(0, P(o) − e^ε Q(o)) is the hockey-stick divergence. C is a function of
  the output (the coordinates sum to C + 1), so δ(ε) = Σ_c Pr[C = c] δ_c(ε) with δ_c the
  divergence of the conditional pair, computed here in closed form from binomial tails (see
  ``_clone_pair_divergence``). ε for a target δ is found by bisection on [0, ε0]
  (δ(ε) is non-increasing in ε and δ(ε0) = 0). This is an upper bound on the privacy of the
  shuffled release for every ε0 > 0; it is tighter than the closed form.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.stats import binom

from lightning_dpot.checks import (
    check_delta,
    check_epsilon,
    check_nonnegative,
    check_positive,
    check_positive_int,
)

__all__ = [
    "shuffled_release_report",
    "closed_form_max_epsilon0",
    "shuffle_delta_numerical",
    "shuffle_epsilon_closed_form",
    "shuffle_epsilon_numerical",
]


def closed_form_max_epsilon0(n: int, delta: float) -> float:
    """Largest ε0 covered by the closed form (FMT21, Theorem 3.1): log(n / (16 log(2/δ))).

    The value is ≤ 0 when n ≤ 16 log(2/δ): then no ε0 > 0 is covered.
    """
    n = check_positive_int("n", n)
    delta = check_delta("delta", delta)
    ratio = n / (16.0 * math.log(2.0 / delta))
    return math.log(ratio)


def shuffle_epsilon_closed_form(epsilon0: float, n: int, delta: float) -> float:
    """Central ε of ``n`` shuffled ε0-LDP reports, closed form of FMT21 Theorem 3.1.

    ε = log(1 + (e^ε0 − 1)/(e^ε0 + 1) · (8 √(e^ε0 log(4/δ)) / √n + 8 e^ε0 / n)),

    valid only for ε0 ≤ log(n / (16 log(2/δ))); outside that range this function refuses
    (use ``shuffle_epsilon_numerical``, which has no such restriction).

    Args:
        epsilon0: pure local DP parameter of each report, ε0 > 0.
        n: number of shuffled reports (users), n ≥ 1.
        delta: central δ in (0, 1); failure probability of the amplification bound only.

    Returns:
        ε such that the shuffled release is (ε, δ)-DP under replace-one adjacency.
    """
    epsilon0 = check_epsilon("epsilon0", epsilon0)
    n = check_positive_int("n", n)
    delta = check_delta("delta", delta)
    max_epsilon0 = closed_form_max_epsilon0(n, delta)
    if epsilon0 > max_epsilon0:
        raise ValueError(
            f"epsilon0={epsilon0!r} is outside the validity range of the closed-form shuffling "
            f"bound (FMT21 Theorem 3.1 needs epsilon0 <= log(n / (16 log(2/delta))) = "
            f"{max_epsilon0:.6g} for n={n}, delta={delta!r}); use the numerical bound instead"
        )
    e0 = math.exp(epsilon0)
    inner = 8.0 * math.sqrt(e0 * math.log(4.0 / delta)) / math.sqrt(n) + 8.0 * e0 / n
    return math.log1p((e0 - 1.0) / (e0 + 1.0) * inner)


def _clone_pair_divergence(counts: np.ndarray, epsilon: float, epsilon0: float) -> np.ndarray:
    """Hockey-stick divergence D_{e^ε}(P_c ‖ Q_c) of the clone pair given C = c (vectorized in c).

    Given C = c, the first coordinate X determines the output. With B(k) = Pr[Bin(c, 1/2) = k]
    and p = e^ε0 / (e^ε0 + 1):

        P_c(x) = p B(x − 1) + (1 − p) B(x),   Q_c(x) = (1 − p) B(x − 1) + p B(x),  x = 0..c+1.

    With t = B(x − 1)/B(x) = x / (c − x + 1) (increasing in x), P_c/Q_c = (p t + 1 − p)/((1 − p) t
    + p) is increasing in t, so P_c > e^ε Q_c exactly for x > τ (c + 1)/(1 + τ) with
    τ = (e^ε p − (1 − p)) / (p − e^ε (1 − p)) (for ε < ε0). Summing over that upper tail
    x ≥ x* gives

        δ_c = (1 − e^ε) Pr[Bin(c, 1/2) ≥ x*] + (p − e^ε (1 − p)) B(x* − 1).

    The reverse divergence D_{e^ε}(Q_c ‖ P_c) is equal: x ↦ c + 1 − x maps P_c onto Q_c because
    B is symmetric, so one direction suffices.
    """
    if epsilon >= epsilon0:
        return np.zeros(counts.shape, dtype=float)
    p = 1.0 / (1.0 + math.exp(-epsilon0))
    e = math.exp(epsilon)
    numerator_weight = p - e * (1.0 - p)  # > 0 because e^ε < e^ε0 = p / (1 − p)
    tau = (e * p - (1.0 - p)) / numerator_weight
    first_x = np.floor(tau * (counts + 1.0) / (1.0 + tau)).astype(np.int64) + 1
    first_x = np.minimum(first_x, counts + 1)
    upper_tail = binom.sf(first_x - 1, counts, 0.5)  # Pr[Bin(c, 1/2) >= x*]
    boundary = binom.pmf(first_x - 1, counts, 0.5)  # B(x* − 1)
    divergence = (1.0 - e) * upper_tail + numerator_weight * boundary
    return np.maximum(divergence, 0.0)


def _clone_count_window(n: int, epsilon0: float, tail_mass: float) -> tuple[int, int, float]:
    """Range [lo, hi] of C ~ Bin(n − 1, e^−ε0) outside which each tail has mass ≤ ``tail_mass``.

    Returns (lo, hi, dropped) with ``dropped`` = Pr[C < lo] + Pr[C > hi], computed exactly; the
    caller adds it to δ (each δ_c ≤ 1), so truncation keeps δ an upper bound.
    """
    trials, rate = n - 1, math.exp(-epsilon0)
    mean = trials * rate
    std = math.sqrt(trials * rate * (1.0 - rate))
    width = 8.0 * std + 10.0
    while True:
        lo = max(0, int(math.floor(mean - width)))
        hi = min(trials, int(math.ceil(mean + width)))
        left = float(binom.cdf(lo - 1, trials, rate)) if lo > 0 else 0.0
        right = float(binom.sf(hi, trials, rate)) if hi < trials else 0.0
        if (left <= tail_mass and right <= tail_mass) or (lo == 0 and hi == trials):
            return lo, hi, left + right
        width *= 1.5


def shuffle_delta_numerical(
    epsilon0: float, n: int, epsilon: float, *, tail_mass: float = 1e-18
) -> float:
    """δ(ε) of ``n`` shuffled ε0-LDP reports by the numerical clone bound of FMT21.

    δ(ε) = Σ_c Pr[C = c] δ_c(ε) with C ~ Bin(n − 1, e^−ε0) and δ_c from
    ``_clone_pair_divergence``. Values of c whose total probability is below
    2·``tail_mass`` are not evaluated; their mass is added to δ instead (δ_c ≤ 1), so the result
    stays an upper bound.

    Args:
        epsilon0: pure local DP parameter, ε0 > 0.
        n: number of shuffled reports, n ≥ 1.
        epsilon: central ε ≥ 0 at which δ is evaluated.
        tail_mass: truncation mass per tail of C, ≥ 0.

    Returns:
        δ such that the shuffled release is (ε, δ)-DP under replace-one adjacency.
    """
    epsilon0 = check_epsilon("epsilon0", epsilon0)
    n = check_positive_int("n", n)
    epsilon = check_nonnegative("epsilon", epsilon)
    tail_mass = check_nonnegative("tail_mass", tail_mass)
    if epsilon >= epsilon0:
        return 0.0
    lo, hi, dropped = _clone_count_window(n, epsilon0, tail_mass)
    counts = np.arange(lo, hi + 1, dtype=np.int64)
    weights = binom.pmf(counts, n - 1, math.exp(-epsilon0))
    delta = float(np.dot(weights, _clone_pair_divergence(counts, epsilon, epsilon0))) + dropped
    return min(delta, 1.0)


def shuffle_epsilon_numerical(
    epsilon0: float, n: int, delta: float, *, tolerance: float = 1e-6
) -> float:
    """Central ε of ``n`` shuffled ε0-LDP reports by the numerical clone bound of FMT21.

    Bisection on ε ∈ [0, ε0] for the smallest ε with δ(ε) ≤ ``delta``
    (``shuffle_delta_numerical``, non-increasing in ε, δ(ε0) = 0). The returned value is the
    upper end of the final bracket, so it is a valid ε (never below the exact root) and exceeds
    it by at most ``tolerance`` times itself (relative accuracy; values below 1e-12 are returned
    as they are). The truncation of C uses tail mass 1e-4·δ per tail, which only makes
    the bound conservative. Valid for every ε0 > 0 (no range restriction).

    Args:
        epsilon0: pure local DP parameter, ε0 > 0.
        n: number of shuffled reports, n ≥ 1.
        delta: central δ in (0, 1).
        tolerance: relative accuracy of ε, > 0.

    Returns:
        ε such that the shuffled release is (ε, δ)-DP under replace-one adjacency (≤ ε0).
    """
    epsilon0 = check_epsilon("epsilon0", epsilon0)
    n = check_positive_int("n", n)
    delta = check_delta("delta", delta)
    tolerance = check_positive("tolerance", tolerance)
    tail_mass = 1e-4 * delta
    lo, hi = 0.0, epsilon0
    if shuffle_delta_numerical(epsilon0, n, lo, tail_mass=tail_mass) <= delta:
        return 0.0
    while hi - lo > tolerance * hi and hi > 1e-12:
        mid = 0.5 * (lo + hi)
        if shuffle_delta_numerical(epsilon0, n, mid, tail_mass=tail_mass) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def shuffled_release_report(
    epsilon0: float, n: int, delta: float, seed_is_public: bool
) -> dict[str, Any]:
    """The report's ``central_by_shuffling`` entry for a release of ``n`` ε0-LDP reports in a
    secret uniformly random order. With a public seed the permutation (and the noise) can be
    recomputed, so the release is not shuffled for anyone who knows it, and no central
    guarantee by shuffling is claimed."""
    if seed_is_public:
        return {
            "applies": False,
            "reason": "the release's seed is public (seed_is_public: true): its permutation and "
            "noise can be recomputed, so the shuffled release has only the local guarantee",
            "delta": delta,
        }
    closed = (
        shuffle_epsilon_closed_form(epsilon0, n, delta)
        if epsilon0 <= closed_form_max_epsilon0(n, delta)
        else None
    )
    return {
        "applies": True,
        "guarantee": "central (ε, δ)-DP of the shuffled release, replace-one adjacency",
        "reference": "Feldman, McMillan, Talwar 2021 (Hiding among the clones)",
        "epsilon0": epsilon0,
        "n": n,
        "delta": delta,
        "epsilon_numerical": shuffle_epsilon_numerical(epsilon0, n, delta),
        "epsilon_closed_form": closed,
    }
