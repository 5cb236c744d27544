r"""Privacy accounting for the Poisson-subsampled Gaussian mechanism (SGM).

The mechanism
-------------
One step releases :math:`M(D) = f(S_q(D)) + \mathcal N(0, \sigma^2 \Delta^2 I)` where
:math:`S_q` keeps every record of :math:`D` independently with probability ``sample_rate``
:math:`q` (Poisson sampling, an empty sample is possible), :math:`f` has :math:`\ell_2`
sensitivity :math:`\Delta` and :math:`\sigma` is the ``noise_multiplier`` (noise standard
deviation divided by the sensitivity). Training composes :math:`T` such steps, possibly with
different :math:`(\sigma, q)`; the noise and the sampling are fresh at every step.

Adjacency
---------
Add/remove one record (``dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE``): :math:`D` and
:math:`D'` are adjacent if one is the other with one record added. This is the relation under
which Poisson subsampling amplifies privacy as below; "replace one record" costs up to twice
the sensitivity and is *not* what these numbers certify.

Accountants
-----------
Both accountants are the ones of Google's ``dp-accounting`` library; this module only chooses
their settings and wraps them.

* ``"rdp"`` -- Rényi DP (Mironov 2017). One step of the SGM is :math:`(\alpha, \rho_\alpha)`-RDP
  with, for integer :math:`\alpha \ge 2` (Mironov, Talwar, Zhang 2019, "Rényi Differential
  Privacy of the Sampled Gaussian Mechanism", Sec. 3.3),

  .. math:: \rho_\alpha = \frac{1}{\alpha - 1} \log \sum_{k=0}^{\alpha} \binom{\alpha}{k}
            (1-q)^{\alpha-k} q^k \exp\!\Big(\frac{k^2 - k}{2\sigma^2}\Big),

  and a numerically integrated series for fractional :math:`\alpha`. RDP composes additively,
  :math:`T` steps give :math:`T \rho_\alpha`, and the conversion to :math:`(\varepsilon, \delta)`
  is the improved one of Canonne, Kamath, Steinke 2020 (Prop. 12) / Asoodeh et al. 2021,

  .. math:: \varepsilon = \min_\alpha\; T\rho_\alpha + \log(1 - 1/\alpha)
            - \frac{\log \delta + \log \alpha}{\alpha - 1},

  minimised over :data:`DEFAULT_RDP_ORDERS`. An upper bound on the true :math:`\varepsilon`.
* ``"pld"`` -- privacy loss distributions (Meiser & Mohammadi 2018; Koskela, Jälkö, Honkela
  2020; Doroshenko et al. 2022, "Connect the Dots"). The privacy loss of one step is discretised
  on a grid of width :data:`DEFAULT_PLD_VALUE_DISCRETIZATION` with pessimistic rounding, composed
  :math:`T` times by FFT, and :math:`\varepsilon(\delta)` read off the hockey-stick divergence.
  Also an upper bound (up to the library's truncated tail mass, :math:`e^{-50}` per composition),
  and tighter than RDP: ε = 0.93 vs 1.01 at the paper-002 MNIST setting (σ = 1.5, q = 1/1200,
  T = 160,000, δ = 1e-5), and far smaller for few steps (0.07 vs 0.24 at T = 1,200).

Fixed-size sampling without replacement (replace-one adjacency)
-----------------------------------------------------------------
When each sampled record is released as its own noisy row (the sliced releases of
:mod:`lightning_dpot.methods.dpsw`), the batch size is visible and the add/remove analysis above
does not apply. Those modules draw, at every step, a uniformly random subset of exactly ``b`` of
the ``n`` records (data-independent), and the guarantee is for *replacing* one record (``n`` is
public): a replacement changes at most one released row, so one step is the Gaussian mechanism with
ℓ2 sensitivity Δ on the subsample, i.e. the subsampled Gaussian without replacement with
:math:`\gamma = b/n` and multiplier σ. Its RDP is bounded by Theorem 9 / Theorem 27 of Wang,
Balle, Kasiviswanathan 2019 ("Subsampled Rényi Differential Privacy and Analytical Moments
Accountant", AISTATS), as dp-accounting's ``RdpAccountant`` evaluates it for a
``SampledWithoutReplacementDpEvent(n, b, GaussianDpEvent(σ))`` under
``NeighboringRelation.REPLACE_ONE``, capped order by order at the plain Gaussian's
:math:`\rho_\alpha = \alpha / (2\sigma^2)` (which it is for :math:`b = n`; subsampling never
hurts, see :func:`swor_gaussian_rdp`). dp-accounting 0.6 has **no PLD** analysis of this
event, so only ``"rdp"`` accepts it (:data:`SAMPLINGS`; :func:`swor_gaussian_epsilon`,
:func:`swor_min_noise_multiplier`). An accountant records one scheme for its whole history
(its ``sampling`` attribute, saved in :meth:`PrivacyAccountant.state_dict`): the two adjacency
relations differ, so their runs are never composed together.

Layout
------
Pure functions (:func:`sgm_rdp`, :func:`rdp_to_epsilon`, :func:`sgm_pld`, :func:`pld_to_epsilon`,
:func:`sgm_epsilon`, :func:`sgm_epsilon_of_history`, :func:`sgm_max_steps`,
:func:`sgm_min_noise_multiplier`, :func:`largest_count_within`) hold the mathematics; the
:class:`PrivacyAccountant` classes only record what was released (a history of runs of identical
steps) and call them, as in Opacus (``opacus/accountants/analysis`` vs ``opacus/accountants``).
"""

