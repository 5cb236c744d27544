"""Image sources read from image files, with the pixel convention of
``lightning_dpot.data.images`` (8-bit pixels scaled to [−1, 1], declared bounds ``low = −1``,
``high = 1``; record identities from the files' bytes, ``IMAGE_FILES``):

- ``CelebA``: ``torchvision.datasets.CelebA`` from a local root, center crop and resize,
  an optional binary attribute (default ``Male``, the gender label of Cao et al. 2021, §5.3) as
  label.
- ``ImageFolder``: user images in ``root/<class>/<image>`` (labels from the folder names), or
  in ``root/<image>`` with or without a labels file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from lightning_dpot.checks import check_nonnegative_int, check_positive_int
from lightning_dpot.data.images import (
    IMAGE_FILES,
    check_limit,
    check_test_size,
    file_ids,
    first_rows,
    scale_pixels,
    split_indices,
)
from lightning_dpot.data.sources import DataSource, DataSplits


class _ImagesOnly(Dataset):
    """A view of an image dataset that yields only the transformed image (labels are read in
    bulk from the wrapped dataset instead)."""

    def __init__(self, dataset: Dataset, indices: Tensor) -> None:
        self.dataset = dataset
        self.indices = indices.tolist()

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> Tensor:
        return self.dataset[self.indices[i]][0]


def _load_images(dataset: Dataset, indices: Tensor, num_workers: int) -> Tensor:
    """uint8 images of ``dataset`` at ``indices``, stacked and scaled to [−1, 1]."""
    from torch.utils.data import DataLoader

    loader = DataLoader(_ImagesOnly(dataset, indices), batch_size=256, num_workers=num_workers)
    batches = [scale_pixels(batch) for batch in loader]
    if not batches:
        raise ValueError("no images to load (empty split)")
    return torch.cat(batches)


def _check_image_size(image_size: int) -> int:
    return check_positive_int("image_size", image_size)


class CelebA(DataSource):
    """CelebA aligned faces (Liu et al. 2015) through ``torchvision.datasets.CelebA``, RGB,
    center-cropped to ``crop_size`` and resized to ``image_size`` (64 by default;
    Cao et al. 2021, §5.3 use 32), pixels in [−1, 1]: Δ1 = 2·3·s², Δ2 = 2·√(3·s²).

    The official partitions are used: ``train`` (162,770 images) and ``test`` (19,962). Memory:
    3·s²·4 bytes per image, ≈ 49 KB at s = 64, ≈ 8 GB for the full train split; use ``limit``
    for small runs.

    Args:
        root: torchvision root: ``root/celeba/img_align_celeba/`` and the ``list_*.txt`` files.
        image_size: side s of the square output.
        crop_size: side of the center crop taken before resizing (178 = the image width).
        label_attribute: the binary attribute used as class label (0/1), e.g. ``"Male"``
            (Cao et al. 2021's gender-conditional CelebA); ``None`` for no labels.
        download: let torchvision download into ``root`` (never required; Google Drive quotas
            often refuse it).
        limit: keep the first ``limit`` images of each split.
        num_workers: DataLoader workers used to decode the images.
    """

    low, high = -1.0, 1.0

    def __init__(
        self,
        root: str | Path,
        image_size: int = 64,
        crop_size: int = 178,
        label_attribute: str | None = "Male",
        download: bool = False,
        limit: int | None = None,
        num_workers: int = 0,
    ) -> None:
        self.root = str(root)
        self.image_size = _check_image_size(image_size)
        self.crop_size = check_positive_int("crop_size", crop_size)
        self.label_attribute = label_attribute
        self.limit = check_limit(limit)
        self._download = bool(download)
        self._num_workers = check_nonnegative_int("num_workers", num_workers)

    @property
    def sample_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return (3, self.image_size, self.image_size)

    @property
    def num_classes(self) -> int | None:  # type: ignore[override]
        return None if self.label_attribute is None else 2

    def _dataset(self, split: str):
        import torchvision.datasets as tvd
        import torchvision.transforms as T

        root = Path(self.root)
        how = (
            "Place the aligned images in root/celeba/img_align_celeba/ and the list_*.txt / "
            "identity_CelebA.txt files in root/celeba/ (from the CelebA website), or pass "
            "download=True."
        )
        if not self._download and not root.is_dir():
            raise FileNotFoundError(f"root={self.root!r} is not a directory. {how}")
        transform = T.Compose(
            [
                T.CenterCrop(self.crop_size),
                T.Resize(self.image_size, antialias=True),
                T.PILToTensor(),
            ]
        )
        try:
            return tvd.CelebA(
                str(root),
                split=split,
                target_type=[],
                transform=transform,
                download=self._download,
            )
        except RuntimeError as err:
            raise FileNotFoundError(
                f"CelebA not found under root={self.root!r} ({err}). {how}"
            ) from err

    def _split(self, split: str) -> tuple[Tensor, Tensor | None, list[Path]]:
        """Images, labels and image files of the official ``split``."""
        ds = self._dataset(split)
        n = len(ds) if self.limit is None else min(self.limit, len(ds))
        labels = None
        if self.label_attribute is not None:
            names = list(ds.attr_names)
            if self.label_attribute not in names:
                raise ValueError(
                    f"label_attribute must be one of {names} or None, got {self.label_attribute!r}"
                )
            labels = ds.attr[:n, names.index(self.label_attribute)].to(torch.int64)
        folder = Path(ds.root) / ds.base_folder / "img_align_celeba"
        files = [folder / name for name in ds.filename[:n]]
        return _load_images(ds, torch.arange(n), self._num_workers), labels, files

    def load(self) -> DataSplits:
        """The official train and test partitions; ``train_ids`` digest each training image's
        file (``IMAGE_FILES``)."""
        x_train, y_train, files = self._split("train")
        x_test, y_test, _ = self._split("test")
        return DataSplits(x_train, y_train, x_test, y_test, file_ids(files), IMAGE_FILES)


class _FileImages(Dataset):
    """``(transform(image), label)`` for a list of ``(file, label)`` (label −1: none)."""

    def __init__(self, samples: list[tuple[str, int]], transform: Any) -> None:
        self.samples = samples
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        from torchvision.datasets.folder import default_loader

        path, label = self.samples[i]
        return self.transform(default_loader(path)), label


class ImageFolder(DataSource):
    """User images in a folder, in one of three layouts:

    * ``root/<class name>/<image file>`` (torchvision ``ImageFolder``): labels are the indices
      of the sorted class-folder names;
    * ``root/<image file>`` with ``labels``, a CSV file with a header ``file,label`` (``file``
      relative to ``root``): labels are the indices of the sorted label names (or of
      ``classes``, when declared); every image needs a row;
    * ``root/<image file>`` alone: unlabelled images (``num_classes`` is ``None``).

    The class names (and their number) are treated as public. Images are resized (shorter side)
    and center-cropped to ``image_size``, converted to grayscale (1 channel) or RGB (3), pixels
    scaled to [−1, 1].

    Args:
        root: the folder of class folders, or of images.
        image_size: side s of the square output; Δ1 = 2·C·s², Δ2 = 2·√(C·s²).
        grayscale: one channel instead of three.
        test_size: held-out count (int) or fraction (float in [0, 1)); 0 keeps no test split.
        split_seed: seed of the split (records are taken in this seeded order, also when
            ``test_size`` is 0, so that ``limit`` picks a random subset, not the first class).
        limit: keep the first ``limit`` records of each split.
        num_workers: DataLoader workers used to decode the images.
        labels: a ``file,label`` CSV for a flat folder.
        classes: the declared class names of ``labels`` (a label not among them is refused).
    """

    low, high = -1.0, 1.0

    def __init__(
        self,
        root: str | Path,
        image_size: int = 64,
        grayscale: bool = False,
        test_size: int | float = 0.0,
        split_seed: int = 0,
        limit: int | None = None,
        num_workers: int = 0,
        labels: str | None = None,
        classes: list[str] | None = None,
    ) -> None:
        self.root = str(root)
        self.image_size = _check_image_size(image_size)
        self.grayscale = bool(grayscale)
        self.test_size = check_test_size(test_size)
        self.split_seed = int(split_seed)
        self.limit = check_limit(limit)
        self._num_workers = check_nonnegative_int("num_workers", num_workers)
        self.labels = None if labels is None else str(labels)
        if classes is not None and labels is None:
            raise ValueError("classes names the labels of a labels file: give labels too")
        self._classes: list[str] | None = None if classes is None else [str(c) for c in classes]
        self._samples: list[tuple[str, int]] | None = None

    @property
    def sample_shape(self) -> tuple[int, ...]:  # type: ignore[override]
        return (1 if self.grayscale else 3, self.image_size, self.image_size)

    @property
    def classes(self) -> list[str] | None:
        """The class names (label i is ``classes[i]``); ``None`` for unlabelled images."""
        if self._samples is None:
            self._samples = self._layout()
        return self._classes

    @property
    def num_classes(self) -> int | None:  # type: ignore[override]
        classes = self.classes
        return None if classes is None else len(classes)

    def _layout(self) -> list[tuple[str, int]]:
        """``(file, label)`` of every image, in a sorted order; sets the class names."""
        from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

        root = Path(self.root)
        if not root.is_dir():
            raise FileNotFoundError(
                f"root={self.root!r} is not a directory: ImageFolder expects root/<class "
                "name>/<image files> or root/<image files>"
            )
        flat = sorted(
            str(p) for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMG_EXTENSIONS
        )
        folders = sorted(
            p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
        )
        if self.labels is not None:
            return self._labelled(flat)
        if folders and not flat:
            index = {name: i for i, name in enumerate(folders)}
            samples = make_dataset(self.root, index, IMG_EXTENSIONS, allow_empty=True)
            if not samples:
                raise FileNotFoundError(f"root={self.root!r}: no image files in its class folders")
            self._classes = folders
            return [(path, int(label)) for path, label in samples]
        if not flat:
            raise FileNotFoundError(
                f"root={self.root!r}: no image files ({', '.join(IMG_EXTENSIONS)})"
            )
        if folders:
            raise ValueError(
                f"root={self.root!r} holds both images and folders {folders[:3]}: use class "
                "folders only, or images only (with labels=... for their labels)"
            )
        return [(path, -1) for path in flat]

    def _labelled(self, flat: list[str]) -> list[tuple[str, int]]:
        import csv

        assert self.labels is not None
        with open(self.labels, newline="") as file:
            reader = csv.DictReader(file)
            if reader.fieldnames is None or not {"file", "label"} <= set(reader.fieldnames):
                raise ValueError(f"labels={self.labels!r} must be a CSV with header file,label")
            given = {str(Path(self.root) / row["file"]): row["label"] for row in reader}
        missing = [Path(path).name for path in flat if path not in given]
        if missing:
            raise ValueError(
                f"labels={self.labels!r} has no row for {missing[0]!r} (every image needs one)"
            )
        unknown = sorted(set(given) - set(flat))
        if unknown:
            raise ValueError(
                f"labels={self.labels!r} names {Path(unknown[0]).name!r}, not an image in root"
            )
        names = self._classes if self._classes is not None else sorted(set(given.values()))
        index = {name: i for i, name in enumerate(names)}
        for path in flat:
            if given[path] not in index:
                raise ValueError(
                    f"labels={self.labels!r}: {Path(path).name!r} has label {given[path]!r}, "
                    f"not among classes {names}"
                )
        self._classes = list(names)
        return [(path, index[given[path]]) for path in flat]

    def load(self) -> DataSplits:
        import torchvision.transforms as T

        samples = self._layout()
        self._samples = samples
        steps = [T.Resize(self.image_size, antialias=True), T.CenterCrop(self.image_size)]
        if self.grayscale:  # the loader gives RGB
            steps.append(T.Grayscale(num_output_channels=1))
        steps.append(T.PILToTensor())
        ds = _FileImages(samples, T.Compose(steps))
        targets = torch.as_tensor([label for _, label in samples], dtype=torch.int64)
        labelled = self._classes is not None
        train, test = split_indices(len(ds), self.test_size, self.split_seed)
        train, test = first_rows(train, self.limit), first_rows(test, self.limit)
        x_train = _load_images(ds, train, self._num_workers)
        ids = file_ids([samples[i][0] for i in train.tolist()])
        y_train = targets[train] if labelled else None
        if len(test) == 0:
            return DataSplits(x_train, y_train, train_ids=ids, id_namespace=IMAGE_FILES)
        x_test = _load_images(ds, test, self._num_workers)
        y_test = targets[test] if labelled else None
        return DataSplits(x_train, y_train, x_test, y_test, ids, IMAGE_FILES)
