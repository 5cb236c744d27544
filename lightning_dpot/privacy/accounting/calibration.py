r"""Calibration: the largest number of steps, or the smallest noise multiplier, within a target ε.

Both searches work for any sampling scheme and accountant and use that ε is monotone.

* **Steps.** ε is non-decreasing in the number of composed steps ``T``.
  ``largest_count_within`` finds the largest ``T \le`` ``search_limit`` with
  ``\varepsilon(T) \le \varepsilon^*`` by galloping (1, 2, 4, ...) then bisection,
  ``O(\log T)`` evaluations of
  ``epsilon_of_history``, which computes
  the one-step analysis once and reuses it for every ``T``; the answer is exact,
  ``\varepsilon(T) \le \varepsilon^* < \varepsilon(T + 1)``. It returns ``search_limit``
  when that many steps fit (ε grows without bound in ``T``, but for huge σ it may need more)
  and 0 when one step already exceeds. ``max_steps`` applies it to one (σ, q).
  dp-accounting's ``calibrate_dp_mechanism(..., discrete=True)`` would rebuild the one-step
  analysis at every trial count (measured 18-20× slower under RDP, 1.6× under PLD,
  docs/privacy_accounting.md) and guarantee the answer to within one step only.
* **Noise.** ε is decreasing in σ. ``min_noise_multiplier`` gallops from a start by a ratio
  to bracket the smallest σ with ``\varepsilon(\sigma) \le \varepsilon^*``, then
  dp-accounting's ``calibrate_dp_mechanism`` (Brent's method on a fresh ``RdpAccountant`` /
  ``PLDAccountant`` composing ``SelfComposedDpEvent(step, T)``) finds it to within
  ``tolerance`` (absolute, in units of σ) on the side that meets the target: the returned σ
  always satisfies the target, and ``σ - tolerance`` does not (unless σ ≤ ``tolerance``, the
  smallest value searched). It raises ``ValueError`` when even ``max_noise_multiplier`` misses
  the target: a search that did not converge never returns.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

import dp_accounting

from lightning_dpot.checks import (
    check_delta,
    check_epsilon,
    check_positive,
    check_positive_int,
    check_probability,
)
from lightning_dpot.privacy.accounting.analysis.conversions import RDPOrderEdgeWarning
from lightning_dpot.privacy.accounting.analysis.dp_events import NEIGHBORING_RELATIONS, step_event
from lightning_dpot.privacy.accounting.analysis.epsilon import (
    StepCache,
    check_accountant,
    epsilon_of_history,
)
from lightning_dpot.privacy.accounting.analysis.schemes import (
    DEFAULT_PLD_VALUE_DISCRETIZATION,
    DEFAULT_RDP_ORDERS,
    POISSON,
    WITHOUT_REPLACEMENT,
    check_run,
)
from lightning_dpot.privacy.mechanisms.gaussian import gaussian_sigma

T = TypeVar("T", int, float)

DEFAULT_SEARCH_LIMIT = 10**9
"""Largest number of steps ``largest_count_within`` searches; returned when even that many
fit."""

DEFAULT_NOISE_TOLERANCE = 1e-3
"""Absolute tolerance of ``min_noise_multiplier``, in units of σ."""

DEFAULT_MAX_NOISE_MULTIPLIER = 1e4
"""Largest σ ``min_noise_multiplier`` tries before declaring a target unreachable."""


def _quiet_trials(epsilon: Callable[[T], float]) -> Callable[[T], float]:
    """``epsilon`` without the edge-of-grid warning: the searches' trial points are not
    reported guarantees (the accountant warns about the ε it reports)."""

    def quiet(value: T) -> float:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RDPOrderEdgeWarning)
            return epsilon(value)

    return quiet


def largest_count_within(
    epsilon_of_count: Callable[[int], float],
    target_epsilon: float,
    search_limit: int = DEFAULT_SEARCH_LIMIT,
) -> int:
    """Largest ``k`` in ``[0, search_limit]`` with ``epsilon_of_count(k) <= target_epsilon``.

    ``epsilon_of_count`` must be non-decreasing in ``k`` (it is for composition). Galloping
    (1, 2, 4, ...) brackets the answer, bisection finds it: O(log k) evaluations. Returns 0 if
    even ``k = 1`` exceeds the target, ``search_limit`` if ``search_limit`` steps fit.
    """
    target_epsilon = check_epsilon("target_epsilon", target_epsilon)
    search_limit = check_positive_int("search_limit", search_limit)
    epsilon_of_count = _quiet_trials(epsilon_of_count)
    if epsilon_of_count(1) > target_epsilon:
        return 0
    good, bad = 1, 2
    while bad <= search_limit and epsilon_of_count(bad) <= target_epsilon:
        good, bad = bad, 2 * bad
    if bad > search_limit:
        if epsilon_of_count(search_limit) <= target_epsilon:
            return search_limit
        bad = search_limit
    while bad - good > 1:  # invariant: ε(good) <= target < ε(bad)
        mid = (good + bad) // 2
        if epsilon_of_count(mid) <= target_epsilon:
            good = mid
        else:
            bad = mid
    return good


def _calibrate_noise_multiplier(
    make_accountant: Callable[[], dp_accounting.PrivacyAccountant],
    make_event: Callable[[float], dp_accounting.DpEvent],
    target_epsilon: float,
    delta: float,
    tolerance: float,
    max_noise_multiplier: float,
    start: float,
    ratio: float,
) -> float | None:
    """Smallest σ with ε(``make_event(σ)``) ≤ ``target_epsilon`` to within ``tolerance`` from
    above, or ``None`` when even ``max_noise_multiplier`` misses the target.

    Galloping from ``start`` by ``ratio`` brackets σ (an answer ≤ ``tolerance`` is returned as
    found); dp-accounting's ``calibrate_dp_mechanism`` solves inside the bracket and returns a σ
    that meets the target.
    """

    def fits(sigma: float) -> bool:
        return make_accountant().compose(make_event(sigma)).get_epsilon(delta) <= target_epsilon

    if fits(start):
        high, low = start, start / ratio
        while fits(low):
            if low <= tolerance:
                return low
            high, low = low, low / ratio
    else:
        low, high = start, min(start * ratio, max_noise_multiplier)
        while not fits(high):
            if high >= max_noise_multiplier:
                return None
            low, high = high, min(high * ratio, max_noise_multiplier)
    if high - low <= tolerance:
        return high
    return float(
        dp_accounting.calibrate_dp_mechanism(
            make_accountant,
            make_event,
            target_epsilon,
            delta,
            dp_accounting.ExplicitBracketInterval(low, high),
            tol=tolerance,
        )
    )


def max_steps(
    noise_multiplier: float,
    sample_rate: float,
    target_epsilon: float,
    delta: float,
    accountant: str = "rdp",
    sampling: str = POISSON,
    search_limit: int = DEFAULT_SEARCH_LIMIT,
) -> int:
    """Largest number of steps T of (σ, q) with ε(T) ≤ ``target_epsilon`` at ``delta``.

    ``largest_count_within`` over ``epsilon_of_history`` (the one-step analysis is computed once).
    Exact for the chosen
    accountant: ε(T) ≤ target < ε(T + 1) (for ``"pld"`` up to the monotonicity of the
    discretised composition, which holds in practice); 0 if one step already exceeds the
    target, ``search_limit`` if that many steps fit.
    """
    sigma, q, _ = check_run(noise_multiplier, sample_rate, 1)
    target_epsilon = check_epsilon("target_epsilon", target_epsilon)
    delta = check_delta("delta", delta)
    accountant = check_accountant(accountant, sampling)
    cache: StepCache = {}

    def epsilon_of_count(count: int) -> float:
        return epsilon_of_history([(sigma, q, count)], delta, accountant, sampling, cache=cache)

    return largest_count_within(epsilon_of_count, target_epsilon, search_limit)


def min_noise_multiplier(
    sample_rate: float,
    steps: int,
    target_epsilon: float,
    delta: float,
    accountant: str = "rdp",
    sampling: str = POISSON,
    tolerance: float = DEFAULT_NOISE_TOLERANCE,
    max_noise_multiplier: float = DEFAULT_MAX_NOISE_MULTIPLIER,
) -> float:
    """Smallest noise multiplier σ (to within ``tolerance``) with ε ≤ ``target_epsilon`` after
    ``steps`` steps of rate q (b/n without replacement) at ``delta``.

    dp-accounting's ``calibrate_dp_mechanism`` on ``SelfComposedDpEvent(step, steps)``
    (``step_event``) with a fresh
    ``RdpAccountant`` over
    ``DEFAULT_RDP_ORDERS`` or
    ``PLDAccountant`` (value discretization
    ``DEFAULT_PLD_VALUE_DISCRETIZATION``),
    the ε of ``epsilon_of_history``:
    ``ε(σ) <= target_epsilon`` and ``ε(σ - tolerance) > target_epsilon`` (unless σ ≤
    ``tolerance``). Without replacement one run's capped curve
    (``swor_gaussian_rdp``) gives the
    smaller of the subsampled and the plain Gaussian's ε (the conversion is increasing in each
    order's ρ), so σ is the smaller of their two calibrations. For ``"rdp"`` galloping starts at
    σ = 1 with ratio 2; for ``"pld"`` (each evaluation is a full PLD composition, slow for small
    σ) it starts at the RDP answer with ratio 1.1, since PLD is the tighter accountant and its σ
    is usually a few % below.

    Raises:
        ValueError: if even ``max_noise_multiplier`` does not reach the target.
    """
    q = check_probability("sample_rate", sample_rate)
    steps = check_positive_int("steps", steps)
    target_epsilon = check_epsilon("target_epsilon", target_epsilon)
    delta = check_delta("delta", delta)
    accountant = check_accountant(accountant, sampling)
    tolerance = check_positive("tolerance", tolerance)
    max_noise_multiplier = check_positive("max_noise_multiplier", max_noise_multiplier)
    relation = NEIGHBORING_RELATIONS[sampling]

    def make_accountant() -> dp_accounting.PrivacyAccountant:
        if accountant == "rdp":
            return dp_accounting.rdp.RdpAccountant(list(DEFAULT_RDP_ORDERS), relation)
        return dp_accounting.pld.PLDAccountant(relation, DEFAULT_PLD_VALUE_DISCRETIZATION)

    def subsampled(sigma: float) -> dp_accounting.DpEvent:
        return dp_accounting.SelfComposedDpEvent(step_event(sigma, q, sampling), steps)

    def plain(sigma: float) -> dp_accounting.DpEvent:
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), steps)

    if accountant == "rdp":
        start, ratio = 1.0, 2.0
    else:
        start = min_noise_multiplier(
            q, steps, target_epsilon, delta, "rdp", sampling, tolerance, max_noise_multiplier
        )
        ratio = 1.1
    bounds = [subsampled, plain] if sampling == WITHOUT_REPLACEMENT else [subsampled]
    sigmas = [
        _calibrate_noise_multiplier(
            make_accountant,
            make_event,
            target_epsilon,
            delta,
            tolerance,
            max_noise_multiplier,
            start,
            ratio,
        )
        for make_event in bounds
    ]
    reached = [sigma for sigma in sigmas if sigma is not None]
    if not reached:
        raise ValueError(
            f"target_epsilon={target_epsilon!r} is not reached even with "
            f"noise_multiplier={max_noise_multiplier!r} at delta={delta!r} with "
            f"sample_rate={q!r} ({sampling} sampling) and steps={steps!r}; lower the sample rate "
            "(batch size) or the number of steps"
        )
    return min(reached)


def calibrated_noise_std(
    target_epsilon: float,
    delta: float,
    sensitivity: float,
    releases: int,
    sample_rate: float | None = None,
    sampling: str = POISSON,
    accountant: str = "rdp",
) -> float:
    """The one calibration path of every release kind: the noise standard deviation with which
    the planned releases spend at most ``target_epsilon`` at ``delta``.

    ``sample_rate=None``: one Gaussian release of the whole dataset (a
    ``GaussianRelease``, ``releases`` must be 1), calibrated
    by the analytic Gaussian mechanism (Balle & Wang 2018). Otherwise ``releases`` subsampled
    Gaussian steps of rate q (``min_noise_multiplier``), the multiplier scaled by the ℓ2
    ``sensitivity``.

    Raises:
        ValueError: a one-shot release planned more than once, or an unreachable target.
    """
    if sample_rate is None:
        if releases != 1:
            raise ValueError(
                f"a release of the whole dataset is calibrated alone (releases=1), got {releases}"
            )
        return gaussian_sigma(target_epsilon, delta, sensitivity)
    multiplier = min_noise_multiplier(
        sample_rate, releases, target_epsilon, delta, accountant, sampling
    )
    return multiplier * sensitivity
