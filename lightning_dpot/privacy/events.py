"""Typed privacy events: what one call of a mechanism on private data released.

A release object (``GradientSanitizer``,
``SlicedGaussianRelease``) emits one event per call
into its ``EventLog``; the accountant
(``PrivacyAccountantCallback``) composes exactly the events that
were emitted. The count is therefore what happened, whatever the loop did around the call
(gradient accumulation, resume, DDP, no callback at all).

* ``SubsampledGaussianStep`` with ``sampling="poisson"``: the Gaussian mechanism on a
  Poisson sample of rate q, add/remove-one; composed by RDP or PLD.
* ``SubsampledGaussianStep`` with ``sampling="without_replacement"``: the Gaussian mechanism
  on b of the n records, replace-one; composed by RDP (Wang, Balle, Kasiviswanathan 2019).
* ``GaussianRelease``: the Gaussian mechanism on the whole dataset, once; ε from the
  analytic Gaussian mechanism (Balle & Wang 2018).

``noise_multiplier`` is always the noise standard deviation divided by the ℓ2 sensitivity of
what is noised, under the event's adjacency.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from lightning_dpot.checks import (
    check_positive,
    check_positive_int,
    check_probability,
)
from lightning_dpot.privacy.accounting.analysis.schemes import POISSON, SAMPLINGS

SAMPLING_SCHEMES = tuple(SAMPLINGS)


@dataclass(frozen=True)
class SubsampledGaussianStep:
    """One Gaussian release of a random subsample (one optimizer step of DP-SGD-like methods).

    Args:
        noise_multiplier: σ = noise std / ℓ2 sensitivity (> 0).
        sample_rate: Poisson rate q, or b/n for sampling without replacement.
        sampling: ``"poisson"`` (add/remove-one) or ``"without_replacement"`` (replace-one; then
            ``dataset_size`` n and ``batch_size`` b are required and ``sample_rate = b/n``).
    """

    noise_multiplier: float
    sample_rate: float
    sampling: str = POISSON
    dataset_size: int | None = None
    batch_size: int | None = None

    def __post_init__(self) -> None:
        check_positive("noise_multiplier", self.noise_multiplier)
        check_probability("sample_rate", self.sample_rate)
        if self.sampling not in SAMPLING_SCHEMES:
            raise ValueError(f"sampling must be one of {SAMPLING_SCHEMES}, got {self.sampling!r}")
        if self.sampling == POISSON:
            if self.dataset_size is not None or self.batch_size is not None:
                raise ValueError(
                    "a Poisson step has no fixed dataset_size/batch_size (they would be "
                    f"released), got {self.dataset_size!r}/{self.batch_size!r}"
                )
            return
        n = check_positive_int("dataset_size", self.dataset_size)
        b = check_positive_int("batch_size", self.batch_size)
        if b > n:
            raise ValueError(f"batch_size must lie in [1, dataset_size={n}], got {b}")
        if not math.isclose(self.sample_rate, b / n, rel_tol=1e-12):
            raise ValueError(
                f"sample_rate={self.sample_rate!r} must equal batch_size/dataset_size = {b}/{n} "
                "for sampling without replacement"
            )

    @property
    def adjacency(self) -> str:
        return SAMPLINGS[self.sampling][1]

    @property
    def composed_by(self) -> str:
        """The accountant family that composes this event."""
        return "rdp or pld" if self.sampling == POISSON else "rdp"

    def as_dict(self) -> dict:
        return {"event": type(self).__name__, **asdict(self)}


@dataclass(frozen=True)
class GaussianRelease:
    """One Gaussian release of the whole dataset (no subsampling), e.g. DPSWflow's cached
    projections; ε from the analytic Gaussian mechanism (Balle & Wang 2018) at σ = noise std /
    ℓ2 sensitivity."""

    noise_multiplier: float
    adjacency: str = "replace_one"

    def __post_init__(self) -> None:
        check_positive("noise_multiplier", self.noise_multiplier)
        if self.adjacency not in ("replace_one", "add_or_remove_one"):
            raise ValueError(
                f"adjacency must be 'replace_one' or 'add_or_remove_one', got {self.adjacency!r}"
            )

    composed_by = "analytic gaussian"

    def as_dict(self) -> dict:
        return {"event": type(self).__name__, **asdict(self)}


PrivacyEvent = SubsampledGaussianStep | GaussianRelease


def event_from_dict(entry: dict) -> PrivacyEvent:
    """The event that ``SubsampledGaussianStep.as_dict`` or ``GaussianRelease.as_dict``
    wrote (journals and checkpoints store events this way)."""
    fields = dict(entry)
    kind = fields.pop("event", None)
    classes = {cls.__name__: cls for cls in (SubsampledGaussianStep, GaussianRelease)}
    if kind not in classes:
        raise ValueError(f"event must be one of {sorted(classes)}, got {kind!r}")
    return classes[kind](**fields)


class EventLog:
    """The events a release object emitted: ``pending`` until the accountant drains them,
    ``total`` ever emitted and ``history``, the emitted events as runs ``[event dict, count]``
    (both saved in checkpoints, so a resumed run continues the count and knows the σ and q of
    every earlier release, whatever its own configuration).

    A ``journal`` (a callable the accountant sets,
    ``writer``) records each event
    durably *inside* ``emit``; a release object emits before it draws its noise, so no noisy
    output can exist without its event on disk.

    Within one process ``total`` never goes down: loading an older state (Lightning's tuner
    restores its temporary checkpoint after ``lr_find``; ``fit(ckpt_path=...)`` on a module that
    already released) keeps the larger count, so the accountant's check (composed = emitted)
    fails instead of forgetting releases that happened."""

    def __init__(self) -> None:
        self.pending: list[PrivacyEvent] = []
        self.total = 0
        self.history: list[list] = []
        self.journal: Callable[[PrivacyEvent], None] | None = None

    def emit(self, event: PrivacyEvent) -> None:
        """Record one release: journaled first (when a journal is attached), then counted."""
        if self.journal is not None:
            self.journal(event)
        self.pending.append(event)
        self.total += 1
        entry = event.as_dict()
        if self.history and self.history[-1][0] == entry:
            self.history[-1][1] += 1
        else:
            self.history.append([entry, 1])

    def drain(self) -> list[PrivacyEvent]:
        events, self.pending = self.pending, []
        return events

    def events(self) -> list[PrivacyEvent]:
        """Every event emitted so far, in order (restored checkpoints included), from
        ``history``; ``[]`` for a checkpoint written before the history was kept."""
        return [event_from_dict(entry) for entry, count in self.history for _ in range(count)]

    def replace(self, events: Sequence[PrivacyEvent]) -> None:
        """Take ``events`` as everything emitted so far (a resume that found more releases in
        the run's journal than in its checkpoint); nothing is pending."""
        self.pending, self.total, self.history = [], 0, []
        journal, self.journal = self.journal, None
        try:
            for event in events:
                self.emit(event)
        finally:
            self.journal = journal
        self.pending = []

    def state_dict(self) -> dict:
        return {"total": self.total, "history": [[dict(e), n] for e, n in self.history]}

    def load_state_dict(self, state: dict) -> None:
        total = int(state["total"])
        if total >= self.total:
            self.history = [[dict(e), int(n)] for e, n in state.get("history", [])]
        self.total = max(self.total, total)
        self.pending = []

    def __getstate__(self) -> dict:
        return {**self.__dict__, "journal": None}  # an open run's journal stays with the run
