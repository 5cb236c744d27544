"""The privacy ledger: every release ever made from the same people's records, and the total
each record has spent.

"Privatize once" holds per configuration and cache: a new ε, transform, radius, image size or
``cache_dir`` draws fresh noise on the same raw records, and so can a new split of them (another
split seed or test fraction keeps most records), and a central-DP run releases them again
through its sanitized gradients. Each release's report states only its own ε. The ledger closes
that gap. It lives in one directory per user (``DPOT_LEDGER_DIR``, default
``~/.local/share/lightning_dpot/ledger``), outside any cache, and holds

* ``digest.key``: a secret key (32 random bytes, mode 0600);
* ``ledger.jsonl``, append-only: one line per release, appended *before* its first noise is
  drawn, with the ε it may spend at most; a central run later appends a *settlement* line with
  the (ε, δ) it actually spent, which replaces the entry's in every total. A crash before the
  settlement leaves the opening ε counted: the ledger can over-count, never under-count;
* ``records/<entry>-<keying>.npy``: the release's per-record keys, sorted uint64.

Keys. Each record has up to two keys, keyed digests (BLAKE2b-64 under the secret key; without
the key they say nothing about the records):

* ``id``, of ``(id_namespace, train_ids)`` where the source declares record identities
  (:class:`~lightning_dpot.data.sources.DataSplits`): the built-in image sources digest each
  record's raw stored form (IDX pixels, image file bytes), so image size, padding, cropping,
  scaling, split, order, subset, file location and cache directory leave it unchanged;
* ``bytes``, of the record's float32 bytes after the source's preprocessing, always.

A record is charged for every earlier release that holds one of its keys. What escapes: a
source that declares no identities (``TensorFile``, a user source) whose float32 records differ
from those of every earlier release (rescaled, shifted, re-quantized, padded or resized
copies), and a record whose raw stored form changed (an image re-encoded or exported to another
format: its digest changes).

The total of a record is the basic composition of the releases that contain it,
``(Σ ε_i, Σ δ_i)`` (sequential composition, Dwork & Roth 2014, Thm. 3.16); the ledger reports
the worst record's. A data module with ``privacy_budget`` refuses a new release that would take
any record past it, unless ``exceed_privacy_budget=True`` says so explicitly. Check and append
run under a file lock, so two processes cannot both pass the budget. Identical records share
keys and are counted as one person (an over-count, never an under-count).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lightning_dpot.checks import check_epsilon, check_nonnegative
from lightning_dpot.data.release import exclusive_lock, secret_key
from lightning_dpot.data.sources import DataSplits

__all__ = [
    "LEDGER_ENV",
    "CentralRunLedger",
    "LedgerTotal",
    "PrivacyBudgetError",
    "PrivacyLedger",
    "RecordKeys",
    "default_ledger_dir",
]

LEDGER_ENV = "DPOT_LEDGER_DIR"

BUDGET_REMEDY = "Raise privacy_budget, or set exceed_privacy_budget=True to spend it deliberately"


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
    """The worst record's releases and their composition."""

    releases: int
    epsilon: float
    delta: float

    def as_dict(self) -> dict:
        return {"releases": self.releases, "epsilon": self.epsilon, "delta": self.delta}


@dataclass(frozen=True)
class RecordKeys:
    """Ledger keys of a set of records, uint64 and aligned with the records: ``content`` (of
    their float32 bytes) always, ``ids`` (of their declared identities) where the source
    declares them."""

    content: np.ndarray
    ids: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.content)

    def by_keying(self) -> dict[str, np.ndarray]:
        if self.ids is None:
            return {"bytes": self.content}
        return {"id": self.ids, "bytes": self.content}

    @property
    def keying(self) -> str:
        """How the ledger recognises these records in other releases."""
        if self.ids is None:
            return "record bytes after preprocessing (the source declares no record ids)"
        return "record ids declared by the source, and record bytes after preprocessing"


def _key_files(entry: dict) -> dict[str, str]:
    """The key files of a ledger entry by keying; an entry written before record ids existed
    names one file of byte keys."""
    return entry.get("keys") or {"bytes": entry["records"]}


def _blake64(digest: hashlib.blake2b) -> int:
    return int.from_bytes(digest.digest(), "big")


def _check_ledger_delta(delta: float | None) -> float | None:
    """δ of a ledger entry: None (pure DP) or in [0, 1)."""
    if delta is None:
        return None
    if isinstance(delta, bool) or not (math.isfinite(float(delta)) and 0.0 <= delta < 1.0):
        raise ValueError(f"delta must be None or lie in [0, 1), got {delta!r}")
    return float(delta)


