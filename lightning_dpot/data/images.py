"""Image datasets with declared pixel bounds [−1, 1] (Reshetova et al. 2024, §IV-B…IV-G;
Cao et al. 2021, §5; Sebag et al. 2023, §5).

Every source here scales 8-bit pixels v ∈ {0, …, 255} to x = v / 127.5 − 1 ∈ [−1, 1] and
declares ``low = −1``, ``high = 1``. With d = C·H·W pixels the declared box gives the sensitivities
(docs/design.md#local-privatization) without looking at any record:

    Δ1 = d · (high − low) = 2·d,    Δ2 = √d · (high − low) = 2·√d,

e.g. 28×28 MNIST: Δ1 = 1568, Δ2 = 56 (Reshetova et al. 2024, §IV-B). Zero-padding to a larger canvas
(Sebag et al. 2023 pad MNIST to 32×32) fills the border with the constant −1, identical in every
record, so the border adds nothing to ‖x − x'‖ and
``diameter`` keeps the 28×28 value (a public, tighter
bound; the box bound 2·32² would also be valid but loose).

Labels are carried along (int64 class indices) for conditional methods and utility metrics.

Record identities (``DataSplits.train_ids``, for the privacy ledger): a digest of each record's
raw stored form, the 28×28 uint8 pixels of an IDX file (``IDX_PIXELS``) or the bytes of an
image file (``IMAGE_FILES``). Padding, resizing, cropping, scaling, the split, ``limit`` and
the file's location change neither.

Sources:

- ``MNIST``, ``FashionMNIST``: through ``torchvision.datasets`` with a local ``root``
  (``download`` optional, never required), or straight from the official IDX ``.gz`` files in a
  folder (``idx_dir``), e.g. the shipped MNIST test split or the Debian package
  ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``). ``split="test-only"``
  loads only the ``t10k`` files and makes a seeded train/test split of them.
- ``CelebA`` and ``ImageFolder``, read from image files: ``lightning_dpot.data.image_files``.
"""

from __future__ import annotations

import gzip
import math
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_dpot.checks import check_nonnegative_int, check_positive_int
from lightning_dpot.data.sources import DataSource, DataSplits, digest_ids, seeded_split

SplitMode = Literal["official", "test-only"]

# Official IDX file names (LeCun et al.; Fashion-MNIST uses the same names and format).
IDX_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

# Namespaces of the record identities.
IDX_PIXELS = "idx-uint8-pixels"
IMAGE_FILES = "image-file-bytes"

_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


# -- pixel helpers -------------------------------------------------------------------------------
def scale_pixels(images: Tensor) -> Tensor:
    """8-bit pixels v ∈ {0, …, 255} → float32 x = v / 127.5 − 1 ∈ [−1, 1] (0 ↦ −1, 255 ↦ 1
    exactly)."""
    return images.to(torch.float32) / 127.5 - 1.0


def pad_to(images: Tensor, image_size: int, value: float = -1.0) -> Tensor:
    """Zero-pad (at ``value``, the declared lower bound, i.e. black) the last two axes of
    ``images`` symmetrically to ``image_size × image_size`` (an odd margin puts the extra pixel
    at the bottom/right)."""
    h, w = images.shape[-2:]
    if image_size < max(h, w):
        raise ValueError(f"image_size must be >= {max(h, w)} to pad, got {image_size!r}")
    top, left = (image_size - h) // 2, (image_size - w) // 2
    pad = (left, image_size - w - left, top, image_size - h - top)
    if not any(pad):
        return images
    return F.pad(images, pad, value=value)


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (the MNIST format: magic ``0 0 type ndim``, ``ndim`` big-endian int32
    sizes, then the data), gzip-compressed (``.gz``) or not."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4].hex()!r})")
    dtype, ndim = _IDX_DTYPES[raw[2]], raw[3]
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    offset = 4 + 4 * ndim
    count = math.prod(shape)
    if len(raw) - offset != count * dtype.itemsize:
        raise ValueError(
            f"{path}: header declares shape {shape} ({count * dtype.itemsize} bytes of data) "
            f"but the file holds {len(raw) - offset} bytes"
        )
    return np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(shape)


def find_idx_file(folder: Path, name: str) -> Path | None:
    """``folder/name`` or ``folder/name.gz``, whichever exists (uncompressed first)."""
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def check_test_size(test_size: int | float) -> int | float:
    if isinstance(test_size, bool) or not isinstance(test_size, (int, float)):
        raise ValueError(
            f"test_size must be a count (int >= 0) or a fraction in [0, 1), got {test_size!r}"
        )
    if isinstance(test_size, int):
        return check_nonnegative_int("test_size", test_size)
    if not (math.isfinite(test_size) and 0.0 <= test_size < 1.0):
        raise ValueError(f"test_size as a fraction must lie in [0, 1), got {test_size!r}")
    return float(test_size)


