"""The accountant: compose every privacy event a run emits, log (ε, δ), stop before a target,
and write the one privacy report.

Contract with the LightningModule (:mod:`lightning_dpot.privacy.contract`)
-------------------------------------------------------------------------
A private module subclasses :class:`~lightning_dpot.privacy.contract.ReleasesPrivateData` and
names its release objects. Each call of a release object on private data emits one typed event
(:mod:`lightning_dpot.privacy.events`); the callback drains them after every training batch
(and at the start of training, for releases made before it) and composes exactly those. So the
count is what happened: one event per micro-batch under gradient accumulation, one per rank's
own release under DDP, none for a step that released nothing.

* :class:`~lightning_dpot.privacy.events.SubsampledGaussianStep` events go to the driving
  accountant (``"rdp"`` or ``"pld"``; sampling without replacement: RDP only). One run uses one
  scheme (the adjacency relations differ).
* one :class:`~lightning_dpot.privacy.events.GaussianRelease` (the single release of DPSWflow
  or DP-MERF) is reported with the analytic Gaussian mechanism's ε; more than one, or mixing it
  with steps, is refused.
* after every batch, the number of composed events must equal what the module's release objects
  counted themselves (restored checkpoints included); a mismatch raises instead of reporting a
  wrong ε.

What the callback does
----------------------
* logs ``epsilon`` and ``delta`` (progress bar and logger) and ``privacy/releases``;
* with ``target_epsilon``: stops training **before** the first optimizer step that would exceed
  it at ``delta``. The look-ahead uses the module's :meth:`~lightning_dpot.privacy.contract.
  ReleasesPrivateData.next_step_events` times ``accumulate_grad_batches`` and the remaining
  budget computed once per (σ, q) by :meth:`~lightning_dpot.privacy.accounting.accountants.
  PrivacyAccountant.max_additional_steps`. ``on_train_batch_start`` re-checks as a safety net
  and raises :class:`PrivacyBudgetExceededError` before a step that would overshoot (only
  possible when ``min_steps``/``min_epochs`` keep Lightning from stopping). Without a target it
  only accounts and reports;
* takes the module's own budget: a module that calibrated its noise to ``target_epsilon``
  (DP-Sinkhorn, the DPSW methods, DP-MERF) has it enforced (the smaller one wins when the
  callback names its own), δ comes from the release objects, and a callback ``delta`` that
  differs from theirs is refused (:meth:`~lightning_dpot.privacy.contract.ReleasesPrivateData.
  privacy_delta`). So the accountant ``dpot fit`` attaches enforces what the method's config
  promised;
* keeps its state (the composed history) in checkpoints, so ``trainer.fit(ckpt_path=...)``
  continues the count exactly. A checkpoint **without** that state whose module already released
  (``global_step > 0`` or restored release counts) is refused: the earlier releases would go
  unaccounted. ``earlier_releases="as_configured"`` declares them instead: each release object's
  restored count is composed as its configured event (a module whose checkpoint holds no counts
  is refused even then). Resuming from an *older* checkpoint forgets the releases made after
  it in another process: use the latest checkpoint of a private run. A resume whose module is
  calibrated for another plan (:meth:`~lightning_dpot.privacy.contract.ReleasesPrivateData.
  privacy_plan`: target, δ, planned releases, σ, q) than the checkpoint's is refused;
* refuses, before anything is released, a target that the module's pre-training releases
  (:meth:`~lightning_dpot.privacy.contract.ReleasesPrivateData.planned_events`, DPSWflow's one
  release) would already exceed;
* writes ``privacy_report.json`` (rank 0) to ``trainer.log_dir`` at the end of training and
  contributes the same dict to ``report.json`` under ``privacy``: the only writer of both. Its
  content (adjacency, the public dataset size N, ε under each accountant, the module's facts) is
  formatted by :mod:`lightning_dpot.privacy.accounting.report`;
* records (optimizer step, ε) at the start of training, at every ε it logs and at the end, in
  a bounded :class:`~lightning_dpot.privacy.accounting.curve.EpsilonCurve` kept in its
  checkpoint state, and draws it as ``epsilon.png`` in ``trainer.log_dir`` at the end of
  training (rank 0). A one-shot release (DPSWflow) spends its ε before the first step: a flat
  line.
"""

from __future__ import annotations

