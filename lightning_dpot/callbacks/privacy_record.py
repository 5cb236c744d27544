"""The record of a private run's releases: its journal and its entry in the privacy ledger.

Within a run the journal (``lightning_dpot.privacy.accounting.journal``) is the record of what
was released; the accountant's composition, its report, the ε curve, an export and a resume are
derived from it. A checkpoint names the journal by absolute path and id, with the number of
releases it held when the checkpoint was written (its *position*), so a resume composes every
release of the run — also those made after the checkpoint — and a checkpoint states exactly the
releases its weights saw. A run that moved (another machine, another folder) resumes with the
accountant's ``journal_path`` naming where the journal lies now: it is checked as the one the
checkpoint names would be (its id, at least the checkpoint's position, the checkpoint's
releases as its beginning), and later checkpoints name it there. The ledger
(``lightning_dpot.data.ledger``) holds, per data set, every run's entry: opened before the
run's first release at the most it may spend, settled at what it spent.

Global rank 0 reads and writes both; under DDP the journal's events are broadcast, so every rank
composes the same history.
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from lightning_dpot.data.ledger import RunLedger
from lightning_dpot.privacy.accounting.composition import Composition
from lightning_dpot.privacy.accounting.journal import ReleaseJournal
from lightning_dpot.privacy.accounting.migration import migrate_accountant_state
from lightning_dpot.privacy.contract import ReleasesPrivateData
from lightning_dpot.privacy.events import PrivacyEvent

__all__ = [
    "RunRecord",
    "checkpoint_journal",
    "commit_releases",
    "declare_earlier",
    "forgotten_release",
    "logs_or_ends",
    "output_follows",
    "same_events",
]


class RunRecord:
    """A run's journal and ledger entry (module docstring)."""

    def __init__(self) -> None:
        self.journal: ReleaseJournal | None = None
        self.restored: dict[str, Any] | None = None  # {"path", "id", "position"} of a checkpoint
        self.ready = False
        self.ledger_entry: tuple[str, float] | None = None  # (id, ε it was opened at)
        self.ledger: dict[str, Any] | None = None  # the settled entry, for the report
        self.moved_from: str | None = None  # where the checkpoint named a journal that moved

    def load(self, journal: dict[str, Any] | None, ledger_entry: Sequence[Any] | None) -> None:
        """Take a checkpoint's journal (``{"path", "id", "position"}``) and ledger entry."""
        self.restored = journal
        entry = ledger_entry
        self.ledger_entry = None if entry is None else (str(entry[0]), float(entry[1]))

    # -- the journal ----------------------------------------------------------------------------

    def start(
        self,
        trainer: L.Trainer,
        module: ReleasesPrivateData,
        composition: Composition,
        log_dir: Path,
        journal_path: str | Path | None = None,
    ) -> None:
        """Before the run's first release: compose the journal a restored checkpoint names
        (every release of the run and its earlier resumes; at ``journal_path`` if it moved), or
        start a new one holding what ``composition`` already holds; then attach it to every
        release object.

        Raises:
            ValueError: ``journal_path`` without a restored checkpoint that names a journal.
        """
        restored, self.moved_from = _relocated(self.restored, journal_path)
        outcome: tuple[str, Any] | None = None
        if trainer.is_global_zero and restored is not None:
            try:
                _check_present(Path(restored["path"]), self.moved_from)  # before any lock file
                self.journal = ReleaseJournal(restored["path"], restored["id"])
                self.journal.acquire()  # held until the run ends: no concurrent resume
                outcome = ("entries", self.journal.read())
            except (OSError, ValueError, RuntimeError) as error:
                outcome = ("error", error)
        outcome = trainer.strategy.broadcast(outcome, src=0)
        if outcome is not None and outcome[0] == "error":
            raise outcome[1]
        if outcome is not None:
            assert restored is not None
            _adopt(outcome[1], module, composition, restored)
            if self.moved_from is not None:
                rank_zero_info(
                    f"PrivacyAccountantCallback: the run's release journal moved from "
                    f"{self.moved_from!r} to {restored['path']!r}: it is the checkpoint's (id, "
                    f"{len(outcome[1])} releases beginning with its own) and continues there"
                )
        if trainer.is_global_zero:
            if restored is None:  # a new run, or a checkpoint naming no journal
                name = f"privacy_journal-{uuid.uuid4().hex[:12]}.jsonl"
                self.journal = ReleaseJournal(log_dir / name)
                self.journal.acquire()
                self.journal.start([(0, event) for event in composition.events()])
            assert self.journal is not None
            for index, release in enumerate(module.privacy_releases()):
                release.events.journal = self.journal.writer(index)
        self.ready = True

    def prepend(self, entries: list[tuple[int, PrivacyEvent]]) -> None:
        """Put releases made before the journal existed (declared on resume) at its head."""
        if self.journal is not None and entries:
            self.journal.start(entries + self.journal.read())

    def commit(self) -> None:
        """Make the releases journaled so far durable (one ``fsync`` for the group)."""
        if self.journal is not None:
            self.journal.commit()

    def close(self) -> None:
        """Commit and give up the journal: the run is over, another process may resume it."""
        if self.journal is not None:
            self.journal.release()

    def state(self) -> dict[str, Any] | None:
        """What a checkpoint stores: the journal's absolute path, id and position."""
        journal = self.journal
        if journal is None:
            return self.restored
        return {"path": str(journal.path), "id": journal.id, "position": journal.position}

    # -- the ledger -----------------------------------------------------------------------------

    def open_ledger_entry(
        self,
        trainer: L.Trainer,
        facts: dict[str, Any],
        planned: Callable[[], float],
        delta: float | None,
    ) -> None:
        """Enter the run in its data module's ledger before its first release, at ``planned()``
        (the most it may spend). A resume whose entry the ledger holds for the same records
        reopens it (an earlier settlement counted only the releases made before it)."""
        ledger = getattr(trainer.datamodule, "run_ledger", None)
        if not trainer.is_global_zero or not isinstance(ledger, RunLedger):
            return
        most, kept = planned(), self.ledger_entry
        if kept is not None and ledger.holds(kept[0]):
            most = max(most, kept[1])
            ledger.reopen(kept[0], most, delta)
            self.ledger_entry = (kept[0], most)
            return
        self.ledger_entry = (ledger.open(most, delta, facts), most)

    def settle_ledger_entry(
        self, trainer: L.Trainer, epsilon: float, delta: float | None, unaccounted: int
    ) -> None:
        """Settle the run's entry at ``epsilon`` (once) and keep the ledger's total for the
        report. With ``unaccounted`` releases (emitted but not composed) the entry is never
        settled: it keeps the ε it was opened at, which bounds what the run may spend."""
        if self.ledger_entry is None or self.ledger is not None or not trainer.is_global_zero:
            return
        ledger: RunLedger = trainer.datamodule.run_ledger
        if unaccounted:
            warnings.warn(
                f"PrivacyAccountantCallback: {unaccounted} release(s) were emitted but not "
                f"composed; the ledger entry stays at epsilon={self.ledger_entry[1]:.6g}, the "
                "most the run was planned to spend",
                UserWarning,
                stacklevel=3,
            )
        else:
            ledger.settle(self.ledger_entry[0], epsilon, delta)
        self.ledger = {
            "entry": self.ledger_entry[0],
            "all_releases_of_these_records": ledger.total().as_dict(),
            "composition": "basic (sum of epsilons and deltas), worst record",
            "keying": ledger.keying,
            "privacy_budget": ledger.settings.budget,
            "path": str(ledger.book.path),
        }