def split_indices(n: int, test_size: int | float, split_seed: int) -> tuple[Tensor, Tensor]:
    """Seeded, disjoint train/test indices of ``range(n)``; ``test_size`` is a count (int) or a
    fraction (float). Same permutation as ``seeded_split``."""
    test_size = check_test_size(test_size)
    n_test = test_size if isinstance(test_size, int) else int(round(n * test_size))
    if n_test >= n:
        raise ValueError(f"test_size must leave training records: got {test_size!r} of n={n}")
    return seeded_split(n, n_test / n, split_seed)


def file_ids(paths: list[str | Path]) -> Tensor:
    """Record identities of image files: digests of their bytes (``digest_ids``)."""
    return digest_ids(Path(path).read_bytes() for path in paths)


def check_limit(limit: int | None) -> int | None:
    return None if limit is None else check_positive_int("limit", limit)


def first_rows(x: Tensor | None, limit: int | None) -> Tensor | None:
    return x if x is None or limit is None else x[:limit]


# -- MNIST and Fashion-MNIST ---------------------------------------------------------------------
class _IDXImages(DataSource):
    """28×28 grayscale IDX datasets (MNIST, Fashion-MNIST): torchvision root or IDX folder."""

    low, high = -1.0, 1.0
    num_classes = 10
    _torchvision_name = ""
    _how_to_get = ""

    def __init__(
        self,
        root: str | Path | None = None,
        *,
        idx_dir: str | Path | None = None,
        download: bool = False,
        split: SplitMode = "official",
        test_size: int | float = 2000,
        split_seed: int = 0,
        image_size: int = 28,
        limit: int | None = None,
    ) -> None:
        name = type(self).__name__
        if (root is None) == (idx_dir is None):
            raise ValueError(
                f"{name}: give exactly one of root (a torchvision root holding "
                f"root/{self._torchvision_name}/raw) or idx_dir (a folder with the IDX files), "
                f"got root={root!r}, idx_dir={idx_dir!r}"
            )
        if download and root is None:
            raise ValueError(f"{name}: download=True needs root (torchvision downloads into it)")
        if split not in ("official", "test-only"):
            raise ValueError(f"split must be 'official' or 'test-only', got {split!r}")
        if isinstance(image_size, bool) or int(image_size) != image_size or image_size < 28:
            raise ValueError(f"image_size must be an integer >= 28 (pad only), got {image_size!r}")
        self.root = None if root is None else str(root)
        self.idx_dir = None if idx_dir is None else str(idx_dir)
        self.split = split
        self.test_size = check_test_size(test_size)
        self.split_seed = int(split_seed)
        self.image_size = int(image_size)
        self.limit = check_limit(limit)
        self._download = bool(download)

    @property
    def sample_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return (1, self.image_size, self.image_size)

    def diameter(self, p: float) -> float:
        """‖x − x'‖_p ≤ (28·28)^(1/p)·(high − low): the −1 border added by padding is the same
        in every record, so only the 28×28 content counts."""
        return (28 * 28) ** (1.0 / p) * (self.high - self.low)

    # -- reading ------------------------------------------------------------------------------
    def _read_split(self, which: str) -> tuple[Tensor, Tensor]:
        """Raw uint8 images (n, 28, 28) and int64 labels (n,) of the official ``which`` split."""
        if self.idx_dir is not None:
            return self._read_idx_dir(which)
        return self._read_torchvision(which)

    def _read_idx_dir(self, which: str) -> tuple[Tensor, Tensor]:
        folder = Path(self.idx_dir)  # type: ignore[arg-type]
        if not folder.is_dir():
            raise FileNotFoundError(
                f"idx_dir={self.idx_dir!r} is not a directory. {self._how_to_get}"
            )
        paths = [find_idx_file(folder, name) for name in IDX_FILES[which]]
        if any(p is None for p in paths):
            missing = [n for n, p in zip(IDX_FILES[which], paths, strict=True) if p is None]
            hint = (
                " A folder with only the t10k files (like shared/data/mnist-test) needs "
                "split='test-only'."
                if which == "train"
                else ""
            )
            raise FileNotFoundError(
                f"idx_dir={self.idx_dir!r} lacks {', '.join(missing)} (or the .gz).{hint} "
                f"{self._how_to_get}"
            )
        images, labels = (read_idx(p) for p in paths)  # type: ignore[arg-type]
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise ValueError(
                f"idx_dir={self.idx_dir!r}: expected images (n, H, W) and labels (n,), "
                f"got {images.shape} and {labels.shape}"
            )
        return torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64))

    def _read_torchvision(self, which: str) -> tuple[Tensor, Tensor]:
        """Through ``torchvision.datasets``; where torchvision refuses a partial root (it wants
        all four files even for one split), the needed files are read from its raw folder."""
        import torchvision.datasets as tvd

        root = Path(self.root)  # type: ignore[arg-type]
        if not self._download and not root.is_dir():
            raise FileNotFoundError(
                f"root={self.root!r} is not a directory (download=False). {self._how_to_get}"
            )
        dataset_cls = getattr(tvd, self._torchvision_name)
        try:
            ds = dataset_cls(str(root), train=which == "train", download=self._download)
        except RuntimeError as err:
            raw = root / self._torchvision_name / "raw"
            paths = [find_idx_file(raw, name) for name in IDX_FILES[which]]
            if all(p is not None for p in paths):
                images, labels = (read_idx(p) for p in paths)  # type: ignore[arg-type]
                return torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64))
            raise FileNotFoundError(
                f"{self._torchvision_name} files not found under root={self.root!r}: expected "
                f"the IDX files {', '.join(IDX_FILES[which])} in {raw} ({err}). Pass "
                f"download=True to fetch them, place the official files there, or read the .gz "
                f"files from any folder with idx_dir=. {self._how_to_get}"
            ) from err
        return ds.data.clone(), ds.targets.to(torch.int64).clone()

    def _finish(self, images: Tensor) -> Tensor:
        return pad_to(scale_pixels(images).unsqueeze(1), self.image_size)

    def load(self) -> DataSplits:
        """``split="official"``: the official train and test files. ``split="test-only"``: only
        the ``t10k`` files, split with ``split_indices`` (``test_size``, ``split_seed``).
        ``limit`` keeps the first ``limit`` records of each split (after the seeded split).
        ``train_ids`` digest each training image's raw pixels (``IDX_PIXELS``)."""
        if self.split == "official":
            x_train, y_train = self._read_split("train")
            x_test, y_test = self._read_split("test")
        else:
            x, y = self._read_split("test")
            train, test = split_indices(len(x), self.test_size, self.split_seed)
            x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
        x_train, y_train = first_rows(x_train, self.limit), first_rows(y_train, self.limit)
        x_test, y_test = first_rows(x_test, self.limit), first_rows(y_test, self.limit)
        ids = digest_ids(image.tobytes() for image in x_train.contiguous().numpy())
        if len(x_test) == 0:
            return DataSplits(self._finish(x_train), y_train, None, None, ids, IDX_PIXELS)
        return DataSplits(
            self._finish(x_train), y_train, self._finish(x_test), y_test, ids, IDX_PIXELS
        )


