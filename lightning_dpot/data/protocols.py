"""What each kind of method needs from its datamodule, declared once (see docs/design.md).

Three ways of touching private data, one protocol each:

* ``LocalDPRelease`` — every record privatized **once** at setup by a local randomizer
  (Reshetova et al. 2024); training reads only the cached release and the mechanism's public
  facts.
  ``PrivatizedDataModule``.
* ``CentralPrivateData`` — raw private records, reached only through a subsampled
  mechanism of the method (Cao et al. 2021: Poisson rate q).
  ``CentralDPDataModule``.
* ``LatentPrivateData`` — private records encoded by a public autoencoder into the unit
  ball, reached only through the method's sliced release (Sebag et al. 2023).
  ``PrivateLatentDataModule``.

Each extends ``HeldOutData``: the raw held-out split, under one name for every datamodule
(``test_records`` with ``test_labels`` or ``None``), which only evaluation reads.
``PublicData`` is the public split an autoencoder is trained on (stage 1 of
Sebag et al. 2023).

``require_data`` checks a datamodule against a protocol by static lookup (properties that
need ``setup`` are not evaluated) and names every missing member.

A datamodule that releases calls ``check_before_release`` first: the module
(``ChecksDataBeforeRelease``) and the callbacks (``ChecksBeforeRelease``) refuse
then, not after the release, a run they cannot serve.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from torch import Tensor

from lightning_dpot.privacy.contract import refuse_tuners

__all__ = [
    "CentralPrivateData",
    "ChecksBeforeRelease",
    "ChecksDataBeforeRelease",
    "HeldOutData",
    "LatentPrivateData",
    "LocalDPRelease",
    "PublicData",
    "check_before_release",
    "held_out_split",
    "missing_members",
    "require_data",
    "satisfies",
]


class HeldOutData(Protocol):
    """The raw held-out split (never trained on, never privatized): evaluation only."""

    test_records: Tensor | None
    test_labels: Tensor | None


class LocalDPRelease(HeldOutData, Protocol):
    """A local-DP release drawn once at setup, and the public facts of its mechanism."""

    release: Tensor | None
    transform: Any
    randomizer: Any

    @property
    def sample_shape(self) -> tuple[int, ...]: ...

    @property
    def mechanism(self) -> Any: ...

    def support_diameter(self, p: int) -> float: ...

    def privacy_report(self) -> dict: ...

    def write_release(self, path: str | Path) -> Path: ...


class CentralPrivateData(HeldOutData, Protocol):
    """Raw private records behind Poisson subsampling (rate q) and declared value bounds.
    ``seed`` is the seed of the Poisson masks: ``None`` = secret (amplification by sampling
    holds), an integer = public (the masks are known, so no amplification is claimed)."""

    seed: int | None

    @property
    def sample_shape(self) -> tuple[int, ...]: ...

    @property
    def value_range(self) -> float: ...

    @property
    def num_classes(self) -> int | None: ...

    @property
    def num_private(self) -> int: ...

    @property
    def sample_rate(self) -> float: ...

    @property
    def expected_real_batch(self) -> float: ...

    @property
    def steps_per_epoch(self) -> int: ...


class LatentPrivateData(HeldOutData, Protocol):
    """Private latents in the unit ball, fixed-size batches drawn without replacement, and the
    public decoder."""

    autoencoder: Any
    batch_size: int | None
    sample_rate: float | None
    seed: int | None

    @property
    def latent_dim(self) -> int: ...

    @property
    def num_private(self) -> int: ...

    @property
    def steps_per_epoch(self) -> int: ...

    def private_records(self) -> Tensor: ...

    def without_replacement_indices(self, step: int) -> Tensor: ...

    def decode(self, z: Tensor) -> Tensor: ...

    def public_decoder(self) -> Callable[[Tensor], Tensor]:
        """The decoder alone (no private latent), for a module to keep."""
        ...


class PublicData(HeldOutData, Protocol):
    """The public split only (no private record is loaded)."""

    public_records: Tensor | None


P = TypeVar("P")


def _members(protocol: type) -> list[str]:
    names: set[str] = set()
    for klass in protocol.__mro__:
        if klass in (Protocol, object) or not getattr(klass, "_is_protocol", False):
            continue
        names.update(klass.__dict__.get("__annotations__", {}))
        names.update(
            name
            for name, value in klass.__dict__.items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))
        )
    return sorted(names)


def missing_members(datamodule: object, protocol: type) -> list[str]:
    """Members of ``protocol`` that ``datamodule`` lacks (static lookup: no property runs)."""
    sentinel = object()
    return [
        name
        for name in _members(protocol)
        if inspect.getattr_static(datamodule, name, sentinel) is sentinel
    ]


def satisfies(datamodule: object, protocol: type) -> bool:
    """Whether ``datamodule`` has every member of ``protocol``."""
    return datamodule is not None and not missing_members(datamodule, protocol)


def require_data(datamodule: P | None, protocol: type, who: str) -> P:
    """``datamodule``, after checking it implements ``protocol``; else a ``TypeError`` that
    names ``who`` needs it, the protocol and the missing members."""
    if datamodule is None:
        raise TypeError(f"{who} needs a datamodule implementing {protocol.__name__}, got None")
    missing = missing_members(datamodule, protocol)
    if missing:
        raise TypeError(
            f"{who} needs a datamodule implementing lightning_dpot.data.protocols."
            f"{protocol.__name__}; {type(datamodule).__name__} lacks {', '.join(missing)}"
        )
    return datamodule


def held_out_split(datamodule: object) -> tuple[Tensor, Tensor | None]:
    """The raw held-out split ``(x, labels or None)`` of a datamodule (evaluation only).

    Reads ``test_records`` / ``test_labels`` (``HeldOutData``); if they are not loaded yet,
    loads the datamodule's ``source`` (raw records, nothing is privatized).
    """
    require_data(datamodule, HeldOutData, "evaluation")
    if datamodule.test_records is not None:
        return datamodule.test_records, datamodule.test_labels
    source = getattr(datamodule, "source", None)
    if source is not None:
        splits = source.load()
        if splits.test is not None:
            return splits.test, splits.test_labels
    raise ValueError(
        f"{type(datamodule).__name__} has no raw held-out split (test_records is None and its "
        "source has no test split); evaluation compares generated samples with held-out raw "
        "data, so give the source a test split (e.g. test_size > 0)"
    )


@runtime_checkable
class ChecksBeforeRelease(Protocol):
    """A callback that refuses, before anything private is released, a run it cannot serve."""

    def check_before_release(self, trainer: Any, pl_module: Any) -> None: ...


@runtime_checkable
class ChecksDataBeforeRelease(Protocol):
    """A module that refuses, before anything private is released, a datamodule it cannot train
    on: the data protocol it needs, the record shape, the loss its data implies. It reads only
    what the datamodule states before its release (source, mechanism, declared shape), and its
    ``setup`` runs the same check."""

    def check_data(self, datamodule: Any) -> None: ...


def check_before_release(trainer: Any) -> None:
    """Refuse, before a datamodule releases anything, every run that would be refused later.

    In order: the module's ``ChecksDataBeforeRelease.check_data`` on the trainer's
    datamodule, Lightning's tuners (``refuse_tuners``),
    then every callback's ``ChecksBeforeRelease.check_before_release``.

    A datamodule that releases in ``prepare_data`` or ``setup`` calls this first: Lightning runs
    ``LightningModule.setup`` and every callback hook after ``prepare_data``, so their own checks
    would come after the release was drawn and charged to the ledger. ``trainer`` is ``None``
    outside a fit (``dpot privatize``): then there is nothing to check.
    """
    if trainer is None:
        return
    module, datamodule = trainer.lightning_module, trainer.datamodule
    if isinstance(module, ChecksDataBeforeRelease):
        module.check_data(datamodule)
    refuse_tuners(trainer, type(datamodule).__name__)
    for callback in trainer.callbacks:
        if isinstance(callback, ChecksBeforeRelease):
            callback.check_before_release(trainer, module)
