"""The budget a private run is held to: δ and the target taken from the module's own
calibration, and the most a run may spend (what its ledger entry is opened at)."""

from __future__ import annotations

import math
import warnings

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from lightning_dpot.privacy.accounting.composition import Composition
from lightning_dpot.privacy.contract import ReleasesPrivateData, look_ahead_step
from lightning_dpot.privacy.guards import planned_releases

__all__ = [
    "module_budget",
    "planned_epsilon",
    "warn_if_not_first",
    "warn_if_target_changed",
    "warn_if_unstoppable",
]


def module_budget(
    module: ReleasesPrivateData, delta: float | None, target_epsilon: float | None
) -> tuple[float, float | None]:
    """``(δ, target)`` of the run: δ from the release objects (a different ``delta`` of the
    callback is refused), and the module's own ``target_epsilon`` where it calibrated to one
    (the smaller, if the callback names one too).

    Raises:
        ValueError: no δ from either side, or two different ones.
    """
    name, declared = type(module).__name__, module.privacy_delta()
    if delta is None:
        if declared is None:
            raise ValueError(
                f"PrivacyAccountantCallback(delta=None) takes delta from the release objects "
                f"of {name}, which declare none: add a PrivacyAccountantCallback with delta "
                "(and a target_epsilon) to the config"
            )
        delta = declared
    elif declared is not None and not math.isclose(declared, delta, rel_tol=1e-9):
        raise ValueError(
            f"PrivacyAccountantCallback(delta={delta!r}) differs from delta={declared!r} that "
            f"the release objects of {name} are calibrated or reported for: one run has one "
            "(epsilon, delta) guarantee, so set the two equal (or leave the callback's delta unset)"
        )
    own = module.target_epsilon
    if own is not None and (target_epsilon is None or own < target_epsilon):
        if target_epsilon is not None:
            rank_zero_info(
                f"PrivacyAccountantCallback: {name} calibrated its noise for target_epsilon="
                f"{own}, below the callback's {target_epsilon}; enforcing {own}"
            )
        target_epsilon = own
    return delta, target_epsilon


def planned_epsilon(
    trainer: L.Trainer,
    module: ReleasesPrivateData,
    composition: Composition,
    delta: float,
    target_epsilon: float | None,
) -> float:
    """The most the run may spend: its target, else the ε of what ``composition`` holds plus
    the module's planned releases over its training length.

    Raises:
        ValueError: neither a target nor a finite training length.
    """
    if target_epsilon is not None:
        return target_epsilon
    planned = list(module.planned_events())
    step = look_ahead_step(module.next_step_events(), type(module).__name__)
    if step is not None:
        try:
            batches = planned_releases(trainer, int(trainer.datamodule.steps_per_epoch))
        except ValueError as error:
            raise ValueError(
                f"{type(module).__name__} has no target_epsilon and no finite training length, "
                "so the privacy ledger cannot be told the most it may spend: set a "
                "target_epsilon, or trainer.max_steps / max_epochs"
            ) from error
        planned += [step] * (len(module.next_step_events()) * batches)
    return composition.epsilon_with(planned, delta)


def warn_if_target_changed(restored: float | None, target: float | None, releases: int) -> None:
    """Warn when a resume enforces another target than the checkpoint's run did."""
    if restored is not None and restored != target:
        warnings.warn(
            f"PrivacyAccountantCallback: target_epsilon changed on resume from {restored} to "
            f"{target}; the {releases} restored releases still count",
            UserWarning,
            stacklevel=3,
        )


def warn_if_unstoppable(trainer: L.Trainer) -> None:
    """Warn that ``min_steps``/``min_epochs`` keep Lightning from stopping at the budget."""
    if trainer.min_steps or trainer.min_epochs:
        warnings.warn(
            f"min_steps={trainer.min_steps!r} / min_epochs={trainer.min_epochs!r} keep Lightning "
            "from stopping early: if the privacy budget runs out before they are met, "
            "PrivacyAccountantCallback raises PrivacyBudgetExceededError before the step that "
            "would exceed it",
            UserWarning,
            stacklevel=3,
        )


def warn_if_not_first(trainer: L.Trainer, accountant: object) -> None:
    """Warn when a progress bar runs its batch-end hook before the accountant's: it would print
    what a step derived from its releases before the journal commits them (``dpot fit`` puts
    the accountant first)."""
    from lightning.pytorch.callbacks import ProgressBar

    for callback in trainer.callbacks:
        if callback is accountant:
            return
        if isinstance(callback, ProgressBar) and callback.is_enabled:
            warnings.warn(
                f"{type(callback).__name__} comes before PrivacyAccountantCallback among the "
                "trainer's callbacks, so it prints a step's results before the accountant "
                "commits that step's releases to disk: list the accountant first",
                UserWarning,
                stacklevel=3,
            )
            return