class PrivacyLedger:
    """The releases made from each record, keyed by per-record keyed digests."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_ledger_dir()
        self.path = self.directory / "ledger.jsonl"

    # -- keys ------------------------------------------------------------------------------------
    def record_keys(
        self, records: Tensor, ids: Tensor | None = None, id_namespace: str | None = None
    ) -> RecordKeys:
        """Keys of the rows of ``records`` and, where given, of their identities ``ids``
        (int64, one per row) within ``id_namespace``."""
        key = secret_key(self.directory)
        rows = records.detach().to("cpu").float().contiguous().numpy()
        rows = rows.reshape(rows.shape[0], -1)
        content = np.fromiter(
            (_blake64(hashlib.blake2b(row.tobytes(), key=key, digest_size=8)) for row in rows),
            dtype=np.uint64,
            count=rows.shape[0],
        )
        if ids is None:
            return RecordKeys(content)
        if not isinstance(id_namespace, str) or not id_namespace:
            raise ValueError(
                f"id_namespace must be a non-empty string naming what train_ids identify, got "
                f"{id_namespace!r}"
            )
        if ids.dtype != torch.int64 or tuple(ids.shape) != (rows.shape[0],):
            raise ValueError(
                f"train_ids must be an int64 tensor of shape ({rows.shape[0]},) (one per "
                f"record), got {ids.dtype} of shape {tuple(ids.shape)}"
            )
        prefix = hashlib.blake2b(id_namespace.encode() + b"\0", key=key, digest_size=8)

        def id_key(identity: int) -> int:
            digest = prefix.copy()
            digest.update(identity.to_bytes(8, "little", signed=True))
            return _blake64(digest)

        keyed = np.fromiter(map(id_key, ids.tolist()), dtype=np.uint64, count=len(ids))
        return RecordKeys(content, keyed)

    def training_keys(self, splits: DataSplits, index: Tensor | None = None) -> RecordKeys:
        """Keys of the training records of ``splits`` (of those at ``index``, if given)."""
        records, ids = splits.train, splits.train_ids
        if index is not None:
            records, ids = records[index], None if ids is None else ids[index]
        return self.record_keys(records, ids, splits.id_namespace)

    # -- reading ---------------------------------------------------------------------------------
    def _read(self) -> tuple[list[dict], dict[str, tuple[float, float | None]]]:
        """The release entries, and the last settled (ε, δ) of each settled entry."""
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

    def total(self, keys: RecordKeys, exclude: str | None = None) -> LedgerTotal:
        """The worst record's total over the releases recorded so far, each at its settled
        (ε, δ) where it has one, leaving out the entry ``exclude``."""
        if len(keys) == 0:
            return LedgerTotal(0, 0.0, 0.0)
        query = keys.by_keying()
        count = np.zeros(len(keys), dtype=np.int64)
        epsilon = np.zeros(len(keys))
        delta = np.zeros(len(keys))
        entries, settled = self._read()
        for entry in entries:
            if exclude is not None and entry.get("id") == exclude:
                continue
            files = _key_files(entry)
            seen = np.zeros(len(keys), dtype=bool)
            for keying, name in files.items():
                if keying in query:
                    seen |= np.isin(query[keying], np.load(self.directory / "records" / name))
            spent_epsilon, spent_delta = settled.get(
                entry.get("id", ""), (entry["epsilon"], entry["delta"])
            )
            count += seen
            epsilon += seen * spent_epsilon
            delta += seen * (spent_delta or 0.0)
        return LedgerTotal(int(count.max()), float(epsilon.max()), float(delta.max()))

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
        place of the entry ``exclude``, if given); raises :class:`PrivacyBudgetError` (ending
        with ``remedy``) if its ε passes ``budget`` and ``exceed`` is False."""
        before = self.total(keys, exclude)
        after = LedgerTotal(
            before.releases + 1, before.epsilon + epsilon, before.delta + (delta or 0.0)
        )
        if budget is not None and after.epsilon > budget and not exceed:
            raise PrivacyBudgetError(
                f"privacy_budget={budget!r}: some of these records were already released "
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
    ) -> str:
        """Check the budget (:meth:`check_budget`) and append one release of the records of
        ``keys`` at (ε, δ) with the JSON-serializable ``facts``, under the ledger lock and
        before the release's noise is drawn. Returns the entry's id (for :meth:`settle`).

        Stored per record: the sorted unique keys, never the records."""
        epsilon, delta = check_epsilon("epsilon", epsilon), _check_ledger_delta(delta)
        try:
            json.dumps(facts)
        except TypeError as error:
            raise ValueError(f"facts must be JSON-serializable ({error})") from error
        with self.locked():
            self.check_budget(keys, epsilon, delta, budget, exceed, remedy)
            entry_id = uuid.uuid4().hex
            (self.directory / "records").mkdir(parents=True, exist_ok=True)
            files = {}
            for keying, values in keys.by_keying().items():
                files[keying] = f"{entry_id}-{keying}.npy"
                np.save(self.directory / "records" / files[keying], np.unique(values))
            self._append(
                {
                    **facts,
                    "id": entry_id,
                    "keys": files,
                    "keying": keys.keying,
                    "n": len(keys),
                    "created": time.time(),
                    "epsilon": epsilon,
                    "delta": delta,
                }
            )
        return entry_id

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
    ) -> None:
        """Set the entry ``entry_id`` of the records of ``keys`` (a run being resumed,
        :meth:`holds`) back to the most it may spend, (ε, δ), after checking the budget as for
        a new release in its place (an earlier settlement counted only the releases made
        before it)."""
        epsilon, delta = check_epsilon("epsilon", epsilon), _check_ledger_delta(delta)
        with self.locked():
            self._entry(entry_id)
            self.check_budget(keys, epsilon, delta, budget, exceed, remedy, exclude=entry_id)
            self._append_settlement(entry_id, epsilon, delta)

    def holds(self, entry_id: str, keys: RecordKeys) -> bool:
        """Whether ``entry_id`` is an entry of this ledger made for exactly the records of
        ``keys`` (a resume on other records, or on another ledger, must open its own)."""
        try:
            entry = self._entry(entry_id)
        except ValueError:
            return False
        files = _key_files(entry)
        current = keys.by_keying()
        return files.keys() == current.keys() and all(
            np.array_equal(np.unique(current[k]), np.load(self.directory / "records" / name))
            for k, name in files.items()
        )

    def _entry(self, entry_id: str) -> dict:
        for entry in self._read()[0]:
            if entry.get("id") == entry_id:
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