def checkpoint_journal(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    """The journal a checkpoint's accountant state names (``{"path", "id", "position"}``);
    ``None`` when it holds no accountant state or names no journal."""
    kept = [v for k, v in checkpoint.get("callbacks", {}).items() if "PrivacyAccountant" in k]
    return migrate_accountant_state(kept[0])["journal"] if kept else None


def _relocated(
    restored: dict[str, Any] | None, journal_path: str | Path | None
) -> tuple[dict[str, Any] | None, str | None]:
    """The checkpoint's journal state with the path ``journal_path`` gives it, and the path the
    checkpoint named if the journal moved (``None``: not moved). A journal moves only when the
    one the checkpoint names is gone: a copy of the run beside the original would compose the
    copy's releases alone. Links are resolved, so one file has one lock."""
    if journal_path is None:
        return restored, None
    if restored is None:
        raise ValueError(
            f"journal_path={str(journal_path)!r} names where the release journal of a resumed run "
            "lies now, but this run restores no checkpoint naming a journal: resume from the "
            "run's checkpoint (ckpt_path), or leave journal_path unset"
        )
    named, path = restored["path"], os.path.realpath(journal_path)
    if os.path.exists(named):
        if os.path.exists(path) and os.path.samefile(named, path):
            return restored, None
        raise ValueError(
            f"journal_path={str(journal_path)!r}: the journal the checkpoint names, {named!r}, "
            "still exists, and a run continues in one place: resume with it (journal_path "
            "unset), or move the run's folder instead of copying it"
        )
    return {**restored, "path": path}, named


def _check_present(path: Path, moved_from: str | None) -> None:
    if moved_from is not None and not path.is_file():
        raise FileNotFoundError(
            f"journal_path={str(path)!r} is missing: it must be the release journal the "
            f"checkpoint names ({moved_from!r}), moved with the checkpoint from the run's last "
            "process, which holds every release of the run"
        )
    if not path.is_file():
        raise FileNotFoundError(
            f"the checkpoint names the release journal {str(path)!r}, which is missing: it holds "
            "every release of the run, including those made after the checkpoint was written, "
            "whose outputs may have left the process. Put the journal back at that path to resume"
        )


def _adopt(
    entries: list[tuple[int, PrivacyEvent]],
    module: ReleasesPrivateData,
    composition: Composition,
    restored: dict[str, Any],
) -> None:
    """Compose the journal's releases in place of the checkpoint's, after checking that the
    checkpoint's releases are its beginning; the release objects take the journal's counts."""
    path, count = restored["path"], composition.releases
    position = restored.get("position") or 0
    if len(entries) < position:
        raise ValueError(
            f"the release journal {path!r} holds {len(entries)} releases but held {position} "
            "when the checkpoint was written: it was cut short, and the releases it lost would "
            "go unaccounted"
        )
    if len(entries) < count:
        raise ValueError(
            f"the release journal {path!r} holds {len(entries)} releases but the checkpoint "
            f"composed {count}: it is not this run's journal"
        )
    prefix = Composition(composition.accountant.name)
    prefix.add_all(event for _, event in entries[:count])
    if not prefix.same_as(composition):
        raise ValueError(
            f"the first {count} releases of the journal {path!r} differ from the checkpoint's: "
            "it is not this run's journal"
        )
    releases = module.privacy_releases()
    if any(not 0 <= index < len(releases) for index, _ in entries):
        raise ValueError(
            f"the release journal {path!r} names release objects that {type(module).__name__} "
            "does not have"
        )
    composition.add_all(event for _, event in entries[count:])
    for index, release in enumerate(releases):
        release.events.replace([event for i, event in entries if i == index])
    if len(entries) > count:
        rank_zero_info(
            f"PrivacyAccountantCallback: {len(entries) - count} release(s) made after the "
            f"checkpoint are composed from the run's journal ({len(entries)} in all)"
        )


def declare_earlier(
    trainer: L.Trainer, module: ReleasesPrivateData, policy: str
) -> list[tuple[int, PrivacyEvent]]:
    """The releases a run resumed without accountant state made before (``(release index,
    event)``), as each release object's restored events; ``[]`` for a fresh run.

    Raises:
        ValueError: with ``policy="refuse"`` when there are any, or when the checkpoint cannot
            say what they were.
    """
    releases = module.privacy_releases()
    made = [release.events.total - len(release.events.pending) for release in releases]
    if not any(made) and trainer.global_step == 0:
        return []
    name = type(module).__name__
    if policy == "refuse":
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
            f"{name} holds no release counts: the earlier releases cannot be known, so they "
            "cannot be declared either"
        )
    earlier = []
    for index, (release, count) in enumerate(zip(releases, made, strict=True)):
        events = release.events.events()[:count]
        if len(events) != count:
            raise ValueError(
                f"the checkpoint of {name} counts {count} earlier release(s) but stores the "
                f"noise and sampling of {len(events)}: they cannot be declared"
            )
        earlier += [(index, event) for event in events]
    rank_zero_info(
        f"PrivacyAccountantCallback: {len(earlier)} earlier release(s) of {name} composed with "
        "the noise multiplier and sample rate the checkpoint stores for each "
        "(earlier_releases='as_configured')"
    )
    return earlier


