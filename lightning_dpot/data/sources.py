"""Data sources: raw datasets together with the public facts that privacy depends on.

A :class:`DataSource` loads raw records and **declares** their value bounds ``[low, high]``
(and, where the support is known, a tighter public diameter). Sensitivities are derived from
these declarations only, never from the records themselves (SPEC §3).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class DataSplits:
    """Raw records of one dataset, ``(n, *sample_shape)`` float32, with optional int64 labels."""

    train: Tensor
    train_labels: Tensor | None = None
    test: Tensor | None = None
    test_labels: Tensor | None = None


class DataSource(ABC):
    """A dataset with publicly declared bounds.

    Subclasses set ``low``, ``high`` and ``sample_shape`` and implement :meth:`load`.
    ``num_classes`` is ``None`` for unlabelled data.
    """

    low: float = -1.0
    high: float = 1.0
    sample_shape: tuple[int, ...] = ()
    num_classes: int | None = None

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
        """Name and parameters identifying this source, stored in release metadata."""
        params = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        return {"source": type(self).__name__, **_jsonable(params)}


def _jsonable(params: dict) -> dict:
    out = {}
    for key, value in params.items():
        if isinstance(value, (str, int, float, bool)) or value is None:
            out[key] = value
        elif isinstance(value, (tuple, list)):
            out[key] = list(value)
        else:
            out[key] = str(value)
    return out


def seeded_split(n: int, test_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Indices of a seeded random train/test split of ``range(n)``."""
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie in [0, 1), got {test_fraction!r}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test = int(round(n * test_fraction))
    return perm[n_test:], perm[:n_test]
