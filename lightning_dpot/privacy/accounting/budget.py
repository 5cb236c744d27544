"""The privacy budget as a pure decision: events so far + the next step's events + target →
continue or stop, with the reason.

The largest number of further steps of one (σ, q) within the target is searched once per
(σ, q) and composed prefix (``max_additional_steps``); after that, each decision is an integer
comparison,
so deciding costs the same at step 10 and step 10⁶.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_dpot.privacy.accounting.composition import Composition
from lightning_dpot.privacy.events import PrivacyEvent, SubsampledGaussianStep

__all__ = ["Budget", "Decision"]


@dataclass(frozen=True)
class Decision:
    """Whether one more optimizer step fits the target.

    Attributes:
        go: the next step keeps ε ≤ target.
        remaining: further releases of the next step's event that fit (``None`` when steps
            release nothing).
        reason: one line saying why, for the log.
    """

    go: bool
    remaining: int | None
    reason: str


class Budget:
    """A target (ε, δ) and the look-ahead against it (module docstring).

    Args:
        target_epsilon: ε that training must never exceed.
        delta: δ of the guarantee.
    """

    def __init__(self, target_epsilon: float, delta: float) -> None:
        self.target_epsilon = target_epsilon
        self.delta = delta
        self._cache: tuple[tuple, int] | None = None  # (key, largest total of the current run)

    def remaining(self, composition: Composition, step: SubsampledGaussianStep) -> int:
        """How many more events ``step`` keep ε ≤ the target, after ``composition``."""
        accountant = composition.accountant
        accountant.sampling = step.sampling
        history = accountant.history
        sigma, q = step.noise_multiplier, step.sample_rate
        if history and history[-1][:2] == (sigma, q):
            prefix, in_run = tuple(history[:-1]), history[-1][2]
        else:
            prefix, in_run = tuple(history), 0
        key = (sigma, q, prefix, accountant.sampling)
        if self._cache is None or self._cache[0] != key:
            extra = accountant.max_additional_steps(sigma, q, self.target_epsilon, self.delta)
            self._cache = (key, in_run + extra)
        return self._cache[1] - in_run

    def decide(
        self, composition: Composition, step: SubsampledGaussianStep | None, per_step: int
    ) -> Decision:
        """Whether ``per_step`` more events of ``step`` (the releases of one optimizer step)
        fit the target after ``composition``."""
        if step is None:
            return Decision(True, None, "steps release nothing")
        remaining = self.remaining(composition, step)
        if remaining >= per_step:
            return Decision(True, remaining, f"{remaining} more releases of {step} fit")
        return Decision(
            False,
            remaining,
            f"one more optimizer step ({per_step} release(s) of {step}) would take epsilon "
            f"past target_epsilon={self.target_epsilon} at delta={self.delta}",
        )

    def check_planned(self, composition: Composition, planned: Sequence[PrivacyEvent]) -> None:
        """Refuse releases a module makes before training (a one-shot release) that would
        exceed the target, before they are drawn.

        Raises:
            ValueError: naming the target and the ε the planned releases would spend.
        """
        if not planned:
            return
        epsilon = composition.epsilon_with(planned, self.delta)
        if epsilon > self.target_epsilon:
            raise ValueError(
                f"target_epsilon={self.target_epsilon!r}: the release(s) made before training "
                f"({list(planned)}) would spend epsilon={epsilon:.6g} at delta={self.delta!r}; "
                "nothing was released"
            )