def logs_or_ends(trainer: L.Trainer, batch_idx: int) -> bool:
    """Whether the logger writes after this batch, or the epoch (samples, evaluations,
    checkpoints) or training ends."""
    return bool(
        trainer._logger_connector.should_update_logs
        or trainer.should_stop
        or batch_idx + 1 >= trainer.num_training_batches
        or 0 < trainer.max_steps <= trainer.global_step
    )


def output_follows(trainer: L.Trainer, batch_idx: int) -> bool:
    """Whether something derived from the releases may leave the process after this batch:
    ``logs_or_ends``, or the progress bar prints (a method's logged loss)."""
    bar = trainer.progress_bar_callback
    refresh = int(getattr(bar, "refresh_rate", 1) or 0) if bar and bar.is_enabled else 0
    return logs_or_ends(trainer, batch_idx) or bool(refresh and (batch_idx + 1) % refresh == 0)


def commit_releases(trainer: L.Trainer) -> None:
    """Make every release journaled so far durable: a callback that writes something derived
    from the releases in the middle of an epoch (a file, a message) calls this first. The
    package's own callbacks write at the end of an epoch or of the run, where the accountant
    commits anyway."""
    for callback in trainer.callbacks:
        record = getattr(callback, "record", None)
        if isinstance(record, RunRecord):
            record.commit()


def same_events(emitted: Sequence[PrivacyEvent], announced: Sequence[PrivacyEvent]) -> bool:
    """Whether a batch emitted exactly the events its look-ahead announced (in any order)."""
    return tuple(emitted) == tuple(announced) or Counter(emitted) == Counter(announced)


def forgotten_release(
    module: str, emitted: Sequence[PrivacyEvent], announced: Sequence[PrivacyEvent]
) -> str:
    """The one line for a training batch that did not emit the events it announced."""
    return (
        f"{module} emitted {len(emitted)} privacy event(s) {list(emitted)} in a training batch "
        f"whose look-ahead announced {len(announced)} {list(announced)}: a step that consumes a "
        "private batch must call its release object and emit what next_step_events() declares"
    )