class MNIST(_IDXImages):
    """MNIST handwritten digits (LeCun, Cortes; CC BY-SA 3.0), 28×28, 10 classes, pixels in
    [−1, 1] (Reshetova et al. 2024, §IV-B: Δ1 = 2·28² = 1568, Δ2 = 56).

    Args:
        root: torchvision root; files in ``root/MNIST/raw`` (uncompressed IDX).
        idx_dir: alternatively, a folder with the IDX files (``.gz`` or not), e.g. the shipped
            ``shared/data/mnist-test`` (test split only: use ``split="test-only"``).
        download: let torchvision download into ``root`` (never required).
        split: ``"official"`` (60,000 / 10,000) or ``"test-only"`` (the 10,000 test images,
            split with ``test_size`` / ``split_seed``, e.g. 8,000 / 2,000).
        test_size: held-out count (int) or fraction (float in [0, 1)) for ``"test-only"``.
        split_seed: seed of the ``"test-only"`` split.
        image_size: pad the 28×28 images at value −1 to this size (e.g. 32, Sebag et al. 2023, §5).
        limit: keep the first ``limit`` records of each split (tiny runs).
    """

    _torchvision_name = "MNIST"
    _how_to_get = (
        "The official MNIST test split ships in shared/data/mnist-test (idx_dir=..., "
        "split='test-only'); torchvision can download the full set with download=True."
    )


class FashionMNIST(_IDXImages):
    """Fashion-MNIST clothing images (Xiao et al. 2017; MIT), 28×28, 10 classes, pixels in
    [−1, 1] (Reshetova et al. 2024, §IV-F, IV-G).

    Same arguments as ``MNIST``; torchvision reads ``root/FashionMNIST/raw``. The Debian
    package ``dataset-fashion-mnist`` installs the four official ``.gz`` files in
    ``DEBIAN_IDX_DIR``, readable directly with ``idx_dir=FashionMNIST.DEBIAN_IDX_DIR``.
    """

    DEBIAN_IDX_DIR = "/usr/share/datasets/fashion-mnist"
    _torchvision_name = "FashionMNIST"
    _how_to_get = (
        "Install the files with `apt-get install -y dataset-fashion-mnist` and pass "
        f"idx_dir='{DEBIAN_IDX_DIR}', or let torchvision download them with download=True."
    )
