"""What a LightningModule that touches private data owes the accountant: one mixin.

The flow, in one line per part::

    release object ─emits─▶ PrivacyEvent ─drained by─▶ PrivacyAccountantCallback ─writes─▶ report

* A **release object** is the only code that touches private records. It holds the calibration
  (σ, sensitivity), performs the release, and emits one typed event
  (:mod:`lightning_dpot.privacy.events`) per call into its ``events`` log. It declares the event
  each call emits as ``event`` (``None`` when not private) and what the report needs as
  ``facts()``. The package has three: :class:`~lightning_dpot.privacy.mechanisms.
  gradient_sanitizer.GradientSanitizer` (DP-Sinkhorn), :class:`~lightning_dpot.methods.dpsw.
  sliced_release.SlicedGaussianRelease` (the DPSW methods) and :class:`~lightning_dpot.methods.
  dp_merf.MeanEmbeddingRelease` (DP-MERF).
* A **method** subclasses :class:`ReleasesPrivateData` and names its release objects in
  :meth:`~ReleasesPrivateData.privacy_releases`. That is all it must write; the mixin derives
  the rest. Its optional :meth:`~ReleasesPrivateData.privacy_context` adds facts about the
  method (e.g. whether the Poisson seed is public). A method that calibrates its noise to a
  budget sets ``target_epsilon``; its release objects declare the ``delta`` of the guarantee.
* The **accountant** (:class:`~lightning_dpot.callbacks.PrivacyAccountantCallback`) composes
  exactly the drained events, checks that its count equals the release objects' own totals, and
  is the only writer of ``privacy_report.json`` and of the ``privacy`` section of
  ``report.json``. ``dpot fit`` attaches one to every private run whose config names none.
* The **budget** is the module's own: the accountant enforces the module's ``target_epsilon``
  (the smaller one, if the callback names its own) at the δ the release objects declare
  (:meth:`ReleasesPrivateData.privacy_delta`), and refuses a callback whose δ differs. So a
  run calibrated for ``T`` releases that is asked to make more (a longer resume) stops at the
  target instead of passing it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from lightning_dpot.privacy.events import EventLog, PrivacyEvent, SubsampledGaussianStep

__all__ = [
    "PrivacyUpdate",
    "check_release_before_training",
    "Release",
    "ReleasesPrivateData",
    "check_fixed_accumulation",
    "look_ahead_step",
    "planned_releases",
    "require_private",
    "warn_if_unaccounted",
]


class Release(Protocol):
    """A release object (module docstring)."""

    events: EventLog
    is_private: bool  # False only for the non-private reference (no noise)
    delta: float | None  # δ of the guarantee the noise is calibrated or reported for

    @property
    def event(self) -> PrivacyEvent | None:
        """The event one call emits (once calibrated); ``None`` when not private."""

    def facts(self) -> dict[str, Any]:
        """Sensitivity, noise source and mechanism facts for the report (plain JSON types)."""


@dataclass(frozen=True)
class PrivacyUpdate:
    """Everything the accountant reads from a module at one point of training, in one call
    (:meth:`ReleasesPrivateData.privacy_update`): after every training batch, and at the start
    and the end of training.

    Attributes:
        events: the events the release objects emitted since the last update (drained).
        releases_emitted: every release of the run so far, restored checkpoints included; the
            accountant refuses to go on if it composed a different number.
        next_events: the events one more training batch will emit (the budget's look-ahead).
        module: the module's class name, for messages.
    """

    events: tuple[PrivacyEvent, ...]
    releases_emitted: int
    next_events: tuple[PrivacyEvent, ...]
    module: str


class ReleasesPrivateData:
    """Mixin for a LightningModule whose training touches private data (module docstring).

    Raises:
        NotImplementedError: from :meth:`privacy_releases` when a subclass does not define it.
        ValueError: from :meth:`privacy_delta` (and what reads it) when the release objects
            declare different deltas, and from :meth:`check_restored_plan` when a resume would
            re-calibrate the noise of the checkpoint's releases.

    Example::

        import lightning as L
        from lightning_dpot.privacy.contract import ReleasesPrivateData

        class MyMethod(ReleasesPrivateData, L.LightningModule):
            def __init__(self, sanitizer):  # a release object, e.g. a GradientSanitizer
                super().__init__()
                self.sanitizer = sanitizer
            def privacy_releases(self):
                return [self.sanitizer]
    """

    #: ε the module calibrated its noise to spend over its planned releases (``None``: the
    #: noise was given). The accountant enforces it as the run's budget.
    target_epsilon: float | None = None
    #: the number of releases that calibration planned for (set when it calibrates).
    planned_release_count: int | None = None

    def privacy_releases(self) -> Sequence[Release]:
        """The release objects this module calls; the only thing a method must implement."""
        raise NotImplementedError

    def privacy_context(self) -> dict[str, Any]:
        """Facts about the method beyond its release objects (override to add)."""
        return {}

    @property
    def is_private(self) -> bool:
        """Whether any release adds noise (False: the non-private reference run)."""
        return any(release.is_private for release in self.privacy_releases())

    def privacy_delta(self) -> float | None:
        """The one δ the release objects declare (``None``: none does). Raises ``ValueError``
        when they declare different ones: one run has one (ε, δ) guarantee."""
        deltas = {r.delta for r in self.privacy_releases() if r.delta is not None}
        if len(deltas) > 1:
            raise ValueError(
                f"the release objects of {type(self).__name__} declare different deltas "
                f"{sorted(deltas)}: one run has one (epsilon, delta) guarantee"
            )
        return deltas.pop() if deltas else None

    def next_step_events(self) -> list[PrivacyEvent]:
        """The events one training batch will emit, for the budget's look-ahead. Default: one
        call of every private release object per batch; a method whose steps release nothing
        (DPSWflow and DP-MERF release once, before training) returns ``[]``."""
        return [r.event for r in self.privacy_releases() if r.is_private and r.event is not None]

    def planned_events(self) -> list[PrivacyEvent]:
        """Events the module will emit before its first training step (the one release of
        DPSWflow or DP-MERF), so that a budget can refuse them before any noise is drawn.
        Default: none."""
        return []

    def privacy_update(self) -> PrivacyUpdate:
        """Drain the release objects' events and say what the next batch will release: the one
        call the accountant makes per batch."""
        releases = self.privacy_releases()
        # The look-ahead first: if it raises, no event has been drained, so none is lost.
        next_events = tuple(self.next_step_events())
        return PrivacyUpdate(
            events=tuple(event for release in releases for event in release.events.drain()),
            releases_emitted=sum(release.events.total for release in releases),
            next_events=next_events,
            module=type(self).__name__,
        )

    def releases_emitted(self) -> int:
        """Every release this run made, restored checkpoints included."""
        return sum(release.events.total for release in self.privacy_releases())

    def privacy_facts(self) -> dict[str, Any]:
        """The facts of every release object and of the method, for the report; each release
        object's ``emitted`` lists the events it made as ``[event, count]`` runs, so a σ changed
        on resume shows where it changed."""
        releases = [
            {**release.facts(), "emitted": release.events.state_dict()["history"]}
            for release in self.privacy_releases()
        ]
        facts = {**self.privacy_context(), "releases": releases}
        plan = self.calibration_plan()
        return facts if plan is None else {**facts, "calibrated_for": plan}

    def privacy_plan(self) -> dict[str, Any] | None:
        """How calibrated noise is set up, for checkpoints: :meth:`calibration_plan` and the
        event each release object emits (σ, q, sizes); ``None`` when the noise was given."""
        plan = self.calibration_plan()
        if plan is None:
            return None
        events = [None if r.event is None else r.event.as_dict() for r in self.privacy_releases()]
        return {"calibrated_for": plan, "events": events}

    def check_restored_plan(self, stored: dict[str, Any] | None) -> None:
        """Refuse to resume with noise set up otherwise than for the checkpoint's releases: a
        changed target, δ, training length or sample rate re-calibrates σ, and the earlier
        releases would then be accounted at the new σ. ``None`` (given noise, or a checkpoint
        written before plans were saved) is accepted."""
        if stored is None or stored == self.privacy_plan():
            return
        raise ValueError(
            f"{type(self).__name__} resumes with its noise set up as {self.privacy_plan()}, but "
            f"the checkpoint's releases were made as {stored}: a changed target_epsilon, delta, "
            "training length (max_steps/max_epochs) or sample rate would re-calibrate the noise "
            "mid-run. Resume with the settings of the original run"
        )

    def calibration_plan(self) -> dict[str, Any] | None:
        """What the noise was calibrated for: ``target_epsilon``, ``delta`` and the planned
        number of releases (``None`` when the noise was given)."""
        if self.target_epsilon is None:
            return None
        return {
            "target_epsilon": self.target_epsilon,
            "delta": self.privacy_delta(),
            "planned_releases": self.planned_release_count,
        }


def check_release_before_training(module: Any) -> None:
    """Before a module releases once in ``on_fit_start`` (DPSWflow, DP-MERF): refuse a fit whose
    release would not be accounted — one that
    trains no batch (``max_steps``/``max_epochs``/``limit_train_batches`` 0: the accountant
    composes and reports from the training hooks), or a strategy that restores a checkpoint
    after ``on_fit_start`` (FSDP, DeepSpeed: the release would be drawn before the checkpoint
    that already holds one is read).

    Raises:
        ValueError: naming the setting, before any noise is drawn.
    """
    trainer = module.trainer
    name = type(module).__name__
    if 0 in (trainer.max_steps, trainer.max_epochs, trainer.limit_train_batches):
        raise ValueError(
            f"{name} releases once before training, but this fit trains no batch "
            f"(max_steps={trainer.max_steps}, max_epochs={trainer.max_epochs}, "
            f"limit_train_batches={trainer.limit_train_batches}): the release would not be "
            "accounted. Train at least one batch"
        )
    if trainer.ckpt_path is not None and trainer.strategy.restore_checkpoint_after_setup:
        raise ValueError(
            f"{name} cannot resume under {type(trainer.strategy).__name__}: it restores the "
            "checkpoint after the fit starts, so the release the checkpoint holds would be drawn "
            "again. Resume with a strategy that restores before setup (e.g. ddp, auto)"
        )


def warn_if_unaccounted(module: ReleasesPrivateData) -> None:
    """Warn when a private module trains with no accountant among the trainer's callbacks
    (``dpot fit`` always attaches one; the Python API does not)."""
    trainer = module.trainer
    accounted = any(getattr(cb, "composes_privacy_events", False) for cb in trainer.callbacks)
    if module.is_private and not accounted:
        warnings.warn(
            f"{type(module).__name__} releases private data but no PrivacyAccountantCallback is "
            "attached: nothing composes its privacy events, so no epsilon is reported and no "
            "budget is enforced",
            UserWarning,
            stacklevel=2,
        )


def require_private(pl_module: object) -> ReleasesPrivateData:
    """``pl_module`` as a private :class:`ReleasesPrivateData`, the accountant's precondition.

    Raises:
        TypeError: if it does not subclass :class:`ReleasesPrivateData`.
        ValueError: if none of its release objects adds noise (nothing to account).
    """
    name = type(pl_module).__name__
    if not isinstance(pl_module, ReleasesPrivateData):
        raise TypeError(
            f"{name} does not subclass lightning_dpot.privacy.contract.ReleasesPrivateData: "
            "PrivacyAccountantCallback composes the events of the module's release objects, "
            "which the module names in privacy_releases()"
        )
    if not pl_module.is_private:
        raise ValueError(
            f"{name} is not private (its release objects add no noise), so there is no "
            "(epsilon, delta) guarantee to account. Remove PrivacyAccountantCallback or "
            "configure the module with noise"
        )
    return pl_module


def look_ahead_step(
    next_events: Sequence[PrivacyEvent], module: str
) -> SubsampledGaussianStep | None:
    """The one (σ, q) step every batch of ``module`` emits, from the events one more batch will
    emit (:attr:`PrivacyUpdate.next_events`), for the budget's look-ahead (``None``: batches emit
    nothing). Raises ``ValueError`` unless they are identical
    :class:`~lightning_dpot.privacy.events.SubsampledGaussianStep` events."""
    distinct = set(next_events)
    if not distinct:
        return None
    if len(distinct) > 1 or not isinstance(next(iter(distinct)), SubsampledGaussianStep):
        raise ValueError(
            f"{module}.next_step_events() must be identical SubsampledGaussianStep events for "
            f"the budget's look-ahead, got {list(next_events)!r}"
        )
    return next(iter(distinct))


def check_fixed_accumulation(trainer: Any) -> None:
    """Refuse a ``GradientAccumulationScheduler``: it changes ``accumulate_grad_batches`` (the
    releases per optimizer step) between epochs, after the noise was calibrated and the budget's
    look-ahead planned for the factor in force at the start."""
    from lightning.pytorch.callbacks import GradientAccumulationScheduler

    if any(isinstance(cb, GradientAccumulationScheduler) for cb in trainer.callbacks):
        raise ValueError(
            "GradientAccumulationScheduler changes accumulate_grad_batches during training, so "
            "the releases per optimizer step that target_epsilon was planned for would change: "
            "use a fixed Trainer(accumulate_grad_batches=k) for a private run with a target"
        )


def planned_releases(trainer: Any, steps_per_epoch: int) -> int:
    """Training batches of the run, one release each: the first limit Lightning reaches of
    ``max_steps`` (optimizer steps × accumulation) and ``max_epochs × steps_per_epoch``.

    Raises:
        ValueError: without a finite training length, or with a
            ``GradientAccumulationScheduler`` (:func:`check_fixed_accumulation`).
    """
    check_fixed_accumulation(trainer)
    limits = []
    if trainer.max_steps is not None and trainer.max_steps > 0:
        limits.append(int(trainer.max_steps) * int(trainer.accumulate_grad_batches))
    if trainer.max_epochs is not None and trainer.max_epochs >= 0:
        limits.append(int(trainer.max_epochs) * steps_per_epoch)
    if not limits:
        raise ValueError(
            "target_epsilon needs a finite training length to calibrate σ: set trainer.max_steps "
            "or trainer.max_epochs"
        )
    return min(limits)
