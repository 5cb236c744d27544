r"""The one path from (scheme, q, σ, steps, δ) to ε: ``epsilon_of_history``.

A history is a list of runs ``(noise_multiplier, sample_rate, num_steps)`` of one sampling
scheme (``lightning_dpot.privacy.accounting.analysis.schemes``), the dp-accounting event
``history_event``. Under each
accountant dp-accounting's one-step analysis of the scheme's ``DpEvent`` is composed over the
runs and converted, as its ``RdpAccountant`` / ``PLDAccountant`` compose the history's event (the
tests pin the two equal), with the one-step analyses kept in a ``cache``:

* ``"rdp"``: ``\varepsilon = \mathrm{conv}_\delta\big(\sum_{\text{runs}} T_i\, \rho_\alpha(\sigma_i,
q_i)\big)``, with the one-step curve ``\rho_\alpha`` of the scheme
  (``RDP_CURVES``: Mironov, Talwar, Zhang 2019 for Poisson, Wang, Balle, Kasiviswanathan
  2019 for sampling without replacement) and the conversion of Canonne, Kamath, Steinke 2020
  (``rdp_to_epsilon``);
* ``"pld"``: ``\varepsilon(\delta)`` of ``\bigotimes_{\text{runs}} \mathrm{PLD}(\sigma_i,
q_i)^{\otimes T_i}`` (``PLDS``: Poisson only;
  ``pld_to_epsilon``).

Every ε of a subsampled Gaussian history in the package goes through ``epsilon_of_history``:
the stateful accountants (``lightning_dpot.privacy.accounting.accountants``, which keep the
one-step analyses in a ``cache``), the step search of
``lightning_dpot.privacy.accounting.calibration`` and ``subsampled_gaussian_epsilon``.
The σ search there is dp-accounting's ``calibrate_dp_mechanism`` on the same events and
accountant settings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, MutableMapping, Sequence
from typing import Any

import numpy as np
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from lightning_dpot.checks import check_delta, check_positive
from lightning_dpot.privacy.accounting.analysis.conversions import pld_to_epsilon, rdp_to_epsilon
from lightning_dpot.privacy.accounting.analysis.pld import poisson_gaussian_pld
from lightning_dpot.privacy.accounting.analysis.rdp_poisson import poisson_gaussian_rdp
from lightning_dpot.privacy.accounting.analysis.rdp_swor import swor_gaussian_rdp
from lightning_dpot.privacy.accounting.analysis.schemes import (
    DEFAULT_PLD_VALUE_DISCRETIZATION,
    DEFAULT_RDP_ORDERS,
    POISSON,
    WITHOUT_REPLACEMENT,
    check_orders,
    check_sampling,
    compress_history,
)

RDP_CURVES: dict[str, Callable[[float, float, Sequence[float]], np.ndarray]] = {
    POISSON: poisson_gaussian_rdp,
    WITHOUT_REPLACEMENT: swor_gaussian_rdp,
}
"""Sampling scheme -> one-step RDP curve ``(σ, q, orders) -> ρ``."""

PLDS: dict[str, Callable[[float, float, float], PrivacyLossDistribution]] = {
    POISSON: poisson_gaussian_pld,
}
"""Sampling scheme -> one-step PLD ``(σ, q, value_discretization_interval)`` (dp-accounting 0.6
has none for sampling without replacement)."""

ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld")
"""Names accepted by every ``accountant=`` argument."""

SAMPLINGS_OF: dict[str, tuple[str, ...]] = {"rdp": tuple(RDP_CURVES), "pld": tuple(PLDS)}
"""Accountant -> the sampling schemes it can analyse."""

StepCache = MutableMapping[tuple[float, float], Any]
"""``(σ, q) -> one-step analysis`` (RDP curve or PLD) of one accountant, scheme and setting."""


def check_accountant(accountant: str, sampling: str = POISSON) -> str:
    """``accountant`` must be in ``ACCOUNTANTS`` and able to analyse ``sampling``."""
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {list(ACCOUNTANTS)}, got {accountant!r}")
    if check_sampling(sampling) not in SAMPLINGS_OF[accountant]:
        able = [name for name in ACCOUNTANTS if sampling in SAMPLINGS_OF[name]]
        raise ValueError(
            f"accountant must be one of {able} for sampling {sampling!r} (dp-accounting has no "
            f"{accountant.upper()} analysis of it), got {accountant!r}"
        )
    return accountant


def epsilon_of_history(
    runs: Iterable[Sequence[float]],
    delta: float,
    accountant: str = "rdp",
    sampling: str = POISSON,
    *,
    orders: Sequence[float] = DEFAULT_RDP_ORDERS,
    value_discretization_interval: float = DEFAULT_PLD_VALUE_DISCRETIZATION,
    cache: StepCache | None = None,
) -> float:
    """ε at ``delta`` of the composition of ``runs`` of subsampled Gaussian steps.

    Args:
        runs: ``(noise_multiplier, sample_rate, num_steps)`` triples of one scheme, composed in
            any order (validated and merged by
            ``compress_history``).
        delta: target δ in (0, 1).
        accountant: ``"rdp"`` (over ``orders``) or ``"pld"`` (with
            ``value_discretization_interval``; Poisson sampling only).
        sampling: ``"poisson"`` (add/remove-one) or ``"without_replacement"`` (replace-one,
            ``sample_rate = b/n``).
        cache: where to keep the one-step analysis of each ``(σ, q)``, for callers that
            evaluate many histories with the same accountant, scheme and settings (the
            stateful accountants, the searches); it must not be shared across those.

    Returns:
        ε ≥ 0 (0 for an empty history) under the adjacency of ``sampling``.
    """
    delta = check_delta("delta", delta)
    accountant = check_accountant(accountant, sampling)
    merged = compress_history(runs)
    if not merged:
        return 0.0
    steps: StepCache = {} if cache is None else cache
    if accountant == "rdp":
        orders = check_orders(orders)
        curve = RDP_CURVES[sampling]
        for sigma, q, _ in merged:
            if (sigma, q) not in steps:
                steps[(sigma, q)] = curve(sigma, q, orders)
        return rdp_to_epsilon(sum(count * steps[(s, q)] for s, q, count in merged), delta, orders)
    interval = check_positive("value_discretization_interval", value_discretization_interval)
    base = PLDS[sampling]
    composed: PrivacyLossDistribution | None = None
    for sigma, q, count in merged:
        if (sigma, q) not in steps:
            steps[(sigma, q)] = base(sigma, q, interval)
        pld = steps[(sigma, q)].self_compose(count)
        composed = pld if composed is None else composed.compose(pld)
    assert composed is not None  # merged is not empty
    return pld_to_epsilon(composed, delta)


def subsampled_gaussian_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str = "rdp",
    sampling: str = POISSON,
) -> float:
    """ε at ``delta`` after ``steps`` identical steps of multiplier σ and rate q (b/n without
    replacement): ``epsilon_of_history`` of one run. ``steps = 0`` gives 0."""
    return epsilon_of_history([(noise_multiplier, sample_rate, steps)], delta, accountant, sampling)
