r"""Stateful privacy accountants: record the subsampled Gaussian steps a run released, report ε.

As in Opacus (``opacus/accountants/rdp.py`` beside ``opacus/accountants/analysis``), these
objects only keep the bookkeeping: a history of runs ``(noise_multiplier, sample_rate,
num_steps)`` of one sampling scheme, saved in checkpoints. Every ε they report is
``epsilon_of_history`` of that history (the
mathematics, the adjacency relations and the references are in
``lightning_dpot.privacy.accounting.analysis``): dp-accounting's public ``RdpAccountant`` /
privacy loss distributions applied to the history's ``DpEvent``\ s
(``lightning_dpot.privacy.accounting.analysis.dp_events``). Each accountant keeps the
one-step analysis of every distinct (σ, q) in a cache of its own, so ε after any number of steps
is cheap.

* ``RDPAccountant``: Rényi DP (Mironov, Talwar, Zhang 2019 for Poisson sampling; Wang,
  Balle, Kasiviswanathan 2019 for sampling without replacement), converted by Canonne, Kamath,
  Steinke 2020 (Prop. 12);
* ``PLDAccountant``: privacy loss distributions (Doroshenko et al. 2022), tighter, Poisson
  sampling only.

An accountant records one scheme for its whole history (``PrivacyAccountant.sampling``,
saved in ``PrivacyAccountant.state_dict``): the two adjacency relations differ, so their
runs are never composed together.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from lightning_dpot.checks import check_delta, check_positive
from lightning_dpot.privacy.accounting.analysis.epsilon import (
    SAMPLINGS_OF,
    check_accountant,
    epsilon_of_history,
)
from lightning_dpot.privacy.accounting.analysis.schemes import (
    DEFAULT_PLD_VALUE_DISCRETIZATION,
    DEFAULT_RDP_ORDERS,
    POISSON,
    SAMPLINGS,
    Run,
    check_orders,
    check_run,
    check_sampling,
    compress_history,
)
from lightning_dpot.privacy.accounting.calibration import DEFAULT_SEARCH_LIMIT, largest_count_within


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
    """Accountant name, a key of ``make_accountant``."""
    samplings: ClassVar[tuple[str, ...]]
    """Sampling schemes this accountant can analyse."""
    _STATE_VERSION: ClassVar[int] = 1

    def __init__(self, sampling: str = POISSON) -> None:
        self._history: list[Run] = []
        self._steps = 0
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
        """Name of the composed mechanism (depends on ``sampling``)."""
        return SAMPLINGS[self._sampling][0]

    @property
    def adjacency(self) -> str:
        """Neighbouring relation of the guarantee: ``"add_or_remove_one"`` for Poisson sampling,
        ``"replace_one"`` for sampling without replacement."""
        return SAMPLINGS[self._sampling][1]

    # -- recording ----------------------------------------------------------------------------

    def step(self, noise_multiplier: float, sample_rate: float, num_steps: int = 1) -> None:
        """Record ``num_steps`` steps with multiplier σ and rate q (b/n without replacement).

        O(1): a step like the last run's extends it in place (a run of 10⁶ identical steps is
        one entry), so recording costs the same at step 10 and step 10⁶."""
        sigma, q, count = check_run(noise_multiplier, sample_rate, num_steps)
        if count == 0:
            return
        if self._history and self._history[-1][:2] == (sigma, q):
            self._history[-1] = (sigma, q, self._history[-1][2] + count)
        else:
            self._history.append((sigma, q, count))
        self._steps += count

    @property
    def history(self) -> list[Run]:
        """Copy of the recorded runs ``(noise_multiplier, sample_rate, num_steps)``."""
        return list(self._history)

    @property
    def steps(self) -> int:
        """Total number of recorded steps."""
        return self._steps

    # -- ε --------------------------------------------------------------------------------------

    @abstractmethod
    def _epsilon_of_history(self, runs: Sequence[Run], delta: float) -> float:
        """ε at ``delta`` of ``runs`` (already validated and compressed)."""

    def get_epsilon(self, delta: float) -> float:
        """ε at ``delta`` of everything recorded so far (0 before the first step)."""
        return self._epsilon_of_history(self._history, check_delta("delta", delta))

    def epsilon_if(
        self, delta: float, noise_multiplier: float, sample_rate: float, num_steps: int = 1
    ) -> float:
        """ε at ``delta`` if ``num_steps`` more steps of (σ, q) were recorded; no side effect."""
        runs = compress_history([*self._history, (noise_multiplier, sample_rate, num_steps)])
        return self._epsilon_of_history(runs, check_delta("delta", delta))

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
        sigma, q, _ = check_run(noise_multiplier, sample_rate, 1)
        delta = check_delta("delta", delta)
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
        """Restore the history from ``state_dict``.

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
        saved = self._history
        self._history = []
        try:
            self.sampling = sampling
        except ValueError:
            self._history = saved
            raise
        self._history = history
        self._steps = sum(count for _, _, count in history)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(sampling={self._sampling!r}, steps={self.steps}, "
            f"history={self._history!r})"
        )


