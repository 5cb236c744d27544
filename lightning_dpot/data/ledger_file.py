"""The privacy ledger's directory and file (``PrivacyLedger``): entries appended under a
file lock, totals and checks read from them. What it records and why:
``lightning_dpot.data.ledger``."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import Tensor

from lightning_dpot.checks import check_epsilon, check_nonnegative
from lightning_dpot.data.ledger_keys import RecordKeys, key_files, keyed_record_keys
from lightning_dpot.data.ledger_public import (
    PublicReuse,
    PublicUse,
    check_public_reuse,
    disjoint_parts,
    reuse_error,
)
from lightning_dpot.data.release import secret_key
from lightning_dpot.data.sources import DataSplits
from lightning_dpot.locks import exclusive_lock

__all__ = [
    "BUDGET_REMEDY",
    "LEDGER_ENV",
    "LedgerTotal",
    "PrivacyBudgetError",
    "PrivacyLedger",
    "default_ledger_dir",
]

LEDGER_ENV = "DPOT_LEDGER_DIR"

BUDGET_REMEDY = "Raise ledger.budget, or set ledger.exceed_budget=True to spend it deliberately"


def default_ledger_dir() -> Path:
    """``$DPOT_LEDGER_DIR``, else ``~/.local/share/lightning_dpot/ledger``."""
    configured = os.environ.get(LEDGER_ENV)
    if configured:
        return Path(configured)
    return Path.home() / ".local" / "share" / "lightning_dpot" / "ledger"


class PrivacyBudgetError(ValueError):
    """A new release would take some record's total ε past the declared budget."""


@dataclass(frozen=True)
class LedgerTotal:
    """The worst record's releases and their composition, and how many of the records were
    used without noise (public uses: no ε bounds what they spent)."""

    releases: int
    epsilon: float
    delta: float
    used_without_noise: int = 0

    def as_dict(self) -> dict:
        """The total; ``records_used_without_noise`` only where some were."""
        total = {"releases": self.releases, "epsilon": self.epsilon, "delta": self.delta}
        if self.used_without_noise:
            total["records_used_without_noise"] = self.used_without_noise
        return total


def _is_public(entry: dict) -> bool:
    return entry.get("use") == "public"


def _check_ledger_delta(delta: float | None) -> float | None:
    """δ of a ledger entry: None (pure DP) or in [0, 1)."""
    if delta is None:
        return None
    if isinstance(delta, bool) or not (math.isfinite(float(delta)) and 0.0 <= delta < 1.0):
        raise ValueError(f"delta must be None or lie in [0, 1), got {delta!r}")
    return float(delta)


