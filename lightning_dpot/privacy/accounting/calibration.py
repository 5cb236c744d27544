r"""Calibration: the largest number of steps, or the smallest noise multiplier, within a target ε.

Both searches work for any sampling scheme and accountant: they only evaluate ε through
:func:`~lightning_dpot.privacy.accounting.analysis.epsilon.epsilon_of_history` (the package's one
path to ε) and use that ε is monotone.

* **Steps.** ε is non-decreasing in the number of composed steps :math:`T`.
  :func:`largest_count_within` finds the largest :math:`T \le` ``search_limit`` with
  :math:`\varepsilon(T) \le \varepsilon^*` by galloping (1, 2, 4, ...) then bisection,
  :math:`O(\log T)` evaluations; the answer is exact, :math:`\varepsilon(T) \le \varepsilon^* <
  \varepsilon(T + 1)`. It returns ``search_limit`` when that many steps fit (ε grows without
  bound in :math:`T`, but for huge σ it may need more) and 0 when one step already exceeds.
  :func:`max_steps` applies it to one (σ, q).
* **Noise.** ε is decreasing in σ. :func:`smallest_noise_multiplier_within` gallops from a
  start by a ratio to bracket the smallest σ with :math:`\varepsilon(\sigma) \le \varepsilon^*`,
  then bisects until the bracket is narrower than ``tolerance`` (absolute, in units of σ). The
  returned σ is the upper end of the final bracket, so it always satisfies the target, and
  ``σ - tolerance`` does not (unless σ ≤ ``tolerance``, the smallest value searched). It raises
  ``ValueError`` when even ``max_noise_multiplier`` misses the target: a search that did not
  converge never returns. :func:`min_noise_multiplier` applies it to (q, T).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

from lightning_dpot.checks import (
    check_delta,
    check_epsilon,
    check_positive,
    check_positive_int,
    check_probability,
)
from lightning_dpot.privacy.accounting.analysis.conversions import RDPOrderEdgeWarning
from lightning_dpot.privacy.accounting.analysis.epsilon import (
    StepCache,
    check_accountant,
    epsilon_of_history,
)
from lightning_dpot.privacy.accounting.analysis.schemes import (
    POISSON,
    check_run,
)

T = TypeVar("T", int, float)

DEFAULT_SEARCH_LIMIT = 10**9
"""Largest number of steps :func:`largest_count_within` searches; returned when even that many
fit."""

DEFAULT_NOISE_TOLERANCE = 1e-3
"""Width of the final bracket of :func:`smallest_noise_multiplier_within`, in units of σ."""

DEFAULT_MAX_NOISE_MULTIPLIER = 1e4
"""Largest σ :func:`smallest_noise_multiplier_within` tries before declaring a target
unreachable."""


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


def smallest_noise_multiplier_within(
    epsilon_of_sigma: Callable[[float], float],
    target_epsilon: float,
    tolerance: float = DEFAULT_NOISE_TOLERANCE,
    max_noise_multiplier: float = DEFAULT_MAX_NOISE_MULTIPLIER,
    start: float = 1.0,
    ratio: float = 2.0,
    unreachable: str = "",
) -> float:
    """Smallest σ with ``epsilon_of_sigma(σ) <= target_epsilon``, to within ``tolerance`` from
    above (module docstring).

    ``epsilon_of_sigma`` must be non-increasing in σ. Galloping from ``start`` by ``ratio``
    brackets the answer, bisection narrows the bracket to ``tolerance``.

    Raises:
        ValueError: if even ``max_noise_multiplier`` does not reach the target (``unreachable``
            is appended to the message: what to change).
    """
    target_epsilon = check_epsilon("target_epsilon", target_epsilon)
    tolerance = check_positive("tolerance", tolerance)
    max_noise_multiplier = check_positive("max_noise_multiplier", max_noise_multiplier)
    start = check_positive("start", start)
    if not ratio > 1.0:
        raise ValueError(f"ratio must be a number > 1, got {ratio!r}")

    epsilon_of_sigma = _quiet_trials(epsilon_of_sigma)

    def fits(sigma: float) -> bool:
        return epsilon_of_sigma(sigma) <= target_epsilon

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
                raise ValueError(
                    f"target_epsilon={target_epsilon!r} is not reached even with "
                    f"noise_multiplier={max_noise_multiplier!r}{unreachable}"
                )
            low, high = high, min(high * ratio, max_noise_multiplier)
    while high - low > tolerance:  # invariant: not fits(low), fits(high)
        mid = 0.5 * (low + high)
        if fits(mid):
            high = mid
        else:
            low = mid
    return high


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

    :func:`largest_count_within` over :func:`~lightning_dpot.privacy.accounting.analysis.epsilon.
    epsilon_of_history` (the one-step analysis is computed once). Exact for the chosen
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

    :func:`smallest_noise_multiplier_within` over
    :func:`~lightning_dpot.privacy.accounting.analysis.epsilon.epsilon_of_history`:
    ``ε(σ) <= target_epsilon`` and ``ε(σ - tolerance) > target_epsilon`` (unless σ ≤ ``tolerance``).
    For ``"rdp"`` galloping starts at σ = 1 with ratio 2; for ``"pld"`` (each evaluation is a full
    PLD composition, slow for small σ) it starts at the RDP answer with ratio 1.1, since PLD is the
    tighter accountant and its σ is usually a few % below.

    Raises:
        ValueError: if even ``max_noise_multiplier`` does not reach the target.
    """
    q = check_probability("sample_rate", sample_rate)
    steps = check_positive_int("steps", steps)
    target_epsilon = check_epsilon("target_epsilon", target_epsilon)
    delta = check_delta("delta", delta)
    accountant = check_accountant(accountant, sampling)

    def epsilon_of_sigma(sigma: float) -> float:
        return epsilon_of_history([(sigma, q, steps)], delta, accountant, sampling)

    if accountant == "rdp":
        start, ratio = 1.0, 2.0
    else:
        start = min_noise_multiplier(
            q, steps, target_epsilon, delta, "rdp", sampling, tolerance, max_noise_multiplier
        )
        ratio = 1.1
    return smallest_noise_multiplier_within(
        epsilon_of_sigma,
        target_epsilon,
        tolerance,
        max_noise_multiplier,
        start,
        ratio,
        f" at delta={delta!r} with sample_rate={q!r} ({sampling} sampling) and steps={steps!r}; "
        "lower the sample rate (batch size) or the number of steps",
    )