class RDPAccountant(PrivacyAccountant):
    """Rényi-DP accountant (``lightning_dpot.privacy.accounting.analysis``: the SGM's RDP, or the
    subsampled Gaussian without replacement's when ``sampling="without_replacement"``).

    The one-step RDP curve of each distinct (σ, q) (dp-accounting's ``RdpAccountant`` on the
    step's ``DpEvent``, 20-700 ms) is computed once and cached on the instance, so ε after any
    number of steps costs one conversion (~0.2 ms), cheap enough to log every training step.
    """

    name = "rdp"
    samplings = SAMPLINGS_OF["rdp"]

    def __init__(
        self, orders: Sequence[float] = DEFAULT_RDP_ORDERS, sampling: str = POISSON
    ) -> None:
        self.orders = check_orders(orders)
        self._curves: dict[tuple[float, float], np.ndarray] = {}
        super().__init__(sampling)

    def _sampling_changed(self) -> None:
        self._curves.clear()

    def _epsilon_of_history(self, runs: Sequence[Run], delta: float) -> float:
        return epsilon_of_history(
            runs, delta, self.name, self.sampling, orders=self.orders, cache=self._curves
        )


class PLDAccountant(PrivacyAccountant):
    """Privacy-loss-distribution accountant (``lightning_dpot.privacy.accounting.analysis.pld``;
    Poisson sampling only: dp-accounting 0.6 has no PLD for sampling without replacement).

    The one-step PLD of each distinct (σ, q) is built once and cached on the instance; ε of a
    history is one FFT self-composition per run (~0.03 s for 160,000 steps of q = 1/1200 and
    σ = 1.5, more for small σ or q near 1) plus the read-out. The last results are cached too.
    """

    name = "pld"
    samplings = SAMPLINGS_OF["pld"]
    _CACHE_SIZE: ClassVar[int] = 64

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

    def _epsilon_of_history(self, runs: Sequence[Run], delta: float) -> float:
        key = (tuple(runs), delta)
        if key not in self._cache:
            if len(self._cache) >= self._CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = epsilon_of_history(
                runs,
                delta,
                self.name,
                self.sampling,
                value_discretization_interval=self.value_discretization_interval,
                cache=self._bases,
            )
        return self._cache[key]


def make_accountant(name: str, **kwargs: Any) -> PrivacyAccountant:
    """A fresh accountant by name: ``"rdp"`` -> ``RDPAccountant``, ``"pld"`` ->
    ``PLDAccountant``; ``kwargs`` go to its constructor."""
    classes: dict[str, type[PrivacyAccountant]] = {"rdp": RDPAccountant, "pld": PLDAccountant}
    return classes[check_accountant(name)](**kwargs)
