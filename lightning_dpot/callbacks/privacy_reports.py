"""The end of a private run: its privacy report (``privacy_report.json`` and the ``privacy``
section of ``report.json``), the ε curve, the ledger settlement and the journal's last commit,
also when an exception ends the run; and the report of the releases a checkpoint holds.

``AccountantReports`` is the reporting half of
``PrivacyAccountantCallback``, which composes (its
``composition``), keeps the record (``record``) and holds the budget; the report's content is
formatted by ``lightning_dpot.privacy.accounting.report``.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_dpot.callbacks.privacy_record import RunRecord
from lightning_dpot.privacy.accounting.accountants import PrivacyAccountant
from lightning_dpot.privacy.accounting.analysis.epsilon import ACCOUNTANTS
from lightning_dpot.privacy.accounting.composition import Composition
from lightning_dpot.privacy.accounting.curve import EpsilonCurve, plot_epsilon_curve
from lightning_dpot.privacy.accounting.migration import (
    migrate_accountant_state,
    migrate_module_state,
)
from lightning_dpot.privacy.accounting.report import privacy_report, write_privacy_report
from lightning_dpot.privacy.contract import PrivacyUpdate, ReleasesPrivateData, require_private
from lightning_dpot.privacy.events import EventLog

__all__ = ["AccountantReports"]


class AccountantReports(Callback):
    """Report what was composed, at the end of a run or when an exception ends it.

    Args:
        also_report: further accountants whose ε goes into ``report`` (``accountant``, the
            driving one, is reported anyway).
        report_filename: name of the JSON report written to ``trainer.log_dir``.
        plot_filename: PNG of ε against the optimizer step (``None``: no plot).
    """

    report_key = "privacy"
    composition: Composition
    record: RunRecord
    delta: float | None
    target_epsilon: float | None
    stopped_by_budget: bool

    def __init__(
        self,
        also_report: Sequence[str],
        accountant: str,
        report_filename: str,
        plot_filename: str | None,
    ) -> None:
        super().__init__()
        also_report = [also_report] if isinstance(also_report, str) else list(also_report)
        for name in also_report:
            if name not in ACCOUNTANTS:
                raise ValueError(
                    f"also_report entries must be in {list(ACCOUNTANTS)}, got {name!r}"
                )
        self.also_report = [name for name in dict.fromkeys(also_report) if name != accountant]
        self.report_filename = report_filename
        self.plot_filename = plot_filename
        self.epsilon_curve = EpsilonCurve()
        self._facts: dict[str, Any] = {}
        self._outside: list[str] = []
        self._ended_by: str | None = None
        self._log_dir: Path | None = None

    @property
    def accountant(self) -> PrivacyAccountant:
        """The driving accountant (its history holds the composed subsampled steps)."""
        return self.composition.accountant

    @property
    def releases(self) -> int:
        """Events composed so far."""
        return self.composition.releases

    def epsilon(self) -> float:
        """ε spent so far at ``delta``."""
        return self.composition.epsilon(self._delta()) if self.releases else 0.0

    def _delta(self) -> float:
        if self.delta is None:
            raise RuntimeError("delta is unknown: give PrivacyAccountantCallback(delta=...)")
        return self.delta

    def _apply(self, update: PrivacyUpdate) -> PrivacyUpdate:
        """Compose the update's events and check the count against the release objects'."""
        self.composition.add_all(update.events)
        if self.releases != update.releases_emitted:
            raise RuntimeError(
                f"the accountant composed {self.releases} privacy events but the release objects "
                f"of {update.module} made {update.releases_emitted} releases: the reported "
                "epsilon would not be what the code did"
            )
        return update

    def _unaccounted(self, module: ReleasesPrivateData) -> int:
        return max(0, module.releases_emitted() - self.releases)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        module = require_private(pl_module)
        self._apply(module.privacy_update())
        self._facts = module.privacy_facts()
        self.epsilon_curve.record(trainer.global_step, self.epsilon())
        try:
            self.record.settle_ledger_entry(trainer, self.epsilon(), self.delta, 0)
        finally:  # the report is written even if the ledger cannot be settled
            self.record.close()
            if trainer.is_global_zero:
                write_privacy_report(self._report_path(trainer), self.report())
        if trainer.is_global_zero and self.plot_filename is not None:
            plot_epsilon_curve(
                self.epsilon_curve,
                (self._log_dir or Path(trainer.default_root_dir)) / self.plot_filename,
                delta=self.delta,
                target_epsilon=self.target_epsilon,
                accountant="analytic Gaussian"
                if self.composition.one_shot
                else self.accountant.name,
            )

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        """A run that ends by an exception after releasing still reports what it released:
        the events emitted so far are composed, the ledger entry settled (never below what was
        emitted) and ``privacy_report.json`` written, saying which exception ended the run."""
        try:
            if self._note_exception(trainer, pl_module, exception) and self.releases:
                if trainer.is_global_zero:
                    write_privacy_report(self._report_path(trainer), self.report())
        finally:
            self.record.close()

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.record.close()

    def _note_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException | None
    ) -> bool:
        """Commit the journal, compose what was emitted but not drained, settle the ledger
        entry and note the exception (once). False when there is nothing consistent to report
        (fitting had not started, or the state itself is what failed); the journal remains the
        record."""
        self.record.commit()
        if not isinstance(pl_module, ReleasesPrivateData) or not self.record.ready:
            return False
        if self._ended_by is None:
            self._ended_by = type(exception).__name__ if exception is not None else "exception"
        try:
            self.composition.add_all(pl_module.privacy_update().events)
            self._facts = pl_module.privacy_facts()
            unaccounted = self._unaccounted(pl_module)
        except Exception:
            return False
        try:
            self.record.settle_ledger_entry(trainer, self.epsilon(), self.delta, unaccounted)
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

    def report(self) -> dict[str, Any]:
        """The privacy section of ``report.json`` and ``privacy_report.json`` (plain JSON)."""
        one_shot = self.composition.one_shot
        journal = self.record.state()
        return privacy_report(
            self.accountant,
            [] if one_shot is None else [one_shot],
            epsilon=self.epsilon() if self.delta is not None else None,
            delta=self.delta,
            target_epsilon=self.target_epsilon,
            also_report=self.also_report,
            swor_sizes=self.composition.swor_sizes,
            releases=self.releases,
            stopped_by_budget=self.stopped_by_budget,
            module_facts=self._facts,
            journal=None if journal is None else journal["path"],
            outside_the_guarantee=self._outside,
            ended_by=self._ended_by,
            ledger=self.record.ledger,
        )

    def report_section(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        """Hook of ``RunReport``; called while an
        exception is handled (``trainer.interrupted``), it first composes what was released
        up to the exception, whichever callback's ``on_exception`` runs first."""
        if trainer.interrupted and self._ended_by is None:
            self._note_exception(trainer, pl_module, sys.exc_info()[1])
        return self.report()

    @classmethod
    def report_of_checkpoint(
        cls, checkpoint: dict[str, Any], delta: float | None = None
    ) -> dict[str, Any] | None:
        """The privacy report of the releases a checkpoint holds, whatever a later process of
        the run wrote: composed from its accountant state, or, where it has none (a fit without
        an accountant), from the events its release objects recorded (at ``delta``, or the δ
        their plan states). ``journal_position`` says how many releases of the run's journal
        it covers. ``None``: the checkpoint holds no central release (a local-DP run)."""
        section = migrate_module_state(checkpoint)
        kept = [v for k, v in checkpoint.get("callbacks", {}).items() if "PrivacyAccountant" in k]
        if kept:
            state = migrate_accountant_state(kept[0])
            accountant = cls(delta=state["delta"])
            accountant.load_state_dict(state)
            accountant.target_epsilon = state["target_epsilon"]
            accountant.stopped_by_budget = bool(state.get("stopped_by_budget"))
            position = (state["journal"] or {}).get("position")
        elif section is not None and any(r["events"]["total"] for r in section["releases"]):
            plan = (section.get("plan") or {}).get("calibrated_for") or {}
            accountant = cls(delta=delta if delta is not None else plan.get("delta"))
            for release in section["releases"]:
                log = EventLog()
                log.load_state_dict(release["events"])
                events = log.events()
                if len(events) != log.total:
                    raise ValueError(
                        f"the checkpoint counts {log.total} release(s) of a release object but "
                        f"stores the noise and sampling of {len(events)}, and holds no "
                        "accountant state: the ε of its releases cannot be stated"
                    )
                accountant.compose(events)
            position = None
        else:
            return None
        accountant._facts = (section or {}).get("facts") or {}
        return {**accountant.report(), "journal_position": position or accountant.releases}
