"""The accountant: compose every privacy event a run emits, log (ε, δ), stop before a target,
and write the one privacy report.

A private module subclasses ``ReleasesPrivateData`` and
names its release objects; each call of one on private data emits one typed event
(``lightning_dpot.privacy.events``). This callback is thin Lightning hooks around four parts:

* ``Composition`` composes the drained
  events, O(1) each: subsampled steps by the driving accountant (``"rdp"`` or ``"pld"``; one
  scheme per run), or one ``GaussianRelease`` alone (the
  single release of DPSWflow or DP-MERF, analytic ε);
* ``Budget`` decides, from the events so far, the
  next optimizer step's events and the target, whether training continues;
* ``RunRecord`` keeps the record: the run's release
  journal (what a resume, an export and the report are derived from) and its ledger entry;
* ``lightning_dpot.privacy.accounting.report`` formats the report.

What it enforces (``docs/privacy_accounting.md`` has each rule with its test)
-----------------------------------------------------------------------------
* **Composed = emitted** after every batch; a batch of a module whose steps release emits
  exactly the events its look-ahead announced (checked before the optimizer step), and a module
  whose steps release nothing has released before training.
* **The budget**: with a ``target_epsilon`` (the module's own, or the callback's if smaller)
  training stops **before** the first optimizer step that would exceed it at δ, or raises
  ``PrivacyBudgetExceededError`` where Lightning cannot stop (``min_steps``/``min_epochs``).
  A one-shot release the target cannot afford is refused before it is drawn.
* **Before anything is released**: Lightning's tuners, and a δ other than the release objects'.
* **Resumes**: checkpoints hold the state (composition, plan, journal by absolute path, id and
  position, ledger entry, ε curve; earlier layouts via
  ``lightning_dpot.privacy.accounting.migration``); a resume composes the whole journal
  (``journal_path`` if it moved with the run).
  A checkpoint without this state after releases is refused unless ``earlier_releases=
  "as_configured"`` declares them; a resume calibrated otherwise is refused.
* **Durability**: journal lines are committed in groups, after every callback's batch end,
  before anything derived from them can leave the process (a logged metric, an epoch's end, a
  checkpoint, the run's end, a crash).

It logs ``epsilon``, ``delta`` and ``privacy/releases`` every ``log_every_n_steps``, records
(step, ε) in a bounded ``EpsilonCurve`` drawn as
``epsilon.png``, and writes ``privacy_report.json`` and the ``privacy`` section of
``report.json`` (rank 0), also when an exception ends a run that released.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_dpot.callbacks.batch_end import AfterBatch, put_last
from lightning_dpot.callbacks.privacy_budget import (
    module_budget,
    planned_epsilon,
    warn_if_not_first,
    warn_if_target_changed,
    warn_if_unstoppable,
)
from lightning_dpot.callbacks.privacy_record import (
    RunRecord,
    declare_earlier,
    forgotten_release,
    logs_or_ends,
    output_follows,
    same_events,
)
from lightning_dpot.callbacks.privacy_reports import AccountantReports
from lightning_dpot.callbacks.scope import outside_the_guarantee
from lightning_dpot.checks import check_delta, check_epsilon, check_positive_int
from lightning_dpot.data.protocols import ChecksBeforeRelease
from lightning_dpot.privacy.accounting.budget import Budget, Decision
from lightning_dpot.privacy.accounting.composition import Composition
from lightning_dpot.privacy.accounting.migration import (
    ACCOUNTANT_STATE_VERSION,
    migrate_accountant_state,
)
from lightning_dpot.privacy.contract import (
    PrivacyUpdate,
    check_bases,
    look_ahead_step,
    refuse_tuners,
    require_private,
)
from lightning_dpot.privacy.events import PrivacyEvent, SubsampledGaussianStep
from lightning_dpot.privacy.guards import check_fixed_accumulation


class PrivacyBudgetExceededError(RuntimeError):
    """Raised before an optimizer step that would take ε past the target."""


class PrivacyAccountantCallback(AccountantReports):
    """Compose the module's privacy events, report them, and optionally stop at a budget.

    Args:
        target_epsilon: ε that training must never exceed (> 0); ``None``: account and report
            only (the module's own target, if it calibrated to one, is still enforced).
        delta: δ of the guarantee, in (0, 1); ``None`` takes the δ the module's release objects
            declare; required with ``target_epsilon``, and equal to theirs where they declare one.
        accountant: accountant that drives logging and stopping, ``"rdp"`` or ``"pld"``.
        also_report: further accountants whose ε goes into ``report``.
        log_every_n_steps: log ε (and commit the journal) every this many releases, when the
            logger writes and at an epoch's or the run's end (the progress bar shows the last
            logged ε); default ``trainer.log_every_n_steps``.
        report_filename: name of the JSON report written to ``trainer.log_dir``.
        plot_filename: PNG of ε against the optimizer step (``None``: no plot).
        earlier_releases: a resume from a checkpoint without this callback's state after
            private releases: ``"refuse"`` (default) or ``"as_configured"`` (module docstring).
        journal_path: a resume's journal where it lies now, if it moved with the run (another
            machine); checked like the one the checkpoint names. Settable until fit starts.

    Raises:
        ValueError: naming the parameter, for a value out of range; at fit start, the refusals
            of the module docstring.
        TypeError: at fit start, a module that does not subclass ReleasesPrivateData.
        PrivacyBudgetExceededError: before a step past the target that Lightning could not stop.

    Example::

        >>> from lightning_dpot.callbacks import PrivacyAccountantCallback
        >>> accountant = PrivacyAccountantCallback(target_epsilon=8.0, delta=1e-5)
        >>> accountant.epsilon(), accountant.releases  # trainer.fit(model, datamodule=dm) next
        (0.0, 0)
    """

    composes_privacy_events = True  # what lightning_dpot.privacy.guards looks for

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
        journal_path: str | Path | None = None,
    ) -> None:
        super().__init__(also_report, accountant, report_filename, plot_filename)
        self.target_epsilon = (
            None if target_epsilon is None else check_epsilon("target_epsilon", target_epsilon)
        )
        if self.target_epsilon is not None and delta is None:
            raise ValueError("delta is required with target_epsilon (a budget is an (ε, δ) pair)")
        self.delta = None if delta is None else check_delta("delta", delta)
        self.composition = Composition(accountant)
        every = log_every_n_steps
        self.log_every_n_steps = (
            None if every is None else check_positive_int("log_every_n_steps", every)
        )
        if earlier_releases not in ("refuse", "as_configured"):
            raise ValueError(
                f"earlier_releases must be 'refuse' or 'as_configured', got {earlier_releases!r}"
            )
        self.earlier_releases = earlier_releases
        self.record, self.journal_path = RunRecord(), journal_path
        self.stopped_by_budget, self._released = False, False
        self._after = AfterBatch(self._after_batch)
        self._restored: dict[str, Any] | None = None  # the checkpoint's state (current layout)
        self._budget: Budget | None = None
        self._decision = Decision(True, None, "")
        self._expected: tuple[PrivacyEvent, ...] = ()  # what the next batch must emit
        self._per_step = 1
        self._plan: dict[str, Any] | None = None

    # -- composition ----------------------------------------------------------------------------

    def compose(self, events: Sequence[PrivacyEvent]) -> None:
        """Add ``events`` to the composition (validated: one scheme, one kind)."""
        self.composition.add_all(events)

    def remaining_steps(self, step: SubsampledGaussianStep) -> int:
        """How many more events ``step`` keep ε ≤ ``target_epsilon``."""
        if self.target_epsilon is None:
            raise RuntimeError("remaining_steps needs a target_epsilon")
        if self._budget is None or self._budget.target_epsilon != self.target_epsilon:
            self._budget = Budget(self.target_epsilon, self._delta())
        return self._budget.remaining(self.composition, step)

    def _decide(self, update: PrivacyUpdate) -> Decision:
        """The budget's decision on one more optimizer step (also remembers the look-ahead)."""
        step = look_ahead_step(update.next_events, update.module)
        self._expected = update.next_events
        if self._budget is None:
            return Decision(True, None, "no target")
        return self._budget.decide(self.composition, step, self._per_step)

    # -- before anything is released ------------------------------------------------------------

    def check_before_release(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Refuse, before a datamodule releases anything, a method that releases nothing this
        accountant composes (a local-DP method)."""
        require_private(pl_module)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Before any callback's ``on_fit_start`` (where Lightning's tuners run their trials):
        refuse the tuners on this private module."""
        refuse_tuners(trainer, type(pl_module).__name__)
        put_last(trainer, self._after)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        module = require_private(pl_module)
        check_bases(module)
        refuse_tuners(trainer, type(module).__name__)
        for callback in trainer.callbacks:  # their refusals before this run's ledger entry
            if callback is not self and isinstance(callback, ChecksBeforeRelease):
                callback.check_before_release(trainer, module)
        warn_if_not_first(trainer, self)
        # trainer.log_dir broadcasts under DDP: every rank calls it here, once.
        self._log_dir = Path(trainer.log_dir or trainer.default_root_dir).absolute()
        self._ended_by, self.record.ready, self.record.ledger = None, False, None
        self.delta, self.target_epsilon = module_budget(module, self.delta, self.target_epsilon)
        self._budget = (
            None if self.target_epsilon is None else Budget(self.target_epsilon, self.delta)
        )
        if self._budget is not None:
            check_fixed_accumulation(trainer)
        module.check_restored_plan(self._restored and self._restored["privacy_plan"])
        self._plan = module.privacy_plan()
        self._per_step = trainer.accumulate_grad_batches
        self.record.start(trainer, module, self.composition, self._log_dir, self.journal_path)
        facts = {"method": type(module).__name__, "accountant": self.accountant.name}
        self.record.open_ledger_entry(
            trainer,
            facts,
            lambda: planned_epsilon(
                trainer, module, self.composition, self._delta(), self.target_epsilon
            ),
            self.delta,
        )
        self._outside = outside_the_guarantee(trainer)
        if self._budget is not None:  # before the module draws them
            self._budget.check_planned(self.composition, module.planned_events())
            warn_if_unstoppable(trainer)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        module = require_private(pl_module)
        self.stopped_by_budget = False
        if self._restored is None:
            earlier = declare_earlier(trainer, module, self.earlier_releases)
            self.composition.add_all(event for _, event in earlier)
            self.record.prepend(earlier)
        # Again: some strategies restore callback state only after on_fit_start.
        module.check_restored_plan(self._restored and self._restored["privacy_plan"])
        update = self._apply(module.privacy_update())
        # A one-shot release is drawn on global rank 0 and broadcast: rank 0 holds its event.
        if not update.next_events and not self.releases and trainer.is_global_zero:
            raise RuntimeError(
                f"{type(module).__name__}'s training steps release nothing and it made no release "
                "before training: it would train on private data without noise. Call its release "
                "object before training, or declare the events each step emits"
            )
        self.record.commit()  # a release made before training (DPSWflow, DP-MERF) is on disk
        self.epsilon_curve.record(trainer.global_step, self.epsilon())
        if self._restored is not None:
            warn_if_target_changed(
                self._restored["target_epsilon"], self.target_epsilon, self.releases
            )
        self._decision = self._decide(update)
        if self._budget is None:
            return
        spent = self.epsilon()
        if spent > self._budget.target_epsilon:
            raise ValueError(
                f"target_epsilon={self.target_epsilon!r} is already exceeded at delta="
                f"{self.delta!r}: the {self.releases} composed releases spend epsilon="
                f"{spent:.6g}. Training can only spend more; raise target_epsilon or start a new "
                "run on new data"
            )
        if self._decision.go:
            if self._decision.remaining is not None:
                rank_zero_info(
                    f"PrivacyAccountantCallback: {self._decision.remaining} more releases fit in "
                    f"(epsilon={self.target_epsilon}, delta={self.delta}) "
                    f"({self.accountant.name}; {self.releases} spent so far)"
                )
            return
        self.stopped_by_budget = trainer.should_stop = True
        if self.releases == 0:
            raise ValueError(
                f"target_epsilon={self.target_epsilon!r} cannot be met even by one step: "
                f"{self._decision.reason}. Raise the noise multiplier, lower the sample rate or "
                "raise the target"
            )
        rank_zero_info(
            f"PrivacyAccountantCallback: privacy budget exhausted, no step taken; the "
            f"{self.releases} restored releases spend epsilon={spent:.6g}"
        )

    @override
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._decision.go:
            return
        trainer.should_stop = self.stopped_by_budget = True
        raise PrivacyBudgetExceededError(
            f"{self._decision.reason} (epsilon so far {self.epsilon():.6g}); Lightning could not "
            "stop before it (min_steps/min_epochs), so training is aborted before it runs"
        )

    @override
    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        """After the backward pass, before the weights move: a step that consumed a private
        batch must have emitted its release (a method that forgets fails here, untrained)."""
        module = require_private(pl_module)
        pending = tuple(e for release in module.privacy_releases() for e in release.events.pending)
        if not same_events(pending, self._expected):
            raise RuntimeError(forgotten_release(type(module).__name__, pending, self._expected))

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        expected = self._expected
        update = self._apply(require_private(pl_module).privacy_update())
        if not same_events(update.events, expected):
            raise RuntimeError(forgotten_release(update.module, update.events, expected))
        self._decision = self._decide(update)
        if not self._decision.go:
            self.stopped_by_budget = trainer.should_stop = True
            rank_zero_info(
                f"PrivacyAccountantCallback: stopping after {self.releases} releases at "
                f"epsilon={self.epsilon():.6g}: {self._decision.reason} ({self.accountant.name})"
            )
        self._released = bool(update.events)
        if output_follows(trainer, args[-1]):  # e.g. the progress bar, listed after this one
            self.record.commit()

    def _after_batch(self, trainer: L.Trainer, pl_module: Any, batch_idx: int) -> None:
        """After every callback's batch end (one may have stopped training, so that the logger
        writes): commit, and log ε when due, not at every progress-bar refresh (a logged value
        becomes a tensor on the module's device)."""
        every = self.log_every_n_steps or max(1, trainer.log_every_n_steps)
        released, self._released = self._released, False
        due = released and self.releases % every == 0
        if due or output_follows(trainer, batch_idx):
            self.record.commit()
        if released and (due or logs_or_ends(trainer, batch_idx)):
            epsilon = self.epsilon()
            self.epsilon_curve.record(trainer.global_step, epsilon)
            logged = {"epsilon": epsilon, "delta": self._delta(), "privacy/releases": self.releases}
            for name, value in logged.items():  # on the bar: ε and δ
                pl_module.log(name, float(value), prog_bar="/" not in name, batch_size=1)

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.record.commit()

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.record.commit()

    # -- checkpoint state -----------------------------------------------------------------------

    @override
    def state_dict(self) -> dict[str, Any]:
        self.record.commit()  # a checkpoint is derived from every release before it
        return {
            "version": ACCOUNTANT_STATE_VERSION,
            "composition": self.composition.state_dict(),
            "target_epsilon": self.target_epsilon,
            "delta": self.delta,
            "privacy_plan": self._plan,
            "journal": self.record.state(),
            "ledger_entry": self.record.ledger_entry and list(self.record.ledger_entry),
            "epsilon_curve": self.epsilon_curve.state_dict(),
            "stopped_by_budget": self.stopped_by_budget,
        }

    @override
    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """A checkpoint written before this batch was drained (a checkpoint callback listed
        before this one) holds weights its releases made: its state composes them too."""
        module = require_private(pl_module)
        pending = [e for release in module.privacy_releases() for e in release.events.pending]
        if pending:
            saved = Composition(self.accountant.name)
            saved.load_state_dict(self.composition.state_dict())
            saved.add_all(pending)
            checkpoint["callbacks"][self.state_key]["composition"] = saved.state_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = migrate_accountant_state(state_dict)
        self.composition.load_state_dict(state["composition"])
        self.record.load(state["journal"], state["ledger_entry"])
        if state["epsilon_curve"] is not None:
            self.epsilon_curve.load_state_dict(state["epsilon_curve"])
        self._restored = state
        self._budget = None