from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

import dp_accounting
import numpy as np
from dp_accounting.pld import PLDAccountant as _DpaPLDAccountant
from dp_accounting.pld import privacy_loss_distribution as _dpa_pld_module
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from dp_accounting.rdp import RdpAccountant as _DpaRdpAccountant
from dp_accounting.rdp import compute_epsilon as _dpa_rdp_compute_epsilon
from dp_accounting.rdp import rdp_privacy_accountant as _dpa_rdp_module

from lightning_dpot.privacy.validation import (
    check_delta,
    check_epsilon,
    check_nonnegative_int,
    check_positive,
    check_positive_int,
    check_probability,
)

MECHANISM = "poisson_subsampled_gaussian"
"""Name of the mechanism every accountant here composes."""

ADJACENCY = "add_or_remove_one"
"""The neighbouring relation of every Poisson-sampling guarantee computed here."""

POISSON = "poisson"
WITHOUT_REPLACEMENT = "without_replacement"
SAMPLINGS: dict[str, tuple[str, str]] = {
    POISSON: (MECHANISM, ADJACENCY),
    WITHOUT_REPLACEMENT: ("fixed_size_subsampled_gaussian_without_replacement", "replace_one"),
}
"""Sampling scheme -> (mechanism name, adjacency) of the guarantee (module docstring)."""

SWOR_ACCOUNTANTS: tuple[str, ...] = ("rdp",)
"""Accountants with an analysis of sampling without replacement (no PLD in dp-accounting 0.6)."""

DEFAULT_RDP_ORDERS: tuple[float, ...] = tuple(
    [1.0 + x / 10.0 for x in range(1, 100)]  # 1.1, 1.2, ..., 10.9: large ε / small σ
    + [float(a) for a in range(11, 64)]  # 11 ... 63: the paper-002 optimum is α = 18
    + [64.0, 80.0, 96.0, 128.0, 160.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0]  # tiny ε
)
"""Rényi orders α over which ε is minimised: dp-accounting's default grid (1.1-10.9 by 0.1,
11-63) extended with orders up to 1024 for very small ε (large σ, few steps). The optimum must
lie strictly inside the grid for the bound to be tight; :func:`sgm_epsilon` does not warn when it
sits at an end, but at the end points the bound is still valid, only looser."""

DEFAULT_PLD_VALUE_DISCRETIZATION = 1e-4
"""Grid width of the discretised privacy loss (dp-accounting's default). With pessimistic
rounding the error is one-sided (ε over-estimated) and grows with the number of compositions:
1e-3 gives ε = 1.14 instead of 0.93 for σ = 1.5, q = 1/1200, T = 160,000, δ = 1e-5."""

DEFAULT_SEARCH_LIMIT = 10**9
"""Largest number of steps :func:`sgm_max_steps` searches; returned when even that many fit."""

ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld")
"""Names accepted by every ``accountant=`` argument and by :func:`make_accountant`."""

Run = tuple[float, float, int]
"""``(noise_multiplier, sample_rate, num_steps)``: ``num_steps`` identical SGM steps."""


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _check_accountant(accountant: str) -> str:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {list(ACCOUNTANTS)}, got {accountant!r}")
    return accountant


def _check_orders(orders: Sequence[float]) -> tuple[float, ...]:
    orders = tuple(float(a) for a in orders)
    if not orders or any(not math.isfinite(a) or a <= 1.0 for a in orders):
        raise ValueError(f"orders must be a non-empty list of finite numbers > 1, got {orders!r}")
    return orders


def _check_run(noise_multiplier: float, sample_rate: float, num_steps: int) -> Run:
    return (
        check_positive("noise_multiplier", noise_multiplier),
        check_probability("sample_rate", sample_rate),
        check_nonnegative_int("num_steps", num_steps),
    )


