"""``LedgerSettings``: the data modules' ``ledger`` argument, one group for where the privacy
ledger lives (``lightning_dpot.data.ledger``) and what a run may do with the records it
holds.

In a config::

    data:
      init_args:
        ledger: {budget: 8.0, public_reuse: allow}

and on the command line ``--data.ledger.budget 8``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from lightning_dpot.checks import check_epsilon
from lightning_dpot.data.ledger_file import PrivacyLedger
from lightning_dpot.data.ledger_public import PublicReuse, check_public_reuse

__all__ = ["LedgerSettings"]


@dataclass(frozen=True)
class LedgerSettings:
    """Where the privacy ledger lives and what a run may do with the records it holds.

    Args:
        dir: the ledger's directory (default ``$DPOT_LEDGER_DIR`` or
            ``~/.local/share/lightning_dpot/ledger``).
        budget: total ε the raw records may spend over every release ever made from them
            (basic composition, worst record); a release or run past it is refused before
            anything is released.
        exceed_budget: release anyway when the total passes ``budget`` (a deliberate spend,
            entered in the ledger as any other).
        public_reuse: ``"refuse"`` (default): a release is refused when the ledger holds one
            of its records as used without noise (a DPSW public split, a held-out split), and
            a use without noise when the ledger holds one of its records as privately
            released. ``"allow"`` goes on, and the ledger says so.

    Raises:
        ValueError: ``budget`` not a finite number > 0, ``public_reuse`` not ``"refuse"`` or
            ``"allow"``.

    Example::

        >>> from lightning_dpot.data import LedgerSettings
        >>> LedgerSettings(budget=8.0).budget
        8.0
        >>> LedgerSettings(public_reuse="sometimes")
        Traceback (most recent call last):
        ...
        ValueError: ledger.public_reuse must be 'refuse' or 'allow', got 'sometimes'
    """

    dir: str | None = None
    budget: float | None = None
    exceed_budget: bool = False
    public_reuse: PublicReuse = "refuse"

    def __post_init__(self) -> None:
        if isinstance(self.budget, bool):
            raise ValueError(f"ledger.budget must be a finite number > 0, got {self.budget!r}")
        if self.budget is not None:
            object.__setattr__(self, "budget", check_epsilon("ledger.budget", self.budget))
        if not isinstance(self.exceed_budget, bool):
            raise ValueError(
                f"ledger.exceed_budget must be true or false, got {self.exceed_budget!r}"
            )
        check_public_reuse(self.public_reuse)

    @classmethod
    def of(cls, value: LedgerSettings | Mapping[str, Any] | None) -> LedgerSettings:
        """A data module's ``ledger`` argument as settings: the defaults for ``None``, a mapping
        as the fields it names.

        Raises:
            ValueError: anything else, or a mapping with a key that is not a field.
        """
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {f.name for f in fields(cls)}
            if unknown:
                raise ValueError(
                    f"ledger: unknown key(s) {sorted(unknown)}; the fields are dir, budget, "
                    "exceed_budget, public_reuse"
                )
            return cls(**value)
        raise ValueError(
            f"ledger must be a LedgerSettings or a mapping of its fields, got {value!r}"
        )

    def open(self) -> PrivacyLedger:
        """The ledger in ``dir``."""
        return PrivacyLedger(self.dir)