import copy
import math
import sys
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_dpot.callbacks.scope import outside_the_guarantee
from lightning_dpot.checks import check_delta, check_epsilon, check_positive_int
from lightning_dpot.data.ledger import CentralRunLedger
from lightning_dpot.privacy.accounting.accountants import PrivacyAccountant, make_accountant
from lightning_dpot.privacy.accounting.analysis.epsilon import ACCOUNTANTS
from lightning_dpot.privacy.accounting.curve import EpsilonCurve, plot_epsilon_curve
from lightning_dpot.privacy.accounting.journal import ReleaseJournal
from lightning_dpot.privacy.accounting.report import privacy_report, write_privacy_report
from lightning_dpot.privacy.contract import (
    PrivacyUpdate,
    ReleasesPrivateData,
    check_fixed_accumulation,
    look_ahead_step,
    planned_releases,
    require_private,
)
from lightning_dpot.privacy.events import GaussianRelease, PrivacyEvent, SubsampledGaussianStep
from lightning_dpot.privacy.mechanisms.gaussian import gaussian_epsilon


class PrivacyBudgetExceededError(RuntimeError):
    """Raised before an optimizer step that would take ε past the target."""


class PrivacyAccountantCallback(Callback):
    """Compose the module's privacy events, report them, and optionally stop at a budget.

    Args:
        target_epsilon: ε that training must never exceed (> 0); ``None``: account and report
            only, never stop.
        delta: δ of the guarantee, in (0, 1); typically < 1/N for N private records. ``None``
            takes the δ the module's release objects declare; required with
            ``target_epsilon``. It must equal theirs when they declare one.
        accountant: accountant that drives logging and stopping, ``"rdp"`` or ``"pld"``.
        also_report: further accountants whose ε goes into :meth:`report` (end of training).
        log_every_n_steps: compute and log ε every this many steps (and at the last step).
            Default: every step for ``"rdp"`` (~0.2 ms), ``trainer.log_every_n_steps`` for
            ``"pld"`` (a full PLD composition per evaluation).
        report_filename: name of the JSON report written to ``trainer.log_dir``.
        plot_filename: name of the PNG of ε against the optimizer step written to
            ``trainer.log_dir`` at the end of training; ``None``: no plot.
        earlier_releases: what to do when training resumes from a checkpoint without accountant
            state after private releases: ``"refuse"`` (default) or ``"as_configured"``
            (compose them as the release objects' configured events; module docstring).

    The module contract and the behaviour are in the module docstring.

    Raises:
        ValueError: naming the parameter: ``target_epsilon`` not > 0, ``target_epsilon``
            without ``delta``, ``delta`` outside (0, 1), an unknown ``accountant`` or
            ``also_report`` entry, ``log_every_n_steps`` < 1, or an unknown
            ``earlier_releases``. At fit start: a module that adds no noise, a ``delta`` that
            differs from its release objects' (or is given by neither), and the refusals of the
            module docstring (an unaccountable resume, a target the planned releases exceed).
        TypeError: at fit start, a module that does not subclass
            :class:`~lightning_dpot.privacy.contract.ReleasesPrivateData`.
        PrivacyBudgetExceededError: before a step past the target that Lightning could not
            stop (``min_steps``/``min_epochs``).

    Example::

        import lightning as L
        from lightning_dpot.callbacks import PrivacyAccountantCallback

        accountant = PrivacyAccountantCallback(target_epsilon=8.0, delta=1e-5)
        trainer = L.Trainer(max_epochs=10, callbacks=[accountant])
        # trainer.fit(model, datamodule=dm), model a ReleasesPrivateData (e.g. DPSinkhorn)
        accountant.epsilon()  # ε spent so far at delta: 0.0 before training
    """

    report_key = "privacy"
    composes_privacy_events = True  # what lightning_dpot.privacy.contract looks for
    _STATE_VERSION = 2

    def __init__(
        self,
        target_epsilon: float | None = None,
        delta: float | None = None,
        accountant: str = "rdp",
        also_report: Sequence[str] = ("pld",),
        log_every_n_steps: int | None = None,
        report_filename: str = "privacy_report.json",
        earlier_releases: Literal["refuse", "as_configured"] = "refuse",
        plot_filename: str | None = "epsilon.png",
    ) -> None:
        super().__init__()
        self.target_epsilon = (
            None if target_epsilon is None else check_epsilon("target_epsilon", target_epsilon)
        )
        if self.target_epsilon is not None and delta is None:
            raise ValueError("delta is required with target_epsilon (a budget is an (ε, δ) pair)")
        self.delta = None if delta is None else check_delta("delta", delta)
        self.accountant: PrivacyAccountant = make_accountant(accountant)
        also_report = [also_report] if isinstance(also_report, str) else list(also_report)
        for name in also_report:
            if name not in ACCOUNTANTS:
                raise ValueError(
                    f"also_report entries must be in {list(ACCOUNTANTS)}, got {name!r}"
                )
        self.also_report = [name for name in dict.fromkeys(also_report) if name != accountant]
        self.log_every_n_steps = (
            None
            if log_every_n_steps is None
            else check_positive_int("log_every_n_steps", log_every_n_steps)
        )
        if earlier_releases not in ("refuse", "as_configured"):
            raise ValueError(
                f"earlier_releases must be 'refuse' or 'as_configured', got {earlier_releases!r}"
            )
        self.earlier_releases = earlier_releases
        self.report_filename = report_filename
        self.plot_filename = plot_filename
        self.epsilon_curve = EpsilonCurve()
        self.stopped_by_budget = False
        self.one_shot: list[GaussianRelease] = []
        self._restored = False
        self._restored_target: float | None = None
        self._events_per_step = 1
        self._budget: tuple[Any, int] | None = None
        self._swor_sizes: tuple[int | None, int | None] = (None, None)
        self._facts: dict[str, Any] = {}
        self._plan: dict[str, Any] | None = None
        self._restored_plan: dict[str, Any] | None = None
        self._journal: ReleaseJournal | None = None
        self._restored_journal: tuple[str, str] | None = None  # (path, id) of the checkpoint
        self._journal_ready = False
        self._log_dir: Path | None = None
        self._outside: list[str] = []
        self._ended_by: str | None = None
        # (id, ε it was opened at) of the run's entry in its data's privacy ledger
        self._ledger_entry: tuple[str, float] | None = None
        self._ledger: dict[str, Any] | None = None

    # -- composition --------------------------------------------------------------------------

    @property
    def releases(self) -> int:
        """Events composed so far."""
        return self.accountant.steps + len(self.one_shot)

    def compose(self, events: Sequence[PrivacyEvent]) -> None:
        """Add ``events`` to the composed history (validated: one scheme, one kind)."""
        for event in events:
            if isinstance(event, GaussianRelease):
                if self.one_shot or self.accountant.steps:
                    raise ValueError(
                        "a GaussianRelease composes only alone (one release of the whole "
                        f"dataset); already composed: {self.releases} event(s)"
                    )
                self.one_shot.append(event)
                continue
            if not isinstance(event, SubsampledGaussianStep):
                raise TypeError(f"unknown privacy event {event!r}")
            if self.one_shot:
                raise ValueError("subsampled steps cannot follow a one-shot GaussianRelease")
            self.accountant.sampling = event.sampling  # refuses a change of scheme
            sizes = (event.dataset_size, event.batch_size)
            if self.accountant.steps and sizes != self._swor_sizes:
                raise ValueError(
                    f"dataset_size/batch_size changed from {self._swor_sizes} to {sizes} within "
                    "one run"
                )
            self._swor_sizes = sizes
            self.accountant.step(event.noise_multiplier, event.sample_rate, 1)

    def _apply(self, update: PrivacyUpdate) -> PrivacyUpdate:
        """Compose the update's events and check the count against the release objects'."""
        self.compose(update.events)
        if self.releases != update.releases_emitted:
            raise RuntimeError(
                f"the accountant composed {self.releases} privacy events but the release objects "
                f"of {update.module} made {update.releases_emitted} releases: the reported "
                "epsilon would not be what the code did"
            )
        return update

    # -- ε and the budget ---------------------------------------------------------------------

    def epsilon(self) -> float:
        """ε spent so far at ``delta``."""
        if self.one_shot:
            (event,) = self.one_shot
            return gaussian_epsilon(event.noise_multiplier, self._delta(), 1.0)
        return self.accountant.get_epsilon(self._delta())

    def _delta(self) -> float:
        if self.delta is None:
            raise RuntimeError("delta is unknown: give PrivacyAccountantCallback(delta=...)")
        return self.delta

    def _budget_total(self, sigma: float, q: float) -> tuple[int, int]:
        """``(steps of (σ, q) in the current run, largest total for that run within target)``."""
        history = self.accountant.history
        if history and history[-1][:2] == (sigma, q):
            prefix, in_run = tuple(history[:-1]), history[-1][2]
        else:
            prefix, in_run = tuple(history), 0
        key = (sigma, q, prefix, self.accountant.sampling)
        if self._budget is None or self._budget[0] != key:
            assert self.target_epsilon is not None
            extra = self.accountant.max_additional_steps(
                sigma, q, self.target_epsilon, self._delta()
            )
            self._budget = (key, in_run + extra)
        return in_run, self._budget[1]

    def remaining_steps(self, step: SubsampledGaussianStep) -> int:
        """How many more events ``step`` keep ε ≤ ``target_epsilon``."""
        self.accountant.sampling = step.sampling
        in_run, total = self._budget_total(step.noise_multiplier, step.sample_rate)
        return total - in_run

    # -- Lightning hooks ----------------------------------------------------------------------

    def _adopt_module_budget(self, module: ReleasesPrivateData) -> None:
        """δ from the release objects (refusing a different one of ours) and the module's own
        ``target_epsilon`` as the budget (the smaller, if we have one too)."""
        name = type(module).__name__
        declared = module.privacy_delta()
        if self.delta is None:
            if declared is None:
                raise ValueError(
                    f"PrivacyAccountantCallback(delta=None) takes delta from the release objects "
                    f"of {name}, which declare none: add a PrivacyAccountantCallback with delta "
                    "(and a target_epsilon) to the config"
                )
            self.delta = declared
        elif declared is not None and not math.isclose(declared, self.delta, rel_tol=1e-9):
            raise ValueError(
                f"PrivacyAccountantCallback(delta={self.delta!r}) differs from delta="
                f"{declared!r} that the release objects of {name} are calibrated or reported "
                "for: one run has one (epsilon, delta) guarantee, so set the two equal (or leave "
                "the callback's delta unset)"
            )
        own = module.target_epsilon
        if own is not None and (self.target_epsilon is None or own < self.target_epsilon):
            if self.target_epsilon is not None:
                rank_zero_info(
                    f"PrivacyAccountantCallback: {name} calibrated its noise for target_epsilon="
                    f"{own}, below the callback's {self.target_epsilon}; enforcing {own}"
                )
            self.target_epsilon = own

    def check_before_release(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Refuse a method that releases nothing this accountant composes (a local-DP method,
        whose guarantee is its data release's), before the datamodule releases anything
        (:func:`~lightning_dpot.data.protocols.check_before_release`)."""
        require_private(pl_module)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        module = require_private(pl_module)
        # trainer.log_dir broadcasts under DDP: every rank calls it here, once.
        self._log_dir = Path(trainer.log_dir or trainer.default_root_dir)
        self._ended_by, self._journal_ready, self._ledger = None, False, None
        self._adopt_module_budget(module)
        if self.target_epsilon is not None:
            check_fixed_accumulation(trainer)
        module.check_restored_plan(self._restored_plan)
        self._plan = module.privacy_plan()
        self._events_per_step = trainer.accumulate_grad_batches
        self._start_journal(trainer, module)
        self._open_ledger_entry(trainer, module)
        self._outside = outside_the_guarantee(trainer)
        planned = module.planned_events()
        if self.target_epsilon is not None and planned:  # before the module draws them
            trial = copy.deepcopy(self)
            trial.compose(planned)
            if trial.epsilon() > self.target_epsilon:
                raise ValueError(
                    f"target_epsilon={self.target_epsilon!r}: the release(s) "
                    f"{type(pl_module).__name__} makes before training ({planned}) would spend "
                    f"epsilon={trial.epsilon():.6g} at delta={self.delta!r}; nothing was released"
                )
        if self.target_epsilon is not None and (trainer.min_steps or trainer.min_epochs):
            warnings.warn(
                f"min_steps={trainer.min_steps!r} / min_epochs={trainer.min_epochs!r} keep "
                "Lightning from stopping early: if the privacy budget runs out before they are "
                "met, PrivacyAccountantCallback raises PrivacyBudgetExceededError before the "
                "step that would exceed it",
                UserWarning,
                stacklevel=2,
            )

    # -- the privacy ledger ---------------------------------------------------------------------

    def _open_ledger_entry(self, trainer: L.Trainer, module: ReleasesPrivateData) -> None:
        """Enter the run in its datamodule's privacy ledger (global rank 0) before its first
        release, at the most it may spend: its target, else the ε of its planned releases on
        top of the restored ones. A resumed run whose entry this ledger holds for the same
        records sets it back to that (an earlier settlement counted only the releases made
        before it), checking ``privacy_budget`` as for a new entry; otherwise it opens one."""
        datamodule = trainer.datamodule
        if not trainer.is_global_zero or not isinstance(datamodule, CentralRunLedger):
            return
        planned = self._planned_epsilon(trainer, module)
        kept = self._ledger_entry
        if kept is not None and datamodule.ledger_holds(kept[0]):
            planned = max(planned, kept[1])
            datamodule.ledger_reopen(kept[0], planned, self.delta)
            self._ledger_entry = (kept[0], planned)
            return
        facts = {"method": type(module).__name__, "accountant": self.accountant.name}
        self._ledger_entry = (datamodule.ledger_open(planned, self.delta, facts), planned)

    def _planned_epsilon(self, trainer: L.Trainer, module: ReleasesPrivateData) -> float:
        if self.target_epsilon is not None:
            return self.target_epsilon
        trial = copy.deepcopy(self)
        trial.compose(module.planned_events())
        per_batch = len(module.next_step_events())
        if per_batch:
            try:
                batches = planned_releases(trainer, int(trainer.datamodule.steps_per_epoch))
            except ValueError as error:
                raise ValueError(
                    f"{type(module).__name__} has no target_epsilon and no finite training "
                    "length, so the privacy ledger cannot be told the most it may spend: set "
                    "a target_epsilon, or trainer.max_steps / max_epochs"
                ) from error
            step = look_ahead_step(module.next_step_events(), type(module).__name__)
            assert step is not None
            trial.accountant.sampling = step.sampling
            trial.accountant.step(step.noise_multiplier, step.sample_rate, per_batch * batches)
        return trial.epsilon()

    def _settle_ledger_entry(self, trainer: L.Trainer) -> None:
        """Settle the run's entry at what it spent (once) and keep the ledger's total for the
        report."""
        if self._ledger_entry is None or self._ledger is not None or not trainer.is_global_zero:
            return
        datamodule = trainer.datamodule
        datamodule.ledger_settle(self._ledger_entry[0], self.epsilon(), self.delta)
        self._ledger = {
            "entry": self._ledger_entry[0],
            "all_releases_of_these_records": datamodule.ledger_total().as_dict(),
            "composition": "basic (sum of epsilons and deltas), worst record",
            "keying": datamodule.ledger_keying,
            "privacy_budget": datamodule.privacy_budget,
            "path": str(datamodule.ledger.path),
        }

    # -- the release journal ------------------------------------------------------------------

    def _start_journal(self, trainer: L.Trainer, module: ReleasesPrivateData) -> None:
        """Before the run's first release: compose the journal the restored checkpoint names
        (every release of the run and its earlier resumes, also those after the checkpoint),
        then attach it, or a new journal for a new run, to every release object. Global rank 0
        reads and writes it; every rank composes the same events (broadcast)."""
        restored = self._restored_journal
        outcome: tuple[str, Any] | None = None
        if trainer.is_global_zero and restored is not None:
            try:
                self._journal = ReleaseJournal(*restored)
                self._journal.acquire()  # held until the run ends: no concurrent resume
                outcome = ("entries", self._read_journal(*restored))
            except (OSError, ValueError, RuntimeError) as error:
                outcome = ("error", error)
        outcome = trainer.strategy.broadcast(outcome, src=0)
        if outcome is not None and outcome[0] == "error":
            raise outcome[1]
        if outcome is not None:
            self._adopt_journal(outcome[1], module)
        if trainer.is_global_zero:
            if restored is None:  # a new run, or a checkpoint naming no journal: its releases
                assert self._log_dir is not None
                name = f"privacy_journal-{uuid.uuid4().hex[:12]}.jsonl"
                self._journal = ReleaseJournal(self._log_dir / name)
                self._journal.acquire()
                self._journal.start([(0, event) for event in self._composed_events()])
            assert self._journal is not None
            for index, release in enumerate(module.privacy_releases()):
                release.events.journal = self._journal.writer(index)
        self._journal_ready = True

    def _composed_events(self) -> list[PrivacyEvent]:
        """The events the accountant has composed, in a canonical order."""
        n, b = self._swor_sizes
        sampling = self.accountant.sampling
        events: list[PrivacyEvent] = list(self.one_shot)
        for sigma, q, count in self.accountant.history:
            events += [SubsampledGaussianStep(sigma, q, sampling, n, b)] * count
        return events

    @staticmethod
    def _read_journal(path: str, journal_id: str) -> list[tuple[int, PrivacyEvent]]:
        if not Path(path).is_file():
            raise FileNotFoundError(
                f"the checkpoint names the release journal {path!r}, which is missing: it "
                "holds every release of the run, including those made after the checkpoint was "
                "written, whose outputs may have left the process. Put the journal back at that "
                "path to resume"
            )
        return ReleaseJournal(path, journal_id).read()

    def _adopt_journal(
        self, entries: list[tuple[int, PrivacyEvent]], module: ReleasesPrivateData
    ) -> None:
        """Replace the restored history by the journal's, after checking that the checkpoint's
        releases are its beginning."""
        assert self._restored_journal is not None
        path = self._restored_journal[0]
        restored = (self.accountant.history, list(self.one_shot))
        count = self.releases
        if len(entries) < count:
            raise ValueError(
                f"the release journal {path!r} holds {len(entries)} releases "
                f"but the checkpoint composed {count}: it is not this run's journal"
            )
        self._reset_history()
        self.compose([event for _, event in entries[:count]])
        if (self.accountant.history, self.one_shot) != restored:
            raise ValueError(
                f"the first {count} releases of the journal {path!r} differ "
                "from the checkpoint's: it is not this run's journal"
            )
        self.compose([event for _, event in entries[count:]])
        releases = module.privacy_releases()
        if any(not 0 <= index < len(releases) for index, _ in entries):
            raise ValueError(
                f"the release journal {path!r} names release objects that "
                f"{type(module).__name__} does not have"
            )
        for index, release in enumerate(releases):
            release.events.replace([event for i, event in entries if i == index])
        if len(entries) > count:
            rank_zero_info(
                f"PrivacyAccountantCallback: {len(entries) - count} release(s) made after the "
                f"checkpoint are composed from the run's journal ({len(entries)} in all)"
            )

    def _reset_history(self) -> None:
        self.accountant.load_state_dict({**self.accountant.state_dict(), "history": []})
        self.one_shot = []
        self._budget = None

    def _account_earlier(self, trainer: L.Trainer, module: ReleasesPrivateData) -> None:
        """Before the first drain of a run resumed without accountant state."""
        releases = module.privacy_releases()
        made = [release.events.total - len(release.events.pending) for release in releases]
        if not any(made) and trainer.global_step == 0:
            return
        name = type(module).__name__
        if self.earlier_releases == "refuse":
            raise ValueError(
                f"training resumes at global_step={trainer.global_step} with {sum(made)} earlier "
                f"release(s) of {name}, but the checkpoint holds no PrivacyAccountantCallback "
                "state: they would go unaccounted. Resume from a checkpoint written with the "
                "callback, or declare them with PrivacyAccountantCallback("
                "earlier_releases='as_configured')"
            )
        if not any(made):
            raise ValueError(
                f"training resumes at global_step={trainer.global_step}, but the checkpoint of "
                f"{name} holds no release counts: the earlier releases cannot be known, so "
                "they cannot be declared either"
            )
        earlier = []
        for index, (release, count) in enumerate(zip(releases, made, strict=True)):
            events = release.events.events()[:count]
            if len(events) != count:
                raise ValueError(
                    f"the checkpoint of {name} counts {count} earlier release(s) but stores "
                    f"the noise and sampling of {len(events)}: they cannot be declared"
                )
            earlier += [(index, event) for event in events]
        self.compose([event for _, event in earlier])
        if self._journal is not None:  # the journal holds every release of the run
            self._journal.start(earlier + self._journal.read())
        rank_zero_info(
            f"PrivacyAccountantCallback: {self.releases} earlier release(s) of {name} composed "
            "with the noise multiplier and sample rate the checkpoint stores for each "
            "(earlier_releases='as_configured')"
        )

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        module = require_private(pl_module)
        self.stopped_by_budget = False
        if not self._restored:
            self._account_earlier(trainer, module)
        # Again: some strategies restore callback state only after on_fit_start.
        module.check_restored_plan(self._restored_plan)
        update = self._apply(module.privacy_update())
        self.epsilon_curve.record(trainer.global_step, self.epsilon() if self.releases else 0.0)
        if self._restored_target is not None and self._restored_target != self.target_epsilon:
            warnings.warn(
                f"PrivacyAccountantCallback: target_epsilon changed on resume from "
                f"{self._restored_target} to {self.target_epsilon}; the {self.releases} "
                "restored releases still count",
                UserWarning,
                stacklevel=2,
            )
        if self.target_epsilon is None:
            return
        spent = self.epsilon()
        if spent > self.target_epsilon:
            raise ValueError(
                f"target_epsilon={self.target_epsilon!r} is already exceeded at delta="
                f"{self.delta!r}: the {self.releases} composed releases spend epsilon="
                f"{spent:.6g}. Training can only spend more; raise target_epsilon or start a new "
                "run on new data"
            )
        step = look_ahead_step(update.next_events, update.module)
        if step is None:
            return
        remaining = self.remaining_steps(step)
        if remaining < self._events_per_step:
            self.stopped_by_budget = True
            trainer.should_stop = True
            if self.releases == 0:
                raise ValueError(
                    f"target_epsilon={self.target_epsilon!r} cannot be met even by one step: "
                    f"{self._events_per_step} event(s) of {step} already exceed it at "
                    f"delta={self.delta!r} ({self.accountant.name}). Raise the noise multiplier, "
                    "lower the sample rate or raise the target"
                )
            rank_zero_info(
                f"PrivacyAccountantCallback: privacy budget exhausted, no step taken; the "
                f"{self.releases} restored releases spend epsilon={spent:.6g}"
            )
            return
        rank_zero_info(
            f"PrivacyAccountantCallback: {remaining} more releases of noise_multiplier="
            f"{step.noise_multiplier}, sample_rate={step.sample_rate} fit in (epsilon="
            f"{self.target_epsilon}, delta={self.delta}) ({self.accountant.name}; "
            f"{self.releases} spent so far)"
        )

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.target_epsilon is None:
            return
        update = self._apply(require_private(pl_module).privacy_update())
        step = look_ahead_step(update.next_events, update.module)
        if step is None or self.remaining_steps(step) >= 1:
            return
        trainer.should_stop = True
        self.stopped_by_budget = True
        raise PrivacyBudgetExceededError(
            f"the next release ({step}) would take epsilon from {self.epsilon():.6g} past "
            f"target_epsilon={self.target_epsilon} at delta={self.delta}; Lightning could not "
            "stop before it (min_steps/min_epochs), so training is aborted before it runs"
        )

    @override
    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        update = self._apply(require_private(pl_module).privacy_update())
        if self.target_epsilon is not None:
            step = look_ahead_step(update.next_events, update.module)
            if step is not None and self.remaining_steps(step) < self._events_per_step:
                self.stopped_by_budget = True
                trainer.should_stop = True
                rank_zero_info(
                    f"PrivacyAccountantCallback: stopping after {self.releases} releases at "
                    f"epsilon={self.epsilon():.6g}: one more optimizer step would exceed "
                    f"target_epsilon={self.target_epsilon} at delta={self.delta} "
                    f"({self.accountant.name})"
                )
        if update.events and self._should_log(trainer):
            epsilon = self.epsilon()
            self.epsilon_curve.record(trainer.global_step, epsilon)
            for name, value in (("epsilon", epsilon), ("delta", self._delta())):
                pl_module.log(
                    name, value, prog_bar=True, on_step=True, on_epoch=False, batch_size=1
                )
            pl_module.log(
                "privacy/releases",
                float(self.releases),
                on_step=True,
                on_epoch=False,
                batch_size=1,
            )

    def _should_log(self, trainer: L.Trainer) -> bool:
        every = self.log_every_n_steps
        if every is None:
            every = 1 if self.accountant.name == "rdp" else max(1, trainer.log_every_n_steps)
        return self.stopped_by_budget or self.releases % every == 0

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        module = require_private(pl_module)
        self._apply(module.privacy_update())
        self._facts = module.privacy_facts()
        self.epsilon_curve.record(trainer.global_step, self.epsilon() if self.releases else 0.0)
        try:
            self._settle_ledger_entry(trainer)
        finally:  # the report is written even if the ledger cannot be settled
            if trainer.is_global_zero:
                write_privacy_report(self._report_path(trainer), self.report())
            self._release_journal()
        if trainer.is_global_zero and self.plot_filename is not None:
            plot_epsilon_curve(
                self.epsilon_curve,
                (self._log_dir or Path(trainer.default_root_dir)) / self.plot_filename,
                delta=self.delta,
                target_epsilon=self.target_epsilon,
                accountant="analytic Gaussian" if self.one_shot else self.accountant.name,
            )

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """A run that ends by an exception after releasing still reports what it released:
        the events emitted so far are composed, the ledger entry is settled and
        ``privacy_report.json`` is written, saying which exception ended the run."""
        try:
            if self._note_exception(trainer, pl_module, exception) and self.releases:
                if trainer.is_global_zero:
                    write_privacy_report(self._report_path(trainer), self.report())
        finally:
            self._release_journal()

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._release_journal()

    def _release_journal(self) -> None:
        """Give up the journal's lock (:meth:`ReleaseJournal.acquire`): the run is over, so
        another process may resume it."""
        if self._journal is not None:
            self._journal.release()

    def _note_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException | None
    ) -> bool:
        """Compose what was emitted but not drained, settle the ledger entry and note the
        exception (once). False when there is nothing consistent to report: fitting had not
        started, the run's journal was not composed yet (then the restored count would be too
        small, and the ledger entry stays as it was), or the state itself is what failed; the
        journal remains the record."""
        if not isinstance(pl_module, ReleasesPrivateData) or not self._journal_ready:
            return False
        if self._ended_by is None:
            self._ended_by = type(exception).__name__ if exception is not None else "exception"
        try:
            self.compose(pl_module.privacy_update().events)
            self._facts = pl_module.privacy_facts()
        except Exception:
            return False
        try:
            self._settle_ledger_entry(trainer)
        except Exception as error:  # the report still goes out; the entry keeps its opening ε
            warnings.warn(
                f"PrivacyAccountantCallback: the privacy ledger entry could not be settled "
                f"({error}); it stays at the epsilon it was opened at",
                UserWarning,
                stacklevel=2,
            )
        return True

    def _report_path(self, trainer: L.Trainer) -> Path:
        return (self._log_dir or Path(trainer.default_root_dir)) / self.report_filename

    # -- checkpoint state -----------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": self._STATE_VERSION,
            "accountant": self.accountant.state_dict(),
            "one_shot": [event.noise_multiplier for event in self.one_shot],
            "one_shot_adjacency": [event.adjacency for event in self.one_shot],
            "swor_sizes": list(self._swor_sizes),
            "target_epsilon": self.target_epsilon,
            "delta": self.delta,
            "privacy_plan": self._plan,
            "journal": None
            if self._journal is None
            else [str(self._journal.path), self._journal.id],
            "ledger_entry": None if self._ledger_entry is None else list(self._ledger_entry),
            "epsilon_curve": self.epsilon_curve.state_dict(),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.accountant.load_state_dict(state_dict["accountant"])
        self.one_shot = [
            GaussianRelease(sigma, adjacency)
            for sigma, adjacency in zip(
                state_dict["one_shot"], state_dict["one_shot_adjacency"], strict=True
            )
        ]
        self._swor_sizes = tuple(state_dict["swor_sizes"])
        self._restored_target = state_dict.get("target_epsilon")
        self._restored_plan = state_dict.get("privacy_plan")
        journal = state_dict.get("journal")
        self._restored_journal = None if journal is None else (str(journal[0]), str(journal[1]))
        entry = state_dict.get("ledger_entry")
        self._ledger_entry = None if entry is None else (str(entry[0]), float(entry[1]))
        if "epsilon_curve" in state_dict:  # absent from checkpoints of earlier versions
            self.epsilon_curve.load_state_dict(state_dict["epsilon_curve"])
        self._restored = True
        self._budget = None

    # -- report ---------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """The privacy section of ``report.json`` and ``privacy_report.json`` (plain JSON):
        :func:`~lightning_dpot.privacy.accounting.report.privacy_report` of what was composed."""
        return privacy_report(
            self.accountant,
            self.one_shot,
            epsilon=self.epsilon() if self.delta is not None else None,
            delta=self.delta,
            target_epsilon=self.target_epsilon,
            also_report=self.also_report,
            swor_sizes=self._swor_sizes,
            releases=self.releases,
            stopped_by_budget=self.stopped_by_budget,
            module_facts=self._facts,
            journal=None if self._journal is None else str(self._journal.path),
            outside_the_guarantee=self._outside,
            ended_by=self._ended_by,
            ledger=self._ledger,
        )

    def report_section(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """Hook of :class:`~lightning_dpot.callbacks.run_report.RunReport`; called while an
        exception is handled (``trainer.interrupted``), it first composes what was released
        up to the exception, whichever callback's ``on_exception`` runs first."""
        if trainer.interrupted and self._ended_by is None:
            self._note_exception(trainer, pl_module, sys.exc_info()[1])
        return self.report()