def compress_history(runs: Iterable[Sequence[float]]) -> list[Run]:
    """Validate ``(noise_multiplier, sample_rate, num_steps)`` runs and merge neighbours.

    Consecutive runs with the same ``(σ, q)`` are merged and empty runs dropped, so a training
    history of 100,000 identical steps is one run. Composition is commutative, so merging does
    not change ε.
    """
    merged: list[Run] = []
    for item in runs:
        if len(item) != 3:
            raise ValueError(
                f"a history run must be (noise_multiplier, sample_rate, num_steps), got {item!r}"
            )
        sigma, q, count = _check_run(*item)
        if count == 0:
            continue
        if merged and merged[-1][0] == sigma and merged[-1][1] == q:
            merged[-1] = (sigma, q, merged[-1][2] + count)
        else:
            merged.append((sigma, q, count))
    return merged


# --------------------------------------------------------------------------------------------
# Pure functions: the mathematics
# --------------------------------------------------------------------------------------------


def sgm_rdp(
    noise_multiplier: float,
    sample_rate: float,
    orders: Sequence[float] = DEFAULT_RDP_ORDERS,
) -> np.ndarray:
    r"""RDP curve :math:`\alpha \mapsto \rho_\alpha` of ONE step of the SGM.

    The formula is in the module docstring (Mironov, Talwar, Zhang 2019); it is evaluated by
    dp-accounting's ``_compute_rdp_poisson_subsampled_gaussian``, the function its
    ``RdpAccountant`` calls for a ``PoissonSampledDpEvent`` of a ``GaussianDpEvent``. It is a
    private name of that library, so the test-suite pins it against the public accountant.
    Entries may be ``inf`` where the series does not converge; those orders are ignored by
    :func:`rdp_to_epsilon`.
    """
    sigma, q, _ = _check_run(noise_multiplier, sample_rate, 1)
    orders = _check_orders(orders)
    rdp = _dpa_rdp_module._compute_rdp_poisson_subsampled_gaussian(q, sigma, orders)
    return np.asarray(rdp, dtype=np.float64)


def rdp_to_epsilon(
    rdp: Sequence[float], delta: float, orders: Sequence[float] = DEFAULT_RDP_ORDERS
) -> float:
    r"""Convert a (composed) RDP curve to ε at ``delta``.

    :math:`\varepsilon = \min_\alpha \rho_\alpha + \log(1-1/\alpha) - (\log\delta + \log\alpha)
    / (\alpha-1)` (Canonne, Kamath, Steinke 2020, Prop. 12), by dp-accounting's
    ``compute_epsilon``.
    """
    delta = check_delta(delta)
    orders = _check_orders(orders)
    if len(rdp) != len(orders):
        raise ValueError(f"rdp has {len(rdp)} entries but there are {len(orders)} orders")
    if all(r == 0 for r in rdp):
        return 0.0
    epsilon, best = _dpa_rdp_compute_epsilon(orders, rdp, delta)
    if math.isfinite(epsilon) and best in (min(orders), max(orders)):
        # As Opacus does: at the edge of the grid the minimum may lie outside it, so the
        # reported ε (still a valid upper bound) may be loose.
        edge = "largest" if best == max(orders) else "smallest"
        warnings.warn(
            f"the optimal RDP order α={best:g} is the {edge} of the grid "
            f"[{min(orders):g}, {max(orders):g}]: ε is a valid bound but may be loose; extend "
            "the orders (or use the PLD accountant)",
            UserWarning,
            stacklevel=2,
        )
    return float(epsilon)


def _dpa_event(runs: Sequence[Run]) -> dp_accounting.DpEvent:
    """The dp-accounting event of a history: a composition of self-composed SGM steps."""
    return dp_accounting.ComposedDpEvent(
        [
            dp_accounting.SelfComposedDpEvent(
                dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)),
                count,
            )
            for sigma, q, count in runs
        ]
    )


def sgm_pld(
    noise_multiplier: float,
    sample_rate: float,
    value_discretization_interval: float = DEFAULT_PLD_VALUE_DISCRETIZATION,
) -> PrivacyLossDistribution:
    """Privacy loss distribution of ONE SGM step (add/remove one, pessimistic rounding).

    dp-accounting's ``from_gaussian_mechanism(σ, sampling_prob=q)``, the same call its
    ``PLDAccountant`` makes for a ``PoissonSampledDpEvent`` of a ``GaussianDpEvent``. Compose
    with ``.self_compose(T)`` / ``.compose(other)``, read ε with ``.get_epsilon_for_delta(δ)``.
    """
    sigma, q, _ = _check_run(noise_multiplier, sample_rate, 1)
    return _dpa_pld_module.from_gaussian_mechanism(
        standard_deviation=sigma,
        sampling_prob=q,
        value_discretization_interval=check_positive(
            "value_discretization_interval", value_discretization_interval
        ),
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    )


