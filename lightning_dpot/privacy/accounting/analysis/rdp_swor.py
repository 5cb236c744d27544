r"""RDP of one step of the Gaussian on a fixed-size subsample without replacement, replace-one.

One step draws exactly ``b`` of the ``n`` records uniformly at random and adds
``\mathcal N(0, \sigma^2 \Delta^2 I)`` to a function of ℓ2 sensitivity ``\Delta`` under
replace-one adjacency (``lightning_dpot.privacy.accounting.analysis.schemes``). With sampling
ratio ``\gamma = b/n`` (``sample_rate``) its RDP is bounded by Theorem 9 / Theorem 27 of Wang,
Balle, Kasiviswanathan 2019 ("Subsampled Rényi Differential Privacy and Analytical Moments
Accountant", AISTATS) applied to the Gaussian's RDP ``\alpha / (2\sigma^2)``, as
dp-accounting's ``RdpAccountant`` evaluates it for a ``SampledWithoutReplacementDpEvent(n, b,
GaussianDpEvent(σ))`` under ``NeighboringRelation.REPLACE_ONE``.

The bound is capped, order by order, at the RDP of the Gaussian without subsampling,

.. math:: \rho_\alpha \le \frac{\alpha}{2\sigma^2}:

for γ close to 1 the bound of Wang et al. is loose and exceeds it (e.g. ε = 332 vs 124 at
σ = 1.2, T = 200, γ = 0.999, δ = 1e-5), while subsampling never increases the Rényi divergence
(couple the two subsamples so they differ in at most one record; Rényi divergence is jointly
quasi-convex, van Erven & Harremoës 2014, Thm. 13). Both are valid upper bounds, so is their
minimum; for ``\gamma = 1`` it equals ``\alpha / (2\sigma^2)``. dp-accounting 0.6 has
**no PLD** analysis of this event, so only the RDP accountant composes it.
"""

from __future__ import annotations

from collections.abc import Sequence

import dp_accounting
import numpy as np

from lightning_dpot.privacy.accounting.analysis.dp_events import rdp_of_event, step_event
from lightning_dpot.privacy.accounting.analysis.schemes import (
    DEFAULT_RDP_ORDERS,
    WITHOUT_REPLACEMENT,
    check_run,
)


def swor_gaussian_rdp(
    noise_multiplier: float, sample_rate: float, orders: Sequence[float] = DEFAULT_RDP_ORDERS
) -> np.ndarray:
    r"""RDP curve of ONE step of the Gaussian on a fixed-size subsample without replacement.

    The bound of Wang, Balle, Kasiviswanathan 2019 (Thm. 9) at ``\gamma`` = ``sample_rate``
    = b/n, capped at ``\alpha / (2\sigma^2)`` (module docstring): order by order, the
    smaller of dp-accounting's ``RdpAccountant`` curves of
    ``SampledWithoutReplacementDpEvent(n, b, GaussianDpEvent(σ))`` and of
    ``GaussianDpEvent(σ)``, both under replace-one (``rdp_of_event``). No ``DpEvent`` expresses this
    order-wise minimum, so
    histories are composed from the capped curves
    (``epsilon_of_history``).
    """
    sigma, q, _ = check_run(noise_multiplier, sample_rate, 1)
    subsampled = rdp_of_event(
        step_event(sigma, q, WITHOUT_REPLACEMENT), WITHOUT_REPLACEMENT, orders
    )
    plain = rdp_of_event(dp_accounting.GaussianDpEvent(sigma), WITHOUT_REPLACEMENT, orders)
    return np.minimum(subsampled, plain)
