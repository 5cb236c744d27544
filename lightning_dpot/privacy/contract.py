"""What a LightningModule that touches private data owes the accountant: one mixin.

The flow, in one line per part::

    release object ─emits─▶ PrivacyEvent ─drained by─▶ PrivacyAccountantCallback ─writes─▶ report

* A **release object** is the only code that touches private records. It holds the calibration
  (σ, sensitivity), performs the release, and emits one typed event
  (``lightning_dpot.privacy.events``) per call into its ``events`` log. It declares the event
  each call emits as ``event`` (``None`` when not private) and what the report needs as
  ``facts()``. The package has three: ``GradientSanitizer`` (DP-Sinkhorn), ``SlicedGaussianRelease``
  (the DPSW methods) and ``MeanEmbeddingRelease`` (DP-MERF).
* A **method** subclasses ``ReleasesPrivateData`` and names its release objects in
  ``privacy_releases``. That is all it must write; the mixin derives
  the rest. Its optional ``privacy_context`` adds facts about the
  method (e.g. whether the Poisson seed is public). A method that calibrates its noise to a
  budget sets ``target_epsilon``; its release objects declare the ``delta`` of the guarantee.
* The **accountant** (``PrivacyAccountantCallback``) composes
  exactly the drained events, checks that its count equals the release objects' own totals, and
  is the only writer of ``privacy_report.json`` and of the ``privacy`` section of
  ``report.json``. ``dpot fit`` attaches one to every private run whose config names none.
* The **checkpoint** holds every method's privacy state under one key, ``privacy``: each
  release object's state (its event log, and its calibration or released statistic where it
  keeps one), the calibration plan and the settings a release depends on
  (``ReleasesPrivateData.resume_settings``). The mixin writes and reads it
  (``on_save_checkpoint`` / ``on_load_checkpoint``; a method that overrides them calls
  ``super()``), through ``lightning_dpot.privacy.accounting.migration`` for earlier layouts.
  Loading restores; only a load into a fitting trainer (a resume) also checks that the run is
  set up as the checkpoint's releases were: ``dpot sample``, ``evaluate`` and ``export`` load
  any checkpoint.
* The **budget** is the module's own: the accountant enforces the module's ``target_epsilon``
  (the smaller one, if the callback names its own) at the δ the release objects declare
  (``ReleasesPrivateData.privacy_delta``), and refuses a callback whose δ differs. So a
  run calibrated for ``T`` releases that is asked to make more (a longer resume) stops at the
  target instead of passing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from lightning_dpot.privacy.accounting.migration import (
    PRIVACY_KEY,
    PRIVACY_STATE_VERSION,
    migrate_module_state,
)
from lightning_dpot.privacy.events import EventLog, PrivacyEvent, SubsampledGaussianStep

__all__ = [
    "PrivacyUpdate",
    "Release",
    "ReleasesPrivateData",
    "check_bases",
    "look_ahead_step",
    "refuse_tuners",
    "require_private",
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
    (``ReleasesPrivateData.privacy_update``): after every training batch, and at the start
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
        NotImplementedError: from ``privacy_releases`` when a subclass does not define it.
        ValueError: from ``privacy_delta`` (and what reads it) when the release objects
            declare different deltas, and from ``check_restored_plan`` when a resume would
            re-calibrate the noise of the checkpoint's releases.

    Example::

        >>> import lightning as L
        >>> from lightning_dpot.privacy.contract import ReleasesPrivateData
        >>> from lightning_dpot.privacy.mechanisms.gradient_sanitizer import GradientSanitizer
        >>> class MyMethod(ReleasesPrivateData, L.LightningModule):
        ...     def __init__(self, sanitizer):  # a release object
        ...         super().__init__()
        ...         self.sanitizer = sanitizer
        ...     def privacy_releases(self):
        ...         return [self.sanitizer]
        >>> method = MyMethod(GradientSanitizer(clip_norm=1.0, noise_multiplier=1.1, delta=1e-5))
        >>> method.is_private, method.privacy_delta(), method.releases_emitted()
        (True, 1e-05, 0)
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
        """How calibrated noise is set up, for checkpoints: ``calibration_plan`` and the
        event each release object emits (σ, q, sizes); ``None`` when the noise was given."""
        plan = self.calibration_plan()
        if plan is None:
            return None
        events = [None if r.event is None else r.event.as_dict() for r in self.privacy_releases()]
        return {"calibrated_for": plan, "events": events}

    def bind_private_data(self, datamodule: object) -> bool:
        """Bind this module to the datamodule it is set up with; True when it already was (its
        ``setup`` may then skip). Its releases, calibration and ledger entry belong to those
        records, so another datamodule is refused: a fit on other data takes a new module.

        Raises:
            ValueError: naming the module, for another datamodule than the bound one.
        """
        bound = self.__dict__.get("_private_data_id")
        if bound is None:
            self.__dict__["_private_data_id"] = id(datamodule)
            return False
        if bound != id(datamodule):
            raise ValueError(
                f"{type(self).__name__} was set up on another datamodule: its releases, noise "
                "calibration and sampling settings belong to those records. Build a new "
                f"{type(self).__name__} to fit on other data"
            )
        return True

    def resume_settings(self) -> dict[str, Any] | None:
        """Settings the releases depend on beyond their noise (e.g. DP-MERF's kernel), kept in
        checkpoints: a resume with other settings is refused. Default: none."""
        return None

    # -- checkpoints (Lightning hooks; the mixin comes first among the bases) ------------------

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Write the one ``privacy`` section (module docstring)."""
        super().on_save_checkpoint(checkpoint)  # type: ignore[misc]
        checkpoint[PRIVACY_KEY] = {
            "version": PRIVACY_STATE_VERSION,
            "releases": [release_state(release) for release in self.privacy_releases()],
            "plan": self.privacy_plan(),
            "settings": self.resume_settings(),
            "facts": self.privacy_facts(),  # what a report of this checkpoint states
            "method": type(self).__name__,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the release objects from the ``privacy`` section (any earlier layout); when a
        fit resumes, first refuse a run set up otherwise than the checkpoint's releases.

        Raises:
            ValueError: the checkpoint belongs to a method with other release objects, or (on
                resume) a changed plan or setting.
        """
        super().on_load_checkpoint(checkpoint)  # type: ignore[misc]
        writer = (checkpoint.get(PRIVACY_KEY) or {}).get("method")
        if writer is not None and writer != type(self).__name__:
            raise ValueError(
                f"the checkpoint was written by {writer}, not {type(self).__name__}: resume or "
                f"sample it with the config of the {writer} run that wrote it"
            )
        state = migrate_module_state(checkpoint)
        if state is None:
            return
        releases = self.privacy_releases()
        if len(state["releases"]) != len(releases):
            raise ValueError(
                f"the checkpoint holds the state of {len(state['releases'])} release object(s), "
                f"but {type(self).__name__} has {len(releases)}: it was written by another method"
            )
        trainer = getattr(self, "_trainer", None)
        if trainer is not None and trainer.state.fn == "fit":
            self.check_restored_plan(state["plan"])
            self.check_restored_settings(state["settings"])
        for release, release_saved in zip(releases, state["releases"], strict=True):
            load_release_state(release, release_saved)

    def check_restored_settings(self, stored: dict[str, Any] | None) -> None:
        """Refuse a resume whose ``resume_settings`` differ from the checkpoint's."""
        if stored is None or stored == self.resume_settings():
            return
        raise ValueError(
            f"{type(self).__name__} resumes with settings {self.resume_settings()}, but the "
            f"checkpoint's releases were made with {stored}: training would use the release "
            "under other settings. Resume with the settings of the original run"
        )

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


def release_state(release: Release) -> dict[str, Any]:
    """A release object's checkpoint state: its own ``state_dict()`` where it has one (a
    calibration or a released statistic), else its event log."""
    own = getattr(release, "state_dict", None)
    return own() if callable(own) else {"events": release.events.state_dict()}


def load_release_state(release: Release, state: dict[str, Any]) -> None:
    """Restore what ``release_state`` wrote."""
    own = getattr(release, "load_state_dict", None)
    if callable(own):
        own(state)
    else:
        release.events.load_state_dict(state["events"])


def refuse_tuners(trainer: Any, who: str) -> None:
    """Refuse Lightning's tuner callbacks (``LearningRateFinder``, ``BatchSizeFinder``, which
    ``Tuner.lr_find`` and ``Tuner.scale_batch_size`` add) on a run that releases private data.

    Their trials train before the accountant composes anything, choose a setting from the
    outcome, and then restore the model as if they had not run: on a central-DP run the releases
    of those trials would leave the process unaccounted. On a local-DP run the trials would see
    only the data release (post-processing, no further cost); they are refused there too, so
    that one rule holds for every private run. Tune on public or synthetic data
    instead. ``who`` names the private module or data for the message.

    Raises:
        ValueError: naming the tuner, before anything is released.
    """
    from lightning.pytorch.callbacks import BatchSizeFinder, LearningRateFinder

    for callback in trainer.callbacks:
        if isinstance(callback, LearningRateFinder | BatchSizeFinder):
            raise ValueError(
                f"{type(callback).__name__} (Lightning's tuner) is refused on the private run of "
                f"{who}: its trial steps use the private data (or its release) outside the "
                "accounted training and pick a setting from their results. Tune on public or "
                "synthetic data, then set the value in the config"
            )


def require_private(pl_module: object) -> ReleasesPrivateData:
    """``pl_module`` as a private ``ReleasesPrivateData``, the accountant's precondition.

    Raises:
        TypeError: if it does not subclass ``ReleasesPrivateData``.
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


def check_bases(module: ReleasesPrivateData) -> None:
    """Refuse a class that lists ``LightningModule`` before ``ReleasesPrivateData``:
    Lightning's checkpoint hooks would hide the mixin's, and its release objects' state would
    not be saved (checked once, when a fit starts).

    Raises:
        TypeError: naming the class and the order to declare.
    """
    name = type(module).__name__
    mro = [cls.__name__ for cls in type(module).__mro__]
    if "LightningModule" in mro and mro.index("LightningModule") < mro.index("ReleasesPrivateData"):
        raise TypeError(
            f"{name} lists LightningModule before ReleasesPrivateData among its bases, so "
            "Lightning's checkpoint hooks hide the mixin's and its release objects' state is not "
            f"saved: declare class {name}(ReleasesPrivateData, ...)"
        )


def look_ahead_step(
    next_events: Sequence[PrivacyEvent], module: str
) -> SubsampledGaussianStep | None:
    """The one (σ, q) step every batch of ``module`` emits, from the events one more batch will
    emit (``PrivacyUpdate.next_events``), for the budget's look-ahead (``None``: batches emit
    nothing). Raises ``ValueError`` unless they are identical
    ``SubsampledGaussianStep`` events."""
    distinct = set(next_events)
    if not distinct:
        return None
    if len(distinct) > 1 or not isinstance(next(iter(distinct)), SubsampledGaussianStep):
        raise ValueError(
            f"{module}.next_step_events() must be identical SubsampledGaussianStep events for "
            f"the budget's look-ahead, got {list(next_events)!r}"
        )
    return next(iter(distinct))