CENTRAL_REMEDY = (
    "Raise privacy_budget, lower the run's target epsilon, or set exceed_privacy_budget=True to "
    "spend it deliberately"
)


class CentralRunLedger:
    """The ledger of a data module whose private records a central-DP run releases: the privacy
    accountant opens an entry on global rank 0 before the run's first release, with the ε the
    run may spend at most, and settles it with what the run spent.

    The module calls :meth:`init_ledger` in its constructor and implements
    :meth:`private_record_keys`.
    """

    ledger: PrivacyLedger
    privacy_budget: float | None
    exceed_privacy_budget: bool

    def init_ledger(
        self, privacy_budget: float | None, exceed_privacy_budget: bool, ledger_dir: str | None
    ) -> None:
        self.ledger = PrivacyLedger(ledger_dir)
        self.privacy_budget = (
            None if privacy_budget is None else check_epsilon("privacy_budget", privacy_budget)
        )
        self.exceed_privacy_budget = bool(exceed_privacy_budget)
        self._private_keys: RecordKeys | None = None

    def private_record_keys(self) -> RecordKeys:
        """Ledger keys of the raw records this run's releases depend on."""
        raise NotImplementedError

    def _ledger_keys(self) -> RecordKeys:
        if self._private_keys is None:
            self._private_keys = self.private_record_keys()
        return self._private_keys

    @property
    def ledger_keying(self) -> str:
        """How the ledger recognises this run's private records in other releases."""
        return self._ledger_keys().keying

    def ledger_open(self, epsilon: float, delta: float | None, facts: dict) -> str:
        """Under the ledger lock, check ``privacy_budget`` for this run's private records and
        append an entry at (``epsilon``, ``delta``), the most the run may spend (its target or
        planned ε), with the JSON-serializable ``facts``. Call before the first release, on
        global rank 0 only. Returns the entry id for :meth:`ledger_settle`.

        Raises:
            PrivacyBudgetError: a record's total ε would pass ``privacy_budget`` and
                ``exceed_privacy_budget`` is False.
        """
        return self.ledger.record(
            self._ledger_keys(),
            epsilon,
            delta,
            {"notion": "central", "data_module": type(self).__name__, **facts},
            self.privacy_budget,
            self.exceed_privacy_budget,
            CENTRAL_REMEDY,
        )

    def ledger_holds(self, entry_id: str) -> bool:
        """Whether ``entry_id`` is this ledger's entry for exactly this run's private records
        (:meth:`PrivacyLedger.holds`)."""
        return self.ledger.holds(entry_id, self._ledger_keys())

    def ledger_reopen(self, entry_id: str, epsilon: float, delta: float | None) -> None:
        """Set a resumed run's entry back to the most it may spend, checking ``privacy_budget``
        as :meth:`ledger_open` does (:meth:`PrivacyLedger.reopen`).

        Raises:
            PrivacyBudgetError: as :meth:`ledger_open`.
        """
        self.ledger.reopen(
            entry_id,
            self._ledger_keys(),
            epsilon,
            delta,
            self.privacy_budget,
            self.exceed_privacy_budget,
            CENTRAL_REMEDY,
        )

    def ledger_settle(self, entry_id: str, epsilon: float, delta: float | None) -> None:
        """Record the (ε, δ) the run actually spent for the entry ``entry_id`` of
        :meth:`ledger_open` (:meth:`PrivacyLedger.settle`)."""
        self.ledger.settle(entry_id, epsilon, delta)

    def ledger_total(self) -> LedgerTotal:
        """The worst private record's total over every release so far, this run's included."""
        return self.ledger.total(self._ledger_keys())