class PrivacyLedger:
    """The releases and public uses of each record, keyed by per-record keyed digests."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_ledger_dir()
        self.path = self.directory / "ledger.jsonl"

    # -- keys ------------------------------------------------------------------------------------
    def record_keys(
        self, records: Tensor, ids: Tensor | None = None, id_namespace: str | None = None
    ) -> RecordKeys:
        """Keys of the rows of ``records`` and, where given, of their identities ``ids``
        (int64, one per row) within ``id_namespace`` (``keyed_record_keys``)."""
        return keyed_record_keys(secret_key(self.directory), records, ids, id_namespace)

    def training_keys(self, splits: DataSplits, index: Tensor | None = None) -> RecordKeys:
        """Keys of the training records of ``splits`` (of those at ``index``, if given)."""
        records, ids = splits.train, splits.train_ids
        if index is not None:
            records, ids = records[index], None if ids is None else ids[index]
        if splits.generated_by is not None:  # keyed apart: equal bytes, other draw, no match
            key = hashlib.blake2b(
                b"generated\0" + splits.generated_by.encode(), key=secret_key(self.directory)
            ).digest()
            return keyed_record_keys(key, records, ids, splits.id_namespace)
        return self.record_keys(records, ids, splits.id_namespace)

    # -- reading ---------------------------------------------------------------------------------
    def _read(self) -> tuple[list[dict], dict[str, tuple[float, float | None]]]:
        """The entries (releases and public uses), and the last settled (ε, δ) of each settled
        entry."""
        if not self.path.is_file():
            return [], {}
        entries, settled = [], {}
        for line in self.path.read_text().splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            if "settles" in item:
                settled[item["settles"]] = (item["epsilon"], item["delta"])
            else:
                entries.append(item)
        return entries, settled

    def _seen(self, entry: dict, query: dict[str, np.ndarray]) -> np.ndarray:
        """Which of the queried records ``entry`` holds (by either key)."""
        seen = np.zeros(len(next(iter(query.values()))), dtype=bool)
        for keying, name in key_files(entry).items():
            if keying in query:
                seen |= np.isin(query[keying], np.load(self.directory / "records" / name))
        return seen

    def total(self, keys: RecordKeys, exclude: str | None = None) -> LedgerTotal:
        """The worst record's total over the releases recorded so far, each at its settled
        (ε, δ) where it has one, leaving out the entry ``exclude``; and how many of the records
        a public use holds."""
        if len(keys) == 0:
            return LedgerTotal(0, 0.0, 0.0)
        query = keys.by_keying()
        count = np.zeros(len(keys), dtype=np.int64)
        epsilon = np.zeros(len(keys))
        delta = np.zeros(len(keys))
        public = np.zeros(len(keys), dtype=bool)
        entries, settled = self._read()
        for entry in entries:
            if exclude is not None and entry.get("id") == exclude:
                continue
            seen = self._seen(entry, query)
            if _is_public(entry):
                public |= seen
                continue
            spent_epsilon, spent_delta = settled.get(
                entry.get("id", ""), (entry["epsilon"], entry["delta"])
            )
            count += seen
            epsilon += seen * spent_epsilon
            delta += seen * (spent_delta or 0.0)
        return LedgerTotal(
            int(count.max()), float(epsilon.max()), float(delta.max()), int(public.sum())
        )

    # -- public uses -----------------------------------------------------------------------------
    def check_reuse(
        self, keys: RecordKeys, partition: dict | None, public: bool, what: str
    ) -> None:
        """Raise ``PublicReuseError`` if a record of ``keys`` (lying at ``partition`` of
        its source) is held by an entry of the other kind: a private release where ``public``
        (the records are to be used without noise), else a public use. Entries of a part of the
        same source disjoint from ``partition`` are left out."""
        query, held, found = keys.by_keying(), np.zeros(len(keys), dtype=bool), []
        for entry in self._read()[0] if len(keys) else []:
            if _is_public(entry) == public or disjoint_parts(partition, entry.get("partition")):
                continue
            seen = self._seen(entry, query)
            if seen.any():
                held |= seen
                found.append(entry)
        if found:
            raise reuse_error(int(held.sum()), len(keys), found, what, public, self.path)

    def _check_uses(
        self, keys: RecordKeys | None, partition: dict | None, uses: Sequence[PublicUse],
        reuse: PublicReuse,
    ) -> None:  # fmt: skip
        if check_public_reuse(reuse) == "allow":
            return
        if keys is not None:
            self.check_reuse(keys, partition, public=False, what="this release")
        for use in uses:
            self.check_reuse(use.keys, use.part, public=True, what=use.which)

    def _append_uses(self, uses: Sequence[PublicUse], reuse: PublicReuse) -> None:
        """Append each use whose records are not all held as public already."""
        for use in uses:
            if self.total(use.keys).used_without_noise == len(use.keys):
                continue
            entry_id = uuid.uuid4().hex
            allowed = {"public_reuse": "allow"} if reuse == "allow" else {}
            self._append(
                {**use.facts(), **allowed, **self._entry_fields(entry_id, use.keys, None, None)}
            )

    def record_public(self, uses: Sequence[PublicUse], reuse: PublicReuse = "refuse") -> None:
        """Enter ``uses``, records handed to the process without noise, under the ledger lock:
        refused (``PublicReuseError``) if the ledger holds some of their records as
        privately released, unless ``reuse`` is ``"allow"``; a use whose records are all held
        as public already adds no line."""
        with self.locked():
            self._check_uses(None, None, uses, reuse)
            self._append_uses(uses, reuse)

    # -- writing ---------------------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive lock around a budget check and the append that follows it."""
        with exclusive_lock(self.directory / "ledger.lock"):
            yield

    def check_budget(
        self,
        keys: RecordKeys,
        epsilon: float,
        delta: float | None,
        budget: float | None,
        exceed: bool,
        remedy: str = BUDGET_REMEDY,
        exclude: str | None = None,
    ) -> LedgerTotal:
        """The worst record's total after a new (ε, δ) release of the records of ``keys`` (in
        place of the entry ``exclude``, if given); raises ``PrivacyBudgetError`` (ending
        with ``remedy``) if its ε passes ``budget`` and ``exceed`` is False."""
        before = self.total(keys, exclude)
        after = LedgerTotal(
            before.releases + 1, before.epsilon + epsilon, before.delta + (delta or 0.0)
        )
        if budget is not None and after.epsilon > budget and not exceed:
            raise PrivacyBudgetError(
                f"ledger.budget={budget!r}: some of these records were already released "
                f"{before.releases} time(s) for a total epsilon={before.epsilon:.6g} (ledger "
                f"{self.path}); a new release of epsilon={epsilon:.6g} would make it "
                f"{after.epsilon:.6g}. {remedy}"
            )
        return after

    def record(
        self,
        keys: RecordKeys,
        epsilon: float,
        delta: float | None,
        facts: dict,
        budget: float | None = None,
        exceed: bool = False,
        remedy: str = BUDGET_REMEDY,
        reuse: PublicReuse = "refuse",
        uses: Sequence[PublicUse] = (),
    ) -> str:
        """Check the budget (``check_budget``) and the public uses (``check_reuse``;
        ``facts["partition"]`` places the records in their source), then append the public
        ``uses`` that go with the release and one release of the records of ``keys`` at (ε, δ)
        with the JSON-serializable ``facts``, under the ledger lock and before the release's
        noise is drawn. Returns the entry's id (for ``settle``).

        Stored per record: the sorted unique keys, never the records."""
        epsilon, delta = check_epsilon("epsilon", epsilon), _check_ledger_delta(delta)
        try:
            json.dumps(facts)
        except TypeError as error:
            raise ValueError(f"facts must be JSON-serializable ({error})") from error
        with self.locked():
            self._check_uses(keys, facts.get("partition"), uses, reuse)
            self.check_budget(keys, epsilon, delta, budget, exceed, remedy)
            self._append_uses(uses, reuse)
            entry_id = uuid.uuid4().hex
            allowed = {"public_reuse": "allow"} if reuse == "allow" else {}
            self._append({**facts, **allowed, **self._entry_fields(entry_id, keys, epsilon, delta)})
        return entry_id

    def _entry_fields(
        self, entry_id: str, keys: RecordKeys, epsilon: float | None, delta: float | None
    ) -> dict:
        """Save the sorted unique keys of entry ``entry_id``; its fields naming them."""
        (self.directory / "records").mkdir(parents=True, exist_ok=True)
        files = {}
        for keying, values in keys.by_keying().items():
            files[keying] = f"{entry_id}-{keying}.npy"
            np.save(self.directory / "records" / files[keying], np.unique(values))
        return {
            "id": entry_id,
            "keys": files,
            "keying": keys.keying,
            "n": len(keys),
            "created": time.time(),
            "epsilon": epsilon,
            "delta": delta,
        }

    def settle(self, entry_id: str, epsilon: float, delta: float | None) -> None:
        """Append the (ε, δ) that entry ``entry_id`` actually spent (ε ≥ 0, δ ∈ [0, 1)); it
        replaces the entry's (ε, δ) in every total, the last settlement counting. No line is
        ever removed."""
        epsilon = check_nonnegative("epsilon", epsilon)
        delta = _check_ledger_delta(delta)
        with self.locked():
            self._entry(entry_id)
            self._append_settlement(entry_id, epsilon, delta)

    def reopen(
        self,
        entry_id: str,
        keys: RecordKeys,
        epsilon: float,
        delta: float | None,
        budget: float | None = None,
        exceed: bool = False,
        remedy: str = BUDGET_REMEDY,
        reuse: PublicReuse = "refuse",
        uses: Sequence[PublicUse] = (),
    ) -> None:
        """Set the entry ``entry_id`` of the records of ``keys`` (a run being resumed,
        ``holds``) back to the most it may spend, (ε, δ), after checking the budget as for
        a new release in its place (an earlier settlement counted only the releases made
        before it) and the public uses as ``record`` does, whose ``uses`` it enters."""
        epsilon, delta = check_epsilon("epsilon", epsilon), _check_ledger_delta(delta)
        with self.locked():
            entry = self._entry(entry_id)
            self._check_uses(keys, entry.get("partition"), uses, reuse)
            self.check_budget(keys, epsilon, delta, budget, exceed, remedy, exclude=entry_id)
            self._append_uses(uses, reuse)
            self._append_settlement(entry_id, epsilon, delta)

    def holds(self, entry_id: str, keys: RecordKeys) -> bool:
        """Whether ``entry_id`` is an entry of this ledger made for exactly the records of
        ``keys`` (a resume on other records, or on another ledger, must open its own)."""
        try:
            entry = self._entry(entry_id)
        except ValueError:
            return False
        files = key_files(entry)
        current = keys.by_keying()
        return files.keys() == current.keys() and all(
            np.array_equal(np.unique(current[k]), np.load(self.directory / "records" / name))
            for k, name in files.items()
        )

    def _entry(self, entry_id: str) -> dict:
        for entry in self._read()[0]:
            if entry.get("id") == entry_id and not _is_public(entry):
                return entry
        raise ValueError(f"entry_id={entry_id!r} is no entry of the ledger {self.path}")

    def _append_settlement(self, entry_id: str, epsilon: float, delta: float | None) -> None:
        self._append(
            {"settles": entry_id, "epsilon": epsilon, "delta": delta, "created": time.time()}
        )

    def _append(self, line: dict) -> None:
        """Append one line durably (``fsync``): an entry must survive a power loss once the
        run it opens has started releasing."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as fh:
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
