"""Public uses in the privacy ledger (``lightning_dpot.data.ledger``): records a data module
hands to the process without noise.

The public split of a DPSW data module (the autoencoder trains on it, Sebag et al. 2023) and,
in a fit, the held-out split (evaluation reads and plots it) are used raw: no ε bounds what
their people spend (ε = ∞, no guarantee). The ledger enters each such use as a line of its own
kind (``"use": "public"``, ``"epsilon": null``) that says which records and why. It is added to
no ε total; a total says how many of its records were used so
(``records_used_without_noise``).

A private run (a local-DP release, a central run's entry) on records the ledger holds as used
in public, and a public use of records it holds as privately released, are refused before
anything is released, unless the data module's ``ledger`` says ``public_reuse="allow"``. Parts
of one source that share no record by construction (its training and held-out splits, the two halves
of one public/private split) are never in conflict: identical records in both (duplicates share
keys) are not a reuse.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from torch import Tensor

from lightning_dpot.data.ledger_keys import RecordKeys
from lightning_dpot.data.release import config_key
from lightning_dpot.data.sources import DataSource

__all__ = [
    "PublicReuse",
    "PublicReuseError",
    "PublicUse",
    "check_public_reuse",
    "disjoint_parts",
    "enter_evaluation_use",
    "held_out_use",
    "source_part",
    "split_part",
]

PublicReuse = Literal["refuse", "allow"]
NO_GUARANTEE = "none: used without noise (epsilon = infinity), added to no epsilon total"
HELD_OUT_WHY = "read and plotted without noise by evaluation"


class PublicReuseError(ValueError):
    """Records used without noise would be released privately, or the reverse."""


def check_public_reuse(value: str) -> PublicReuse:
    """``value`` if it is ``"refuse"`` or ``"allow"``."""
    if value not in ("refuse", "allow"):
        raise ValueError(f"ledger.public_reuse must be 'refuse' or 'allow', got {value!r}")
    return value  # type: ignore[return-value]


def source_part(source: DataSource, *part: str) -> dict:
    """Where records lie in ``source``: the hash of its description and the path of parts,
    ``"train"`` or ``"test"``, then within the training split a public/private split's
    settings and its ``"public"`` or ``"private"`` half."""
    return {"source": config_key(source.describe())[:16], "part": list(part)}


def split_part(source: DataSource, half: str, public_fraction: float, split_seed: int) -> dict:
    """The ``half`` (``"public"`` or ``"private"``) of a public/private split of the training
    records of ``source``."""
    split = f"public_fraction={float(public_fraction)}, split_seed={int(split_seed)}"
    return source_part(source, "train", split, half)


def disjoint_parts(a: dict | None, b: dict | None) -> bool:
    """Whether two parts of one source share no record by construction: their paths first
    differ at a choice of half (train or test, public or private), not at a split's settings."""
    if not a or not b or a.get("source") != b.get("source"):
        return False
    for level, (x, y) in enumerate(zip(a["part"], b["part"], strict=False)):
        if x != y:
            return level % 2 == 0
    return False


@dataclass(frozen=True)
class PublicUse:
    """Records handed to the process without noise: which, why, by which data module, and
    where they lie in their source (``source_part``)."""

    keys: RecordKeys
    which: str
    why: str
    data_module: str
    part: dict | None = None

    def facts(self) -> dict:
        """The JSON facts of the use's ledger line."""
        return {
            "use": "public",
            "guarantee": NO_GUARANTEE,
            "which_records": self.which,
            "why": self.why,
            "data_module": self.data_module,
            "partition": self.part,
        }


def held_out_use(
    record_keys: Callable[[Tensor], RecordKeys],
    source: DataSource,
    records: Tensor | None,
    data_module: str,
) -> PublicUse | None:
    """The public use of the held-out split ``records`` of ``source`` (None without one, or
    for a generated source: ``generated``),
    keyed by ``record_keys`` (the ledger's ``record_keys``)."""
    if records is None or len(records) == 0 or getattr(source, "generated", False):
        return None
    which = f"the held-out split of {type(source).__name__}"
    return PublicUse(
        record_keys(records), which, HELD_OUT_WHY, data_module, source_part(source, "test")
    )


def _describe(entry: dict) -> str:
    name = f"entry {str(entry.get('id', '?'))[:8]}"
    if entry.get("use") == "public":
        return f"{name}: {entry['which_records']} ({entry['n']} records), {entry['why']}"
    return f"{name}: a {entry.get('notion', 'private')} release at epsilon={entry['epsilon']:.6g}"


def reuse_error(
    count: int, total: int, entries: list[dict], what: str, public: bool, path: Path
) -> PublicReuseError:
    """The one-line refusal of a public use of ``count`` of ``total`` records held as
    privately released by ``entries`` (``public``), or of a private release of records they
    hold as used in public."""
    listed = "; ".join(_describe(entry) for entry in entries[:2])
    if len(entries) > 2:
        listed += f"; {len(entries) - 2} more"
    if public:
        return PublicReuseError(
            f"ledger.public_reuse='refuse': {count} of the {total} records of {what} were "
            f"released privately before ({listed}; ledger {path}); using them without noise "
            "voids that guarantee. Use records never released privately, or set "
            "ledger.public_reuse='allow' on the data module to use them anyway"
        )
    return PublicReuseError(
        f"ledger.public_reuse='refuse': {count} of the {total} records of {what} were used "
        f"without noise before ({listed}; ledger {path}), so no epsilon bounds what they have "
        "spent. Release only records never used in public, or set ledger.public_reuse='allow' "
        "on the data module to release them anyway"
    )


RAW_TRAIN_WHY = "read without noise by `dpot evaluate --samples raw-train` (a reference row)"


def enter_evaluation_use(datamodule: object, records: Tensor, which: str) -> None:
    """Enter the records ``dpot evaluate`` reads without noise as a public use of the
    datamodule's ledger: ``which`` is ``"test"`` (its held-out split) or ``"train"`` (its raw
    training split, a reference row). Refused (``PublicReuseError``) where the ledger holds
    them as privately released, unless the datamodule's ``ledger`` says
    ``public_reuse="allow"``. A datamodule without a ledger or a source (one read from a
    release file) enters nothing."""
    ledger, source = getattr(datamodule, "ledger", None), getattr(datamodule, "source", None)
    if ledger is None or source is None or len(records) == 0 or getattr(source, "generated", False):
        return
    name = type(datamodule).__name__
    if which == "test":
        use = held_out_use(ledger.record_keys, source, records, name)
    else:
        splits = source.load()
        use = PublicUse(
            ledger.training_keys(splits), f"the training split of {type(source).__name__}",
            RAW_TRAIN_WHY, name, source_part(source, "train"),
        )  # fmt: skip
    if use is not None:
        settings = getattr(datamodule, "ledger_settings", None)
        ledger.record_public([use], "refuse" if settings is None else settings.public_reuse)
