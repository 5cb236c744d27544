r"""The subsampled Gaussian steps as dp-accounting ``DpEvent``\ s, and their one-step RDP curve.

Every analysis of the package is dp-accounting's, reached through its public API: a history of
runs ``(noise_multiplier, sample_rate, num_steps)`` of one scheme
(``lightning_dpot.privacy.accounting.analysis.schemes``) is the event

.. math:: \mathrm{ComposedDpEvent}\big[\mathrm{SelfComposedDpEvent}(E(\sigma_i, q_i), T_i)
          \big]_{\text{runs}},

with the step ``E`` of the scheme (``step_event``):

* ``"poisson"``: ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` under
  ``NeighboringRelation.ADD_OR_REMOVE_ONE``;
* ``"without_replacement"``: ``SampledWithoutReplacementDpEvent(n, b, GaussianDpEvent(σ))``
  with ``b/n = q`` under ``NeighboringRelation.REPLACE_ONE`` (dp-accounting's analysis
  reads only the ratio b/n, Wang, Balle, Kasiviswanathan 2019, Thm. 9).

``rdp_of_event`` is dp-accounting's ``RdpAccountant`` composing an event, read through its
public ``rdp`` property. The accountants call it once per distinct (σ, q) and compose T steps
as ``T\rho_\alpha`` themselves (RDP composes additively, exactly as ``RdpAccountant`` does
for a ``SelfComposedDpEvent``): one step's curve costs 20-700 ms over the default orders, and
the callback reads ε after every training step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fractions import Fraction

import dp_accounting
import numpy as np

from lightning_dpot.privacy.accounting.analysis.schemes import (
    DEFAULT_RDP_ORDERS,
    POISSON,
    WITHOUT_REPLACEMENT,
    check_orders,
    check_run,
    check_sampling,
    compress_history,
)

NEIGHBORING_RELATIONS: dict[str, dp_accounting.NeighboringRelation] = {
    POISSON: dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    WITHOUT_REPLACEMENT: dp_accounting.NeighboringRelation.REPLACE_ONE,
}
"""Sampling scheme -> dp-accounting's neighbouring relation of its guarantee."""


def _batch_fraction(sample_rate: float) -> tuple[int, int]:
    """``(b, n)`` with ``b / n == sample_rate`` exactly: the closest fraction with a denominator
    up to 10⁹ (the run's own b/n for any n below ~10⁷), else the float's exact binary ratio."""
    fraction = Fraction(sample_rate).limit_denominator(10**9)
    if fraction.numerator / fraction.denominator != sample_rate:
        fraction = Fraction(sample_rate)
    return fraction.numerator, fraction.denominator


def step_event(
    noise_multiplier: float, sample_rate: float, sampling: str = POISSON
) -> dp_accounting.DpEvent:
    """The ``DpEvent`` of ONE subsampled Gaussian step of ``sampling`` (module docstring)."""
    sigma, q, _ = check_run(noise_multiplier, sample_rate, 1)
    gaussian = dp_accounting.GaussianDpEvent(sigma)
    if check_sampling(sampling) == POISSON:
        return dp_accounting.PoissonSampledDpEvent(q, gaussian)
    batch_size, dataset_size = _batch_fraction(q)
    return dp_accounting.SampledWithoutReplacementDpEvent(dataset_size, batch_size, gaussian)


def history_event(
    runs: Iterable[Sequence[float]], sampling: str = POISSON
) -> dp_accounting.DpEvent:
    """The ``DpEvent`` of a history: each run ``(σ, q, T)`` is T self-composed steps."""
    return dp_accounting.ComposedDpEvent(
        [
            dp_accounting.SelfComposedDpEvent(step_event(sigma, q, sampling), count)
            for sigma, q, count in compress_history(runs)
        ]
    )


def rdp_of_event(
    event: dp_accounting.DpEvent,
    sampling: str = POISSON,
    orders: Sequence[float] = DEFAULT_RDP_ORDERS,
) -> np.ndarray:
    r"""RDP curve ``\alpha \mapsto \rho_\alpha`` of ``event`` under the relation of
    ``sampling``: dp-accounting's ``RdpAccountant(orders, relation).compose(event).rdp``.
    Entries may be ``inf`` where dp-accounting's series does not converge."""
    accountant = dp_accounting.rdp.RdpAccountant(
        list(check_orders(orders)), NEIGHBORING_RELATIONS[check_sampling(sampling)]
    )
    return np.asarray(accountant.compose(event).rdp, dtype=np.float64)