def pld_to_epsilon(
    base: Callable[[float, float], PrivacyLossDistribution], runs: Sequence[Run], delta: float
) -> float:
    """ε at ``delta`` of ``runs``, composing ``base(σ, q).self_compose(count)`` for each run."""
    composed: PrivacyLossDistribution | None = None
    for sigma, q, count in runs:
        pld = base(sigma, q).self_compose(count)
        composed = pld if composed is None else composed.compose(pld)
    if composed is None:
        return 0.0
    return float(max(0.0, composed.get_epsilon_for_delta(check_delta(delta))))


def sgm_epsilon_of_history(
    runs: Iterable[Sequence[float]],
    delta: float,
    accountant: str = "rdp",
    *,
    orders: Sequence[float] = DEFAULT_RDP_ORDERS,
    value_discretization_interval: float = DEFAULT_PLD_VALUE_DISCRETIZATION,
) -> float:
    """ε at ``delta`` of the composition of ``runs`` of SGM steps.

    Args:
        runs: ``(noise_multiplier, sample_rate, num_steps)`` triples, composed in any order.
        delta: target δ in (0, 1).
        accountant: ``"rdp"`` (dp-accounting ``RdpAccountant`` over ``orders``) or ``"pld"``
            (dp-accounting ``PLDAccountant`` with ``value_discretization_interval``).

    Returns:
        ε ≥ 0 (0 for an empty history) of add/remove-one DP.
    """
    delta = check_delta(delta)
    accountant = _check_accountant(accountant)
    merged = compress_history(runs)
    if not merged:
        return 0.0
    if accountant == "rdp":
        dpa: dp_accounting.PrivacyAccountant = _DpaRdpAccountant(
            orders=list(_check_orders(orders)),
            neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        )
    else:
        dpa = _DpaPLDAccountant(
            neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
            value_discretization_interval=check_positive(
                "value_discretization_interval", value_discretization_interval
            ),
        )
    dpa.compose(_dpa_event(merged))
    return float(max(0.0, dpa.get_epsilon(delta)))


def sgm_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str = "rdp",
) -> float:
    """ε at ``delta`` after ``steps`` SGM steps with multiplier σ and Poisson rate q.

    ``steps = 0`` gives 0. See the module docstring for the mechanism, the adjacency and the
    accountants.
    """
    return sgm_epsilon_of_history([(noise_multiplier, sample_rate, steps)], delta, accountant)


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
    target_epsilon = check_epsilon(target_epsilon, "target_epsilon")
    search_limit = check_positive_int("search_limit", search_limit)
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


def sgm_max_steps(
    noise_multiplier: float,
    sample_rate: float,
    target_epsilon: float,
    delta: float,
    accountant: str = "rdp",
    search_limit: int = DEFAULT_SEARCH_LIMIT,
) -> int:
    """Largest number of SGM steps T with ε(T) ≤ ``target_epsilon`` at ``delta``.

    0 if a single step already exceeds the target; ``search_limit`` if that many steps fit
    (ε grows without bound in T, but for huge σ it may need more than ``search_limit`` steps).
    Exact for the chosen accountant: ε(T) ≤ target < ε(T + 1) (for ``"pld"`` up to the
    monotonicity of the discretised composition, which holds in practice).
    """
    sigma, q, _ = _check_run(noise_multiplier, sample_rate, 1)
    target_epsilon = check_epsilon(target_epsilon, "target_epsilon")
    delta = check_delta(delta)
    accountant = _check_accountant(accountant)
    if accountant == "rdp":
        curve = sgm_rdp(sigma, q)

        def epsilon_of_count(count: int) -> float:
            return rdp_to_epsilon(count * curve, delta)
    else:
        base = sgm_pld(sigma, q)

        def epsilon_of_count(count: int) -> float:
            return pld_to_epsilon(lambda *_: base, [(sigma, q, count)], delta)

    return largest_count_within(epsilon_of_count, target_epsilon, search_limit)


