"""The privacy ledger: every release ever made from the same people's records, every use of
them without noise, and the total each record has spent.

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
  settlement leaves the opening ε counted: the ledger can over-count, never under-count. A
  *public use* line (``"use": "public"``, ``"epsilon": null``: no guarantee) enters records a
  data module hands to the process without noise, saying which and why
  (``lightning_dpot.data.ledger_public``);
* ``records/<entry>-<keying>.npy``: the entry's per-record keys, sorted uint64.

Keys. Each record has up to two keys, keyed digests (BLAKE2b-64 under the secret key; without
the key they say nothing about the records):

* ``id``, of ``(id_namespace, train_ids)`` where the source declares record identities
  (``DataSplits``): the built-in image sources digest each
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
the worst record's. A data module whose ``ledger`` (``LedgerSettings``) sets a ``budget``
refuses a new release that would take any record past it, unless ``exceed_budget=True`` says
so explicitly. Check and append
run under a file lock, so two processes cannot both pass the budget. Identical records share
keys and are counted as one person (an over-count, never an under-count).

Public uses add to no ε total; a total says how many of its records were used so. A private
release of records used without noise, or a use without noise of privately released records,
is refused before anything is released unless the data module's ``ledger`` says
``public_reuse="allow"``.
Lines written before public uses existed read as releases, as they were written.

The file itself is ``PrivacyLedger``, the record keys
``lightning_dpot.data.ledger_keys``; this module adds the account a central-DP data module owns
(``RunLedger``).
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor

from lightning_dpot.data.ledger_file import (
    BUDGET_REMEDY,
    LEDGER_ENV,
    LedgerTotal,
    PrivacyBudgetError,
    PrivacyLedger,
    default_ledger_dir,
)
from lightning_dpot.data.ledger_keys import RecordKeys
from lightning_dpot.data.ledger_public import PublicReuseError, PublicUse, held_out_use
from lightning_dpot.data.ledger_settings import LedgerSettings
from lightning_dpot.data.sources import DataSource

__all__ = [
    "BUDGET_REMEDY",
    "LEDGER_ENV",
    "CentralPrivateRecords",
    "LedgerSettings",
    "LedgerTotal",
    "PrivacyBudgetError",
    "PrivacyLedger",
    "PublicReuseError",
    "PublicUse",
    "RecordKeys",
    "RunLedger",
    "default_ledger_dir",
]


CENTRAL_REMEDY = (
    "Raise ledger.budget, lower the run's target epsilon, or set ledger.exceed_budget=True to "
    "spend it deliberately"
)


class CentralPrivateRecords(Protocol):
    """What a central-DP data module tells its ``RunLedger``: the raw source, the held-out
    records it has loaded (evaluation reads them raw), and which of the source's records the
    run's releases depend on."""

    source: DataSource
    test_records: Tensor | None

    def private_record_keys(self) -> RecordKeys:
        """Ledger keys of the raw records this run's releases depend on."""
        ...

    def private_record_part(self) -> dict:
        """Where those records lie in ``source`` (``source_part``)."""
        ...


class RunLedger:
    """A central-DP run's account in the privacy ledger, owned by its data module
    (``run_ledger``): the privacy accountant opens an entry on global rank 0 before the run's
    first release, with the ε the run may spend at most, and settles it with what the run
    spent. With the entry it enters the data module's held-out split as a public use.

    Args:
        settings: the data module's ``ledger`` argument (``LedgerSettings``; its defaults when
            ``None``).
        records: the data module (``CentralPrivateRecords``); its record keys are computed once,
            when first needed.
    """

    def __init__(self, settings: LedgerSettings | None, records: CentralPrivateRecords) -> None:
        self.settings = LedgerSettings.of(settings)
        self.book: PrivacyLedger = self.settings.open()
        self._records = records
        self._keys: RecordKeys | None = None

    def _held_out_uses(self) -> list[PublicUse]:
        records = self._records
        use = held_out_use(
            self.book.record_keys, records.source, records.test_records, type(records).__name__
        )
        return [] if use is None else [use]

    def _private_keys(self) -> RecordKeys:
        if self._keys is None:
            self._keys = self._records.private_record_keys()
        return self._keys

    @property
    def keying(self) -> str:
        """How the ledger recognises this run's private records in other releases."""
        return self._private_keys().keying

    def open(self, epsilon: float, delta: float | None, facts: dict) -> str:
        """Under the ledger lock, check the ``budget`` and ``public_reuse`` for this run's
        private records and its held-out split, enter the held-out split as a public use and
        append an entry at (``epsilon``, ``delta``), the most the run may spend (its target or
        planned ε), with the JSON-serializable ``facts``. Call before the first release, on
        global rank 0 only. Returns the entry id for ``settle``.

        Raises:
            PrivacyBudgetError: a record's total ε would pass ``ledger.budget`` and
                ``ledger.exceed_budget`` is False.
            PublicReuseError: ``public_reuse="refuse"`` and a private record was used without
                noise before, or a held-out record was released privately before.
        """
        return self.book.record(
            self._private_keys(),
            epsilon,
            delta,
            {
                "notion": "central",
                "data_module": type(self._records).__name__,
                "partition": self._records.private_record_part(),
                **facts,
            },
            self.settings.budget,
            self.settings.exceed_budget,
            CENTRAL_REMEDY,
            self.settings.public_reuse,
            self._held_out_uses(),
        )

    def holds(self, entry_id: str) -> bool:
        """Whether ``entry_id`` is this ledger's entry for exactly this run's private records
        (``PrivacyLedger.holds``)."""
        return self.book.holds(entry_id, self._private_keys())

    def reopen(self, entry_id: str, epsilon: float, delta: float | None) -> None:
        """Set a resumed run's entry back to the most it may spend, checking the ``budget``
        and ``public_reuse`` as ``open`` does (``PrivacyLedger.reopen``).

        Raises:
            PrivacyBudgetError, PublicReuseError: as ``open``.
        """
        self.book.reopen(
            entry_id,
            self._private_keys(),
            epsilon,
            delta,
            self.settings.budget,
            self.settings.exceed_budget,
            CENTRAL_REMEDY,
            self.settings.public_reuse,
            self._held_out_uses(),
        )

    def settle(self, entry_id: str, epsilon: float, delta: float | None) -> None:
        """Record the (ε, δ) the run actually spent for the entry ``entry_id`` of ``open``
        (``PrivacyLedger.settle``)."""
        self.book.settle(entry_id, epsilon, delta)

    def total(self) -> LedgerTotal:
        """The worst private record's total over every release so far, this run's included, and
        how many private records were used without noise."""
        return self.book.total(self._private_keys())
