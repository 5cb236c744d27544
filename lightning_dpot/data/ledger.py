"""The privacy ledger: every local-DP release ever made from the same people's records, and
the total each record has spent.

"Privatize once" holds per configuration and cache: a new ε, transform, radius or ``cache_dir``
draws fresh noise on the same raw records, and so can a new split of them (another split seed
or test fraction keeps most records). Each release's report states only its own ε. The ledger
closes that gap. It lives in one directory per user (``DPOT_LEDGER_DIR``, default
``~/.local/share/lightning_dpot/ledger``), outside any cache, and holds

* ``digest.key``: a secret key (32 random bytes, mode 0600);
* ``ledger.jsonl``: one line per release, appended *before* its noise is drawn, so a crash can
  over-count but never under-count;
* ``records/<release>.npy``: the release's **per-record** keyed digests (BLAKE2b-64 under the
  key, of each record's float32 bytes). Without the key they say nothing about the records; with
  it, the same record has the same digest in every release, whatever the split, order, subset
  or cache directory.

The total of a record is the basic composition of the releases that contain it,
``(Σ ε_i, Σ δ_i)`` (sequential composition, Dwork & Roth 2014, Thm. 3.16); the ledger reports
the worst record's. A data module with ``privacy_budget`` refuses a new release that would take
any record past it, unless ``exceed_privacy_budget=True`` says so explicitly. Check and append
run under a file lock, so two processes cannot both pass the budget. Identical records share a
digest and are counted as one person (an over-count, never an under-count).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import Tensor

from lightning_dpot.data.release import secret_key

__all__ = ["LEDGER_ENV", "LedgerTotal", "PrivacyBudgetError", "PrivacyLedger", "default_ledger_dir"]

LEDGER_ENV = "DPOT_LEDGER_DIR"


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


class PrivacyLedger:
    """The releases made from each record, keyed by per-record keyed digests."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_ledger_dir()
        self.path = self.directory / "ledger.jsonl"

    def digests(self, records: Tensor) -> np.ndarray:
        """Sorted unique keyed digests (uint64) of the records (rows of ``records``)."""
        key = secret_key(self.directory)
        rows = records.detach().to("cpu").float().contiguous().numpy()
        rows = rows.reshape(rows.shape[0], -1)
        out = np.fromiter(
            (
                int.from_bytes(hashlib.blake2b(row.tobytes(), key=key, digest_size=8).digest())
                for row in rows
            ),
            dtype=np.uint64,
            count=rows.shape[0],
        )
        return np.unique(out)

    def _entries(self) -> list[dict]:
        if not self.path.is_file():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def total(self, digests: np.ndarray) -> LedgerTotal:
        """The worst record's total over the releases recorded so far."""
        count = np.zeros(len(digests), dtype=np.int64)
        epsilon = np.zeros(len(digests))
        delta = np.zeros(len(digests))
        for entry in self._entries():
            seen = np.isin(digests, np.load(self.directory / "records" / entry["records"]))
            count += seen
            epsilon += seen * entry["epsilon"]
            delta += seen * (entry["delta"] or 0.0)
        if len(digests) == 0:
            return LedgerTotal(0, 0.0, 0.0)
        return LedgerTotal(int(count.max()), float(epsilon.max()), float(delta.max()))

    @contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive lock around a budget check and the append that follows it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / "ledger.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def check_budget(
        self,
        digests: np.ndarray,
        epsilon: float,
        delta: float | None,
        budget: float | None,
        exceed: bool,
    ) -> LedgerTotal:
        """The worst record's total after a new (ε, δ) release of ``digests``; raises
        :class:`PrivacyBudgetError` if its ε passes ``budget`` and ``exceed`` is False."""
        before = self.total(digests)
        after = LedgerTotal(
            before.releases + 1, before.epsilon + epsilon, before.delta + (delta or 0.0)
        )
        if budget is not None and after.epsilon > budget and not exceed:
            raise PrivacyBudgetError(
                f"privacy_budget={budget!r}: some of these records were already released "
                f"{before.releases} time(s) for a total epsilon={before.epsilon:.6g} (ledger "
                f"{self.path}); a new release of epsilon={epsilon:.6g} would make it "
                f"{after.epsilon:.6g}. Reuse the cached release (same configuration and "
                "cache_dir), raise privacy_budget, or set exceed_privacy_budget=True to spend it "
                "deliberately"
            )
        return after

    def record(self, digests: np.ndarray, entry: dict) -> None:
        """Append one release (before its noise is drawn)."""
        name = f"{uuid.uuid4().hex}.npy"
        (self.directory / "records").mkdir(parents=True, exist_ok=True)
        np.save(self.directory / "records" / name, digests)
        line = json.dumps(
            {"records": name, "n": int(len(digests)), "created": time.time(), **entry}
        )
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as fh:
            fh.write(line + "\n")