def sgm_min_noise_multiplier(
    sample_rate: float,
    steps: int,
    target_epsilon: float,
    delta: float,
    accountant: str = "rdp",
    tolerance: float = 1e-3,
    max_noise_multiplier: float = 1e4,
) -> float:
    """Smallest noise multiplier σ (to within ``tolerance``) with ε ≤ ``target_epsilon``.

    ε is decreasing in σ. Galloping brackets the answer, bisection narrows it until the bracket
    is narrower than ``tolerance`` (absolute, in units of σ). The returned σ is the upper end of
    the final bracket, so it always satisfies the target: ``sgm_epsilon(σ, q, T, δ) <=
    target_epsilon`` and ``σ - tolerance`` does not (unless σ is the smallest value searched,
    ``tolerance``). For ``"rdp"`` galloping starts at σ = 1 with ratio 2; for ``"pld"`` (each
    evaluation is a full PLD composition, slow for small σ) it starts at the RDP answer with
    ratio 1.1, since PLD is the tighter accountant and its σ is usually a few % below.

    Raises:
        ValueError: if even ``max_noise_multiplier`` does not reach the target.
    """
    q = check_probability("sample_rate", sample_rate)
    steps = check_positive_int("steps", steps)
    target_epsilon = check_epsilon(target_epsilon, "target_epsilon")
    delta = check_delta(delta)
    accountant = _check_accountant(accountant)
    tolerance = check_positive("tolerance", tolerance)
    max_noise_multiplier = check_positive("max_noise_multiplier", max_noise_multiplier)

    def fits(sigma: float) -> bool:
        return sgm_epsilon(sigma, q, steps, delta, accountant) <= target_epsilon

    if accountant == "rdp":
        start, ratio = 1.0, 2.0
    else:
        start = sgm_min_noise_multiplier(
            q, steps, target_epsilon, delta, "rdp", tolerance, max_noise_multiplier
        )
        ratio = 1.1
    return _smallest_fitting_sigma(
        fits,
        start,
        ratio,
        tolerance,
        max_noise_multiplier,
        f"target_epsilon={target_epsilon!r} is not reached at delta={delta!r} with "
        f"sample_rate={q!r} and steps={steps!r} even with noise_multiplier="
        f"{max_noise_multiplier!r}; lower the sample rate or the number of steps",
    )


def _smallest_fitting_sigma(
    fits: Callable[[float], bool],
    start: float,
    ratio: float,
    tolerance: float,
    max_noise_multiplier: float,
    unreachable: str,
) -> float:
    """Smallest σ with ``fits(σ)`` (ε decreasing in σ), to within ``tolerance`` from above:
    gallop from ``start`` by ``ratio`` to bracket it, then bisect. Raises ``ValueError`` with
    ``unreachable`` if even ``max_noise_multiplier`` does not fit."""
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
                raise ValueError(unreachable)
            low, high = high, min(high * ratio, max_noise_multiplier)
    while high - low > tolerance:  # invariant: not fits(low), fits(high)
        mid = 0.5 * (low + high)
        if fits(mid):
            high = mid
        else:
            low = mid
    return high


def check_sampling(sampling: str) -> str:
    """``sampling`` must be a key of :data:`SAMPLINGS`."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {list(SAMPLINGS)}, got {sampling!r}")
    return sampling


def swor_sample_rate(dataset_size: int, batch_size: int) -> float:
    """``b / n`` after checking ``1 <= batch_size <= dataset_size``."""
    n = check_positive_int("dataset_size", dataset_size)
    b = check_positive_int("batch_size", batch_size)
    if b > n:
        raise ValueError(f"batch_size must be in [1, dataset_size={n}], got {b!r}")
    return b / n


def swor_gaussian_rdp(
    noise_multiplier: float, sample_rate: float, orders: Sequence[float] = DEFAULT_RDP_ORDERS
) -> np.ndarray:
    r"""RDP curve of ONE step of the Gaussian on a fixed-size subsample without replacement.

    Replace-one adjacency, sampling ratio :math:`\gamma = b/n` (``sample_rate``), multiplier σ:
    the bound of Wang, Balle, Kasiviswanathan 2019 (Thm. 9 with the Gaussian's RDP
    :math:`\alpha/(2\sigma^2)`), evaluated by dp-accounting's
    ``_compute_rdp_sample_wor_gaussian``, the function its ``RdpAccountant`` calls for a
    ``SampledWithoutReplacementDpEvent`` (which only uses ``b/n``); a private name, so the tests
    pin it against the public ``RdpAccountant``.

    The result is capped, order by order, at the RDP of the Gaussian without subsampling,
    :math:`\alpha / (2\sigma^2)`: for γ close to 1 the bound of Wang et al. is loose and exceeds
    it (e.g. 332 vs 124 at σ = 1.2, T = 200, γ = 0.999, δ = 1e-5), while subsampling never
    increases the Rényi divergence (couple the two subsamples so they differ in at most one
    record; Rényi divergence is jointly quasi-convex, van Erven & Harremoës 2014, Thm. 13). Both
    are valid upper bounds, so is their minimum. For :math:`\gamma = 1` it equals
    :math:`\alpha / (2\sigma^2)`.
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    q = check_probability("sample_rate", sample_rate)
    orders = _check_orders(orders)
    rdp = np.asarray(
        _dpa_rdp_module._compute_rdp_sample_wor_gaussian(q, sigma, orders), dtype=np.float64
    )
    return np.minimum(rdp, np.asarray(orders) / (2.0 * sigma**2))


