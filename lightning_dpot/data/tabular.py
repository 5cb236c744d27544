"""Small real data bundled with scikit-learn, and user data from a tensor file."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path

import torch

from lightning_dpot.data.sources import DataSource, DataSplits, seeded_split


class Digits(DataSource):
    """scikit-learn's 8×8 handwritten digits (1,797 images, 10 classes), pixels 0…16 scaled to
    [−1, 1]; a seeded train/test split. ``train_ids`` are the rows of scikit-learn's bundle."""

    low, high = -1.0, 1.0
    sample_shape = (1, 8, 8)
    num_classes = 10

    def __init__(self, test_fraction: float = 0.2, split_seed: int = 0) -> None:
        self.test_fraction = test_fraction
        self.split_seed = split_seed

    def load(self) -> DataSplits:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = torch.as_tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 8.0 - 1.0
        y = torch.as_tensor(bunch.target, dtype=torch.int64)
        train, test = seeded_split(len(x), self.test_fraction, self.split_seed)
        return DataSplits(x[train], y[train], x[test], y[test], train, "sklearn-load-digits")


class TensorFile(DataSource):
    """User data saved with ``torch.save``: a tensor ``(n, *shape)`` or a dict with keys ``x``
    (and optionally ``y``, ``x_test``, ``y_test``).

    The value bounds ``low``/``high`` are public declarations the user must make; records outside
    them are refused at privatization (sensitivity would not hold). The records declare no
    identities: the privacy ledger keys them by their bytes, so a rescaled copy of the same
    records is not recognised (``lightning_dpot.data.ledger``).
    """

    def __init__(
        self,
        path: str,
        low: float,
        high: float,
        test_fraction: float = 0.0,
        split_seed: int = 0,
        num_classes: int | None = None,
    ) -> None:
        if not high > low:
            raise ValueError(f"high must be > low, got low={low!r}, high={high!r}")
        self.path = str(path)
        self.low, self.high = float(low), float(high)
        self.test_fraction = test_fraction
        self.split_seed = split_seed
        self.num_classes = num_classes
        self._shape: tuple[int, ...] | None = None

    @property
    def sample_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        if self._shape is None:
            self._shape = tuple(self._read()["x"].shape[1:])
        return self._shape

    def _read(self) -> dict:
        if not Path(self.path).is_file():
            raise FileNotFoundError(f"path={self.path!r}: no such tensor file")
        if Path(self.path).stat().st_size == 0:
            raise ValueError(f"path={self.path!r} is an empty file, not a torch.save tensor file")
        try:
            obj = torch.load(self.path, map_location="cpu", weights_only=True)
        except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
            raise ValueError(
                f"path={self.path!r} is not a torch.save tensor file ({error})"
            ) from error
        if isinstance(obj, torch.Tensor):
            obj = {"x": obj}
        if not isinstance(obj, dict) or "x" not in obj:
            raise ValueError(f"path={self.path!r} must hold a tensor or a dict with key 'x'")
        if obj["x"].ndim < 2 or obj["x"].shape[0] == 0:
            raise ValueError(f"path={self.path!r}: 'x' must have shape (n >= 1, *record_shape)")
        return obj

    def load(self) -> DataSplits:
        obj = self._read()
        x = obj["x"].float()
        y = obj.get("y")
        if "x_test" in obj:
            return DataSplits(x, y, obj["x_test"].float(), obj.get("y_test"))
        if self.test_fraction > 0:
            train, test = seeded_split(len(x), self.test_fraction, self.split_seed)
            return DataSplits(
                x[train], None if y is None else y[train], x[test], None if y is None else y[test]
            )
        return DataSplits(x, y)
