r"""From a composed RDP curve or PLD to ``(\varepsilon, \delta)``.

RDP
---
A mechanism that is ``(\alpha, \rho_\alpha)``-RDP for every order ``\alpha`` of a grid
is ``(\varepsilon, \delta)``-DP with the improved conversion of Canonne, Kamath, Steinke 2020
(Prop. 12) / Asoodeh et al. 2021,

.. math:: \varepsilon = \min_\alpha\; \rho_\alpha + \log(1 - 1/\alpha)
          - \frac{\log \delta + \log \alpha}{\alpha - 1},

minimised over the grid
(``DEFAULT_RDP_ORDERS``).
An upper bound on the true ε. When the minimum sits at an end of the grid it may lie outside
it, so ε (still valid) may be loose: ``rdp_to_epsilon`` warns, as Opacus does.

PLD
---
``\varepsilon(\delta)`` of a composed privacy loss distribution is the smallest ε whose
hockey-stick divergence ``\mathbb E[(1 - e^{\varepsilon - L})_+]`` is at most δ, computed by
dp-accounting on the discretised (pessimistic) distribution.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from dp_accounting.rdp import compute_epsilon

from lightning_dpot.checks import check_delta
from lightning_dpot.privacy.accounting.analysis.schemes import DEFAULT_RDP_ORDERS, check_orders


class RDPOrderEdgeWarning(UserWarning):
    """The optimal RDP order is at the edge of the grid: ε is valid but may be loose."""


def rdp_to_epsilon(
    rdp: Sequence[float], delta: float, orders: Sequence[float] = DEFAULT_RDP_ORDERS
) -> float:
    r"""Convert a (composed) RDP curve to ε at ``delta``.

    ``\varepsilon = \min_\alpha \rho_\alpha + \log(1-1/\alpha) - (\log\delta + \log\alpha) /
    (\alpha-1)`` (Canonne, Kamath, Steinke 2020, Prop. 12), by dp-accounting's
    ``compute_epsilon``. Warns (``RDPOrderEdgeWarning``) when the optimal order is the
    smallest or the largest of ``orders``.
    """
    delta = check_delta("delta", delta)
    orders = check_orders(orders)
    if len(rdp) != len(orders):
        raise ValueError(f"rdp has {len(rdp)} entries but there are {len(orders)} orders")
    if all(r == 0 for r in rdp):
        return 0.0
    epsilon, best = compute_epsilon(orders, rdp, delta)
    if math.isfinite(epsilon) and best in (min(orders), max(orders)):
        # As Opacus does: at the edge of the grid the minimum may lie outside it, so the
        # reported ε (still a valid upper bound) may be loose.
        edge = "largest" if best == max(orders) else "smallest"
        warnings.warn(
            f"the optimal RDP order α={best:g} is the {edge} of the grid "
            f"[{min(orders):g}, {max(orders):g}]: ε is a valid bound but may be loose; extend "
            "the orders (or use the PLD accountant)",
            RDPOrderEdgeWarning,
            stacklevel=2,
        )
    return float(epsilon)


def pld_to_epsilon(pld: PrivacyLossDistribution, delta: float) -> float:
    """ε ≥ 0 at ``delta`` of a (composed) privacy loss distribution (module docstring)."""
    return float(max(0.0, pld.get_epsilon_for_delta(check_delta("delta", delta))))