def swor_gaussian_epsilon(
    noise_multiplier: float,
    dataset_size: int,
    batch_size: int,
    steps: int,
    delta: float,
    accountant: str = "rdp",
) -> float:
    """ε at ``delta`` (replace-one) after ``steps`` Gaussian releases with multiplier σ of
    fixed-size batches of ``batch_size`` records drawn without replacement from
    ``dataset_size`` (module docstring): ``steps`` times the curve of :func:`swor_gaussian_rdp`
    (dp-accounting's replace-one bound, capped at the unsubsampled Gaussian), converted by
    :func:`rdp_to_epsilon` over :data:`DEFAULT_RDP_ORDERS`; ``accountant`` must be ``"rdp"``
    (dp-accounting has no PLD for it)."""
    sigma = check_positive("noise_multiplier", noise_multiplier)
    n = check_positive_int("dataset_size", dataset_size)
    b = check_positive_int("batch_size", batch_size)
    swor_sample_rate(n, b)
    steps = check_nonnegative_int("steps", steps)
    delta = check_delta(delta)
    _check_swor_accountant(accountant)
    if steps == 0:
        return 0.0
    return rdp_to_epsilon(steps * swor_gaussian_rdp(sigma, b / n), delta)


def _check_swor_accountant(accountant: str) -> str:
    if _check_accountant(accountant) not in SWOR_ACCOUNTANTS:
        raise ValueError(
            f"accountant must be one of {list(SWOR_ACCOUNTANTS)} for sampling "
            f"{WITHOUT_REPLACEMENT!r} (dp-accounting has no PLD analysis of it), got {accountant!r}"
        )
    return accountant


def swor_min_noise_multiplier(
    dataset_size: int,
    batch_size: int,
    steps: int,
    target_epsilon: float,
    delta: float,
    accountant: str = "rdp",
    tolerance: float = 1e-3,
    max_noise_multiplier: float = 1e4,
) -> float:
    """Smallest σ (within ``tolerance``, from above) with
    ``swor_gaussian_epsilon(σ, n, b, steps, delta) <= target_epsilon``.

    Galloping from σ = 1 (ratio 2) then bisection, as :func:`sgm_min_noise_multiplier`.

    Raises:
        ValueError: if even ``max_noise_multiplier`` does not reach the target.
    """
    q = swor_sample_rate(dataset_size, batch_size)
    steps = check_positive_int("steps", steps)
    target_epsilon = check_epsilon(target_epsilon, "target_epsilon")
    delta = check_delta(delta)
    _check_swor_accountant(accountant)
    tolerance = check_positive("tolerance", tolerance)
    max_noise_multiplier = check_positive("max_noise_multiplier", max_noise_multiplier)

    def fits(sigma: float) -> bool:
        return rdp_to_epsilon(steps * swor_gaussian_rdp(sigma, q), delta) <= target_epsilon

    return _smallest_fitting_sigma(
        fits,
        1.0,
        2.0,
        tolerance,
        max_noise_multiplier,
        f"target_epsilon={target_epsilon!r} is not reached at delta={delta!r} with "
        f"batch_size={batch_size!r} of dataset_size={dataset_size!r} and steps={steps!r} even "
        f"with noise_multiplier={max_noise_multiplier!r}; lower the batch size or the number of "
        "steps",
    )


# --------------------------------------------------------------------------------------------
# Stateful accountants: the bookkeeping
# --------------------------------------------------------------------------------------------


