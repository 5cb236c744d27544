"""Data sources: raw datasets together with the public facts that privacy depends on.

A ``DataSource`` loads raw records and **declares** their value bounds ``[low, high]``
(and, where the support is known, a tighter public diameter). Sensitivities are derived from
these declarations only, never from the records themselves (see
docs/design.md#local-privatization).
"""

from __future__ import annotations

import hashlib
import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_dpot.checks import check_labels, check_records


@dataclass
class DataSplits:
    """Raw records of one dataset, ``(n, *sample_shape)`` float32, with optional int64 labels.

    ``train_ids`` (int64, one per training record) identify the training records as they are
    stored, before any preprocessing, within ``id_namespace`` (a name of the kind of record,
    without preprocessing parameters): the same raw record has the same ``(id_namespace, id)``
    whatever the split, order, subset, image size or scaling. The privacy ledger keys records by
    them (``lightning_dpot.data.ledger``). Sources that cannot say leave both ``None``.

    ``generated_by`` names the draw of a source that generates its points from a seed (its
    ``describe()``, ``generated_draw``): the ledger keys such points apart from every other
    source's and draw's, so a tutorial's points never share identities with a user's records
    (or another draw's) because their bytes happen to agree.
    """

    train: Tensor
    train_labels: Tensor | None = None
    test: Tensor | None = None
    test_labels: Tensor | None = None
    train_ids: Tensor | None = None
    id_namespace: str | None = None
    generated_by: str | None = None


class DataSource(ABC):
    """A dataset with publicly declared bounds.

    Subclasses set ``low``, ``high`` and ``sample_shape`` and implement ``load``.
    ``num_classes`` is ``None`` for unlabelled data.
    """

    low: float = -1.0
    high: float = 1.0
    sample_shape: tuple[int, ...] = ()
    num_classes: int | None = None
    #: Points a seeded generator draws (the 2-D manifolds, the Gaussian mixture): they belong to
    #: no person, so the privacy ledger enters no public use of them (independent draws share
    #: byte-identical float32 points by chance); their releases are still entered.
    generated: bool = False

    @property
    def dim(self) -> int:
        """Flattened dimension d of one record, f(x) = vec(x) ∈ R^d."""
        return math.prod(self.sample_shape)

    def diameter(self, p: float) -> float:
        """Public bound on ‖x − x'‖_p over the declared support.

        Default: the box ``[low, high]^d`` gives ``d^(1/p) · (high − low)``; sources whose
        support is known to be smaller (e.g. a manifold) override this with a tighter value.
        """
        return self.dim ** (1.0 / p) * (self.high - self.low)

    @abstractmethod
    def load(self) -> DataSplits:
        """Load the raw records (and a held-out test split where the dataset has one)."""

    def describe(self) -> dict:
        """Name and parameters identifying this source, stored in release metadata.

        Only the constructor's parameters (by name, in ``inspect.signature``) that the source
        keeps as attributes holding a JSON scalar (str, int, float, bool, None) are kept: any
        other attribute may be derived from the records (a maximum, a first record as text), and
        anything else (a tensor, a list of values) may hold them, while release metadata goes
        to an untrusted trainer. A source with a legitimate non-scalar parameter overrides this
        method to add it explicitly, in a form it controls."""
        names = inspect.signature(type(self).__init__).parameters
        params = {
            key: value
            for key, value in vars(self).items()
            if key in names and (value is None or type(value) in JSON_SCALARS)
        }
        return {"source": type(self).__name__, **params}


JSON_SCALARS = (str, int, float, bool)


def generated_draw(source: DataSource) -> str:
    """The name of a generated source's draw: its class and parameters (seed included)."""
    import json

    return json.dumps(source.describe(), sort_keys=True)


def digest_ids(items: Iterable[bytes]) -> Tensor:
    """int64 record identities: the first 8 bytes of each item's BLAKE2b digest, for the raw
    stored form of each record (its file's bytes, its pixels as stored). They stay in memory;
    the ledger keeps only keyed digests of them."""
    ids = [
        int.from_bytes(hashlib.blake2b(item, digest_size=8).digest(), "little", signed=True)
        for item in items
    ]
    return torch.tensor(ids, dtype=torch.int64)


def seeded_split(n: int, test_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Indices of a seeded random train/test split of ``range(n)``."""
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in [0, 1), got {test_fraction!r}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test = int(round(n * test_fraction))
    return perm[n_test:], perm[:n_test]


def check_source_splits(source: DataSource, splits: DataSplits) -> None:
    """Refuse records that are non-finite or outside the source's declared ``[low, high]``, and
    labels outside ``[0, num_classes)`` where the source declares classes, in both splits
    (``check_records``,
    ``check_labels``)."""
    name = type(source).__name__
    for split, records, labels in (
        ("training", splits.train, splits.train_labels),
        ("test", splits.test, splits.test_labels),
    ):
        if records is None:
            continue
        check_records(records, source.low, source.high, f"{name} {split} records")
        if labels is not None and source.num_classes is not None:
            check_labels(labels, source.num_classes, len(records), f"{name} {split} labels")
