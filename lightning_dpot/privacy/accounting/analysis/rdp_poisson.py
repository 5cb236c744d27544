r"""RDP of one step of the Poisson-subsampled Gaussian mechanism (SGM), add/remove-one.

One step keeps every record with probability ``q`` (``sample_rate``) and adds
``\mathcal N(0, \sigma^2 \Delta^2 I)`` to a function of ℓ2 sensitivity ``\Delta``
(``lightning_dpot.privacy.accounting.analysis.schemes``). It is
``(\alpha, \rho_\alpha)``-RDP (Mironov 2017) with, for integer ``\alpha \ge 2`` (Mironov,
Talwar, Zhang 2019, "Rényi Differential Privacy of the Sampled Gaussian Mechanism", Sec. 3.3),

.. math:: \rho_\alpha = \frac{1}{\alpha - 1} \log \sum_{k=0}^{\alpha} \binom{\alpha}{k}
          (1-q)^{\alpha-k} q^k \exp\!\Big(\frac{k^2 - k}{2\sigma^2}\Big),

and a numerically integrated series for fractional ``\alpha``; ``\rho_\alpha = \alpha /
(2\sigma^2)`` for ``q = 1``. RDP composes additively: ``T`` steps give
``T \rho_\alpha`` (``lightning_dpot.privacy.accounting.analysis.epsilon``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_dpot.privacy.accounting.analysis.dp_events import rdp_of_event, step_event
from lightning_dpot.privacy.accounting.analysis.schemes import DEFAULT_RDP_ORDERS, POISSON


def poisson_gaussian_rdp(
    noise_multiplier: float,
    sample_rate: float,
    orders: Sequence[float] = DEFAULT_RDP_ORDERS,
) -> np.ndarray:
    r"""RDP curve ``\alpha \mapsto \rho_\alpha`` of ONE step of the SGM (module docstring).

    dp-accounting's ``RdpAccountant`` composing ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))``
    under add/remove-one (``rdp_of_event``); the tests pin it against the formula above. Entries may
    be ``inf`` where the
    series does not converge; those orders are ignored by
    ``rdp_to_epsilon``.
    """
    return rdp_of_event(step_event(noise_multiplier, sample_rate, POISSON), POISSON, orders)