class PrivacyAccountant(ABC):
    """Records the subsampled-Gaussian steps a training run released and reports their ε.

    ``sampling`` (``"poisson"``, add/remove-one, or ``"without_replacement"``, fixed-size
    batches under replace-one with ``sample_rate = b/n``) is one scheme for the whole history.
    The history is a list of runs ``(noise_multiplier, sample_rate, num_steps)`` of identical
    steps (so 100,000 identical steps cost one entry). Subclasses only say how ε is computed
    from a history; everything else (validation, the history, checkpoint state, "what if"
    queries, the remaining budget) is shared.
    """

    name: ClassVar[str]
    """Accountant name, a key of :func:`make_accountant`."""
    samplings: ClassVar[tuple[str, ...]] = tuple(SAMPLINGS)
    """Sampling schemes this accountant can analyse."""
    _STATE_VERSION: ClassVar[int] = 1

    def __init__(self, sampling: str = POISSON) -> None:
        self._history: list[Run] = []
        self._sampling = POISSON
        self.sampling = sampling

    # -- sampling scheme ------------------------------------------------------------------------

    @property
    def sampling(self) -> str:
        """Sampling scheme of every recorded step: ``"poisson"`` (add/remove-one) or
        ``"without_replacement"`` (fixed size, replace-one; the run's ``sample_rate`` is b/n)."""
        return self._sampling

    @sampling.setter
    def sampling(self, sampling: str) -> None:
        check_sampling(sampling)
        if sampling not in self.samplings:
            raise ValueError(
                f"sampling={sampling!r} is not supported by the {self.name!r} accountant "
                f"(accepted: {list(self.samplings)})"
            )
        if self._history and sampling != self._sampling:
            raise ValueError(
                f"sampling={sampling!r} differs from the {self._sampling!r} of the "
                f"{self.steps} recorded steps: the two schemes use different adjacency relations "
                "and cannot be composed into one guarantee"
            )
        if sampling != self._sampling:
            self._sampling = sampling
            self._sampling_changed()

    def _sampling_changed(self) -> None:
        """Drop caches that depend on the sampling scheme (subclasses)."""
        return None

    @property
    def mechanism(self) -> str:
        """Name of the composed mechanism (depends on :attr:`sampling`)."""
        return SAMPLINGS[self._sampling][0]

    @property
    def adjacency(self) -> str:
        """Neighbouring relation of the guarantee: ``"add_or_remove_one"`` for Poisson sampling,
        ``"replace_one"`` for sampling without replacement."""
        return SAMPLINGS[self._sampling][1]

    # -- recording ----------------------------------------------------------------------------

    def step(self, noise_multiplier: float, sample_rate: float, num_steps: int = 1) -> None:
        """Record ``num_steps`` SGM steps with multiplier σ and Poisson rate q."""
        run = (noise_multiplier, sample_rate, num_steps)
        self._history = compress_history([*self._history, run])

    @property
    def history(self) -> list[Run]:
        """Copy of the recorded runs ``(noise_multiplier, sample_rate, num_steps)``."""
        return list(self._history)

    @property
    def steps(self) -> int:
        """Total number of recorded steps."""
        return sum(count for _, _, count in self._history)

    # -- ε --------------------------------------------------------------------------------------

    @abstractmethod
    def _epsilon_of_history(self, runs: Sequence[Run], delta: float) -> float:
        """ε at ``delta`` of ``runs`` (already validated and compressed)."""

    def get_epsilon(self, delta: float) -> float:
        """ε at ``delta`` of everything recorded so far (0 before the first step)."""
        return self._epsilon_of_history(self._history, check_delta(delta))

    def epsilon_if(
        self, delta: float, noise_multiplier: float, sample_rate: float, num_steps: int = 1
    ) -> float:
        """ε at ``delta`` if ``num_steps`` more steps of (σ, q) were recorded; no side effect."""
        runs = compress_history([*self._history, (noise_multiplier, sample_rate, num_steps)])
        return self._epsilon_of_history(runs, check_delta(delta))

    def max_additional_steps(
        self,
        noise_multiplier: float,
        sample_rate: float,
        target_epsilon: float,
        delta: float,
        search_limit: int = DEFAULT_SEARCH_LIMIT,
    ) -> int:
        """Largest k such that k more steps of (σ, q) keep ε ≤ ``target_epsilon``.

        0 when the next step would already exceed the target (or the history alone does).
        """
        sigma, q, _ = _check_run(noise_multiplier, sample_rate, 1)
        delta = check_delta(delta)
        return largest_count_within(
            lambda count: self.epsilon_if(delta, sigma, q, count), target_epsilon, search_limit
        )

    # -- checkpoint state ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state: the history (plus names, for the reader)."""
        return {
            "version": self._STATE_VERSION,
            "accountant": self.name,
            "mechanism": self.mechanism,
            "adjacency": self.adjacency,
            "sampling": self.sampling,
            "history": [[sigma, q, count] for sigma, q, count in self._history],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the history from :meth:`state_dict`.

        The history describes what was released, not how it is accounted, so a state written by
        one accountant may be loaded into another (e.g. switch RDP to PLD on resume).
        """
        sampling = check_sampling(state_dict.get("sampling", POISSON))  # v1 states: Poisson
        mechanism, adjacency = SAMPLINGS[sampling]
        if state_dict.get("mechanism", mechanism) != mechanism:
            raise ValueError(
                f"state_dict describes mechanism {state_dict.get('mechanism')!r}, "
                f"sampling {sampling!r} composes {mechanism!r}"
            )
        if state_dict.get("adjacency", adjacency) != adjacency:
            raise ValueError(
                f"state_dict uses adjacency {state_dict.get('adjacency')!r}, expected "
                f"{adjacency!r} for sampling {sampling!r}"
            )
        if "history" not in state_dict:
            raise ValueError("state_dict has no 'history' entry")
        history = compress_history(state_dict["history"])
        previous = self._history
        self._history = []
        try:
            self.sampling = sampling
        except ValueError:
            self._history = previous
            raise
        self._history = history

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sampling={self._sampling!r}, steps={self.steps}, "
            f"history={self._history!r})"
        )


class RDPAccountant(PrivacyAccountant):
    """Rényi-DP accountant (dp-accounting's RDP analysis of the SGM, or of the subsampled
    Gaussian without replacement when ``sampling="without_replacement"``; module docstring).

    The one-step RDP curve of each distinct (σ, q) is computed once and cached on the instance,
    so ε after any number of steps costs one conversion (~0.2 ms), cheap enough to log every
    training step.
    """

    name = "rdp"

    def __init__(
        self, orders: Sequence[float] = DEFAULT_RDP_ORDERS, sampling: str = POISSON
    ) -> None:
        self.orders = _check_orders(orders)
        self._curves: dict[tuple[float, float], np.ndarray] = {}
        super().__init__(sampling)

    def _sampling_changed(self) -> None:
        self._curves.clear()

    def _curve(self, sigma: float, q: float) -> np.ndarray:
        if (sigma, q) not in self._curves:
            curve = swor_gaussian_rdp if self.sampling == WITHOUT_REPLACEMENT else sgm_rdp
            self._curves[(sigma, q)] = curve(sigma, q, self.orders)
        return self._curves[(sigma, q)]

    def _epsilon_of_history(self, runs: Sequence[Run], delta: float) -> float:
        if not runs:
            return 0.0
        total = sum(count * self._curve(sigma, q) for sigma, q, count in runs)
        return rdp_to_epsilon(total, delta, self.orders)


class PLDAccountant(PrivacyAccountant):
    """Privacy-loss-distribution accountant (dp-accounting's PLD analysis of the SGM).

    The one-step PLD of each distinct (σ, q) (:func:`sgm_pld`) is built once and cached on the
    instance; ε of a history is one FFT self-composition per run (~0.03 s for 160,000 steps of
    q = 1/1200 and σ = 1.5, more for small σ or q near 1) plus the read-out. The last results
    are cached too. Equal to :func:`sgm_epsilon_of_history` with ``"pld"``, which goes through
    dp-accounting's ``PLDAccountant``.
    """

    name = "pld"
    _CACHE_SIZE: ClassVar[int] = 64

    samplings = (POISSON,)  # dp-accounting 0.6 has no PLD for sampling without replacement

    def __init__(
        self,
        value_discretization_interval: float = DEFAULT_PLD_VALUE_DISCRETIZATION,
        sampling: str = POISSON,
    ) -> None:
        super().__init__(sampling)
        self.value_discretization_interval = check_positive(
            "value_discretization_interval", value_discretization_interval
        )
        self._bases: dict[tuple[float, float], PrivacyLossDistribution] = {}
        self._cache: dict[tuple[tuple[Run, ...], float], float] = {}

    def _base(self, sigma: float, q: float) -> PrivacyLossDistribution:
        if (sigma, q) not in self._bases:
            self._bases[(sigma, q)] = sgm_pld(sigma, q, self.value_discretization_interval)
        return self._bases[(sigma, q)]

    def _epsilon_of_history(self, runs: Sequence[Run], delta: float) -> float:
        key = (tuple(runs), delta)
        if key not in self._cache:
            if len(self._cache) >= self._CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = pld_to_epsilon(self._base, runs, delta)
        return self._cache[key]


def make_accountant(name: str, **kwargs: Any) -> PrivacyAccountant:
    """A fresh accountant by name: ``"rdp"`` -> :class:`RDPAccountant`, ``"pld"`` ->
    :class:`PLDAccountant`; ``kwargs`` go to its constructor."""
    classes: dict[str, type[PrivacyAccountant]] = {"rdp": RDPAccountant, "pld": PLDAccountant}
    return classes[_check_accountant(name)](**kwargs)
