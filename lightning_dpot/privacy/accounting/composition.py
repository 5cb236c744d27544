"""What a run released, composed incrementally: O(1) time and memory per event.

A ``Composition`` takes the events a module's release objects emitted
(``lightning_dpot.privacy.events``) one by one and keeps them as the driving accountant's
history of runs ``(σ, q, count)`` (a run of 10⁶ identical steps is one entry), or as the one
one-shot ``GaussianRelease`` of a run that releases once.
Its ε is the accountant's (Rényi DP or privacy loss distributions) for subsampled steps and the
analytic Gaussian mechanism's (Balle & Wang 2018) for a one-shot release, cached per composed
count, so asking for it again costs nothing until another event arrives.

The rules of one guarantee are checked as each event arrives: one sampling scheme (the
adjacency relations differ), fixed ``dataset_size``/``batch_size`` for sampling without
replacement, and a one-shot release only alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from lightning_dpot.privacy.accounting.accountants import PrivacyAccountant, make_accountant
from lightning_dpot.privacy.events import GaussianRelease, PrivacyEvent, SubsampledGaussianStep
from lightning_dpot.privacy.mechanisms.gaussian import gaussian_epsilon

__all__ = ["Composition"]


class Composition:
    """The composed events of one run (module docstring).

    Args:
        accountant: the accountant of subsampled steps, ``"rdp"`` or ``"pld"``.

    Example::

        >>> from lightning_dpot.privacy.events import SubsampledGaussianStep
        >>> composition = Composition("rdp")
        >>> composition.add_all([SubsampledGaussianStep(1.0, 0.01)] * 1000)
        >>> composition.releases, composition.accountant.history
        (1000, [(1.0, 0.01, 1000)])
        >>> round(composition.epsilon(1e-5), 3)
        2.101
    """

    def __init__(self, accountant: str = "rdp") -> None:
        self.accountant: PrivacyAccountant = make_accountant(accountant)
        self.one_shot: GaussianRelease | None = None
        self.swor_sizes: tuple[int | None, int | None] = (None, None)
        self._epsilon: tuple[int, float, float] | None = None  # (releases, δ, ε)

    @property
    def releases(self) -> int:
        """Events composed so far."""
        return self.accountant.steps + (self.one_shot is not None)

    def add(self, event: PrivacyEvent) -> None:
        """Compose one event (O(1)).

        Raises:
            ValueError: a one-shot release beside other events, a change of sampling scheme or
                of the sizes of sampling without replacement.
            TypeError: an unknown event.
        """
        if isinstance(event, GaussianRelease):
            if self.releases:
                raise ValueError(
                    "a GaussianRelease composes only alone (one release of the whole "
                    f"dataset); already composed: {self.releases} event(s)"
                )
            self.one_shot = event
            return
        if not isinstance(event, SubsampledGaussianStep):
            raise TypeError(f"unknown privacy event {event!r}")
        if self.one_shot is not None:
            raise ValueError("subsampled steps cannot follow a one-shot GaussianRelease")
        self.accountant.sampling = event.sampling  # refuses a change of scheme
        sizes = (event.dataset_size, event.batch_size)
        if self.accountant.steps and sizes != self.swor_sizes:
            raise ValueError(
                f"dataset_size/batch_size changed from {self.swor_sizes} to {sizes} within one run"
            )
        self.swor_sizes = sizes
        self.accountant.step(event.noise_multiplier, event.sample_rate, 1)

    def add_all(self, events: Iterable[PrivacyEvent]) -> None:
        for event in events:
            self.add(event)

    def epsilon(self, delta: float) -> float:
        """ε at ``delta`` of everything composed (0 before the first event); cached until the
        next event."""
        cached = self._epsilon
        if cached is not None and cached[:2] == (self.releases, delta):
            return cached[2]
        if self.one_shot is not None:
            value = gaussian_epsilon(self.one_shot.noise_multiplier, delta, 1.0)
        else:
            value = self.accountant.get_epsilon(delta)
        self._epsilon = (self.releases, delta, value)
        return value

    def epsilon_with(self, events: Sequence[PrivacyEvent], delta: float) -> float:
        """ε at ``delta`` if ``events`` were composed too; no side effect."""
        trial = Composition(self.accountant.name)
        trial.load_state_dict(self.state_dict())
        trial.add_all(events)
        return trial.epsilon(delta)

    def events(self) -> list[PrivacyEvent]:
        """Every composed event, in a canonical order (to seed a journal)."""
        if self.one_shot is not None:
            return [self.one_shot]
        n, b = self.swor_sizes
        sampling = self.accountant.sampling
        return [
            SubsampledGaussianStep(sigma, q, sampling, n, b)
            for sigma, q, count in self.accountant.history
            for _ in range(count)
        ]

    def same_as(self, other: Composition) -> bool:
        """Whether ``other`` composed the same events (order within a run aside)."""
        return (self.accountant.history, self.one_shot, self.swor_sizes) == (
            other.accountant.history,
            other.one_shot,
            other.swor_sizes,
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "accountant": self.accountant.state_dict(),
            "one_shot": None if self.one_shot is None else self.one_shot.as_dict(),
            "swor_sizes": list(self.swor_sizes),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accountant.load_state_dict(state["accountant"])
        one_shot = state["one_shot"]
        self.one_shot = (
            None
            if one_shot is None
            else GaussianRelease(one_shot["noise_multiplier"], one_shot["adjacency"])
        )
        n, b = state["swor_sizes"]
        self.swor_sizes = (n, b)
        self._epsilon = None
