"""Image sources: IDX parsing, seeded splits, padding, torchvision roots, refusals. The reader
and the splits are checked on generated digits (``digit_idx_dir``); the official MNIST and
Fashion-MNIST files, where ``$DPOT_DATA_DIR`` has them (tests/conftest.py)."""

from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_dpot.data.image_files import CelebA, ImageFolder
from lightning_dpot.data.images import (
    MNIST,
    FashionMNIST,
    pad_to,
    read_idx,
    scale_pixels,
    split_indices,
)

# Official MNIST test split ($DPOT_DATA_DIR/mnist-test; see docs/image_experiments.md).
MNIST_TEST_MD5 = {
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
MNIST_TEST_LABEL_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.fixture(scope="module")
def mnist_test_only(mnist_test_dir: Path):
    source = MNIST(idx_dir=mnist_test_dir, split="test-only", test_size=2000, split_seed=0)
    return source, source.load()


@pytest.fixture(scope="module")
def digits_test_only(digit_idx_dir: Path):
    """The generated t10k digits (10,000) split 8,000 / 2,000 as the shipped MNIST split is."""
    return MNIST(idx_dir=digit_idx_dir, split="test-only", test_size=2000, split_seed=0).load()


def test_shipped_mnist_files_are_the_official_ones(mnist_test_dir: Path):
    for name, md5 in MNIST_TEST_MD5.items():
        assert hashlib.md5((mnist_test_dir / name).read_bytes()).hexdigest() == md5


def test_read_idx_parses_the_mnist_test_split(mnist_test_dir: Path):
    images = read_idx(mnist_test_dir / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(mnist_test_dir / "t10k-labels-idx1-ubyte.gz")
    assert images.shape == (10_000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (10_000,)
    assert np.bincount(labels).tolist() == MNIST_TEST_LABEL_COUNTS


def test_read_idx_refuses_a_truncated_or_foreign_file(tmp_path: Path):
    bad = tmp_path / "bad.gz"
    bad.write_bytes(gzip.compress(b"\x00\x00\x08\x01\x00\x00\x00\x05abc"))
    with pytest.raises(ValueError, match="declares shape"):
        read_idx(bad)
    foreign = tmp_path / "foreign"
    foreign.write_bytes(b"PK\x03\x04 not an idx file")
    with pytest.raises(ValueError, match="magic"):
        read_idx(foreign)


def test_mnist_test_only_split_sizes_labels_and_exact_value_range(mnist_test_only):
    source, data = mnist_test_only
    assert data.train.shape == (8000, 1, 28, 28) and data.test.shape == (2000, 1, 28, 28)
    assert data.train.dtype == torch.float32 and data.train_labels.dtype == torch.int64
    labels = torch.cat([data.train_labels, data.test_labels])
    assert torch.bincount(labels).tolist() == MNIST_TEST_LABEL_COUNTS
    both = torch.cat([data.train, data.test])
    assert both.min().item() == -1.0 and both.max().item() == 1.0
    # pixels v/127.5 − 1 for integer v: only 256 distinct values
    assert torch.unique(both).numel() <= 256
    assert source.sample_shape == (1, 28, 28) and source.num_classes == 10
    assert (source.low, source.high) == (-1.0, 1.0)


def test_mnist_declared_sensitivities_match_reshetova_2024(tmp_path: Path):
    source = MNIST(idx_dir=tmp_path, split="test-only")  # declared: no file is read
    assert source.dim == 784
    assert source.diameter(1) == pytest.approx(1568.0)  # Δ1 = 2·28²
    assert source.diameter(2) == pytest.approx(56.0)  # Δ2 = 2·28


def test_seeded_split_is_reproducible_disjoint_and_seed_dependent():
    train_a, test_a = split_indices(10_000, 2000, split_seed=3)
    train_b, test_b = split_indices(10_000, 2000, split_seed=3)
    train_c, _ = split_indices(10_000, 2000, split_seed=4)
    assert torch.equal(train_a, train_b) and torch.equal(test_a, test_b)
    assert not torch.equal(train_a, train_c)
    assert len(set(train_a.tolist()) & set(test_a.tolist())) == 0
    assert sorted(train_a.tolist() + test_a.tolist()) == list(range(10_000))
    # a fraction gives the same split as the equivalent count
    train_f, test_f = split_indices(10_000, 0.2, split_seed=3)
    assert torch.equal(test_f, test_a)


def _pixel_rows(images: torch.Tensor) -> list[bytes]:
    """Each image back to its 8-bit pixels, as bytes (sortable, hashable)."""
    pixels = ((images + 1.0) * 127.5).round().to(torch.uint8)
    return [bytes(row) for row in pixels.flatten(1).numpy()]


def test_seeded_mnist_split_is_reproducible_and_partitions_the_records(
    digit_idx_dir: Path, digits_test_only
):
    first = digits_test_only
    again = MNIST(idx_dir=digit_idx_dir, split="test-only", test_size=2000, split_seed=0).load()
    assert torch.equal(first.train, again.train)
    assert torch.equal(first.test_labels, again.test_labels)
    raw = torch.from_numpy(read_idx(digit_idx_dir / "t10k-images-idx3-ubyte.gz").copy())
    raw_rows = [bytes(row) for row in raw.flatten(1).numpy()]
    split_rows = _pixel_rows(first.train) + _pixel_rows(first.test)
    assert sorted(split_rows) == sorted(raw_rows)  # every record exactly once


def test_padding_to_32_fills_the_border_with_minus_one(digit_idx_dir: Path, digits_test_only):
    plain = digits_test_only
    source = MNIST(idx_dir=digit_idx_dir, split="test-only", image_size=32, limit=50)
    data = source.load()
    assert data.train.shape == (50, 1, 32, 32) and data.test.shape == (50, 1, 32, 32)
    assert source.sample_shape == (1, 32, 32) and source.dim == 1024
    border = torch.ones(32, 32, dtype=torch.bool)
    border[2:30, 2:30] = False
    assert (data.train[:, :, border] == -1.0).all()
    assert torch.equal(data.train[:, :, 2:30, 2:30], plain.train[:50])
    # the constant border adds nothing to ‖x − x'‖: the 28×28 sensitivities stay
    assert source.diameter(1) == pytest.approx(1568.0)
    assert source.diameter(2) == pytest.approx(56.0)


def test_pad_to_handles_odd_margins_and_refuses_shrinking():
    x = torch.zeros(2, 1, 28, 28)
    y = pad_to(x, 31)
    assert y.shape == (2, 1, 31, 31)
    assert (y[..., :1, :] == -1).all() and (y[..., -2:, :] == -1).all()  # 1 above, 2 below
    assert (y[..., 1:29, 1:29] == 0).all()
    with pytest.raises(ValueError, match="image_size must be >= 28"):
        pad_to(x, 20)


def test_scale_pixels_maps_0_and_255_exactly_to_the_bounds():
    v = torch.tensor([0, 1, 127, 128, 255], dtype=torch.uint8)
    x = scale_pixels(v)
    assert x[0].item() == -1.0 and x[-1].item() == 1.0 and x.dtype == torch.float32


def test_limit_keeps_the_first_records_of_each_split(digit_idx_dir: Path, digits_test_only):
    full = digits_test_only
    small = MNIST(idx_dir=digit_idx_dir, split="test-only", limit=100).load()
    assert torch.equal(small.train, full.train[:100]) and torch.equal(small.test, full.test[:100])


def test_test_only_with_zero_test_size_has_no_test_split(digit_idx_dir: Path):
    data = MNIST(idx_dir=digit_idx_dir, split="test-only", test_size=0, limit=10).load()
    assert data.test is None and data.train.shape == (10, 1, 28, 28)


def test_official_split_on_a_test_only_folder_says_how_to_fix_it(
    digit_idx_dir: Path, tmp_path: Path
):
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(digit_idx_dir / name, tmp_path / name)  # the t10k files only
    with pytest.raises(FileNotFoundError, match="split='test-only'"):
        MNIST(idx_dir=tmp_path).load()


def test_torchvision_root_reads_the_same_records(tmp_path: Path, digit_idx_dir: Path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        with gzip.open(digit_idx_dir / f"{name}.gz", "rb") as src, open(raw / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    via_root = MNIST(root=tmp_path, split="test-only", limit=300).load()
    via_idx = MNIST(idx_dir=digit_idx_dir, split="test-only", limit=300).load()
    assert torch.equal(via_root.train, via_idx.train)
    assert torch.equal(via_root.test_labels, via_idx.test_labels)


def test_missing_root_is_refused_naming_the_parameter(tmp_path: Path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=r"root='.*nowhere'.*download=True"):
        MNIST(root=missing).load()
    with pytest.raises(FileNotFoundError, match=r"root='.*'.*MNIST/raw"):
        MNIST(root=tmp_path).load()  # exists, but holds no files
    with pytest.raises(FileNotFoundError, match=r"idx_dir='.*nowhere'"):
        FashionMNIST(idx_dir=missing).load()
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        FashionMNIST(idx_dir=tmp_path).load()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of root"),
        ({"root": "a", "idx_dir": "b"}, "exactly one of root"),
        ({"idx_dir": "b", "download": True}, "download=True needs root"),
        ({"root": "a", "split": "train"}, "split must be"),
        ({"root": "a", "image_size": 20}, "image_size must be an integer >= 28"),
        ({"root": "a", "limit": 0}, "limit must be an integer >= 1"),
        ({"root": "a", "test_size": 1.5}, r"test_size .*\[0, 1\)"),
        ({"root": "a", "test_size": -3}, "test_size must be an integer >= 0"),
    ],
)
def test_invalid_arguments_are_refused_with_name_value_and_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MNIST(**kwargs)


def test_test_size_larger_than_the_data_is_refused():
    with pytest.raises(ValueError, match="test_size must leave training records"):
        split_indices(100, 100, split_seed=0)


def test_describe_records_the_split_parameters(tmp_path: Path):
    info = MNIST(idx_dir=tmp_path, split="test-only", image_size=32).describe()
    assert info["source"] == "MNIST" and info["split"] == "test-only"
    assert info["test_size"] == 2000 and info["split_seed"] == 0 and info["image_size"] == 32


def test_fashion_mnist_reads_the_official_split(fashion_mnist_dir: Path):
    data = FashionMNIST(idx_dir=fashion_mnist_dir).load()
    assert data.train.shape == (60_000, 1, 28, 28) and data.test.shape == (10_000, 1, 28, 28)
    assert torch.bincount(data.train_labels).tolist() == [6000] * 10
    assert torch.bincount(data.test_labels).tolist() == [1000] * 10
    assert data.train.min().item() == -1.0 and data.train.max().item() == 1.0


def _write_png_folder(root: Path, sizes: dict[str, int]) -> None:
    from PIL import Image

    gen = np.random.default_rng(0)
    for label, count in sizes.items():
        (root / label).mkdir(parents=True)
        for i in range(count):
            pixels = gen.integers(0, 256, size=(20, 30, 3), dtype=np.uint8)
            pixels[0, 0] = (0, 0, 0)
            pixels[10, 15] = (255, 255, 255)  # center pixel survives the crop
            Image.fromarray(pixels).save(root / label / f"{i}.png")


def test_image_folder_loads_labels_from_folders_resized_and_scaled(tmp_path: Path):
    _write_png_folder(tmp_path, {"cats": 3, "dogs": 5})
    source = ImageFolder(tmp_path, image_size=16)
    assert source.num_classes == 2 and source.classes == ["cats", "dogs"]
    data = source.load()
    assert data.train.shape == (8, 3, 16, 16) and data.test is None
    assert torch.bincount(data.train_labels).tolist() == [3, 5]
    assert data.train.min() >= -1.0 and data.train.max() <= 1.0
    assert source.sample_shape == (3, 16, 16)


def test_image_folder_grayscale_split_and_limit(tmp_path: Path):
    _write_png_folder(tmp_path, {"a": 6, "b": 6})
    source = ImageFolder(tmp_path, image_size=8, grayscale=True, test_size=4, split_seed=1)
    data = source.load()
    assert data.train.shape == (8, 1, 8, 8) and data.test.shape == (4, 1, 8, 8)
    again = source.load()
    assert torch.equal(data.test, again.test) and torch.equal(data.train_labels, again.train_labels)
    small = ImageFolder(tmp_path, image_size=8, grayscale=True, test_size=4, limit=2).load()
    assert small.train.shape[0] == 2 and small.test.shape[0] == 2


def test_image_folder_missing_root_names_the_parameter(tmp_path: Path):
    source = ImageFolder(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match=r"root='.*absent'"):
        source.load()
    with pytest.raises(FileNotFoundError, match=r"root='.*absent'"):
        _ = source.num_classes


def test_celeba_without_data_is_refused_naming_root(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=r"root='.*absent'.*img_align_celeba"):
        CelebA(tmp_path / "absent").load()
    with pytest.raises(FileNotFoundError, match=r"CelebA not found under root="):
        CelebA(tmp_path).load()  # exists, but holds no CelebA files


def test_celeba_declares_shape_bounds_and_labels_without_data(tmp_path: Path):
    source = CelebA(tmp_path, image_size=32)
    assert source.sample_shape == (3, 32, 32) and source.num_classes == 2
    assert source.diameter(2) == pytest.approx(2 * (3 * 32 * 32) ** 0.5)
    assert CelebA(tmp_path, label_attribute=None).num_classes is None


def _write_idx_test_split(folder: Path, images: np.ndarray, compress: bool) -> None:
    folder.mkdir(parents=True)
    labels = np.zeros(len(images), dtype=np.uint8)
    files = {
        "t10k-images-idx3-ubyte": bytes([0, 0, 8, 3])
        + np.array(images.shape, dtype=">i4").tobytes()
        + images.tobytes(),
        "t10k-labels-idx1-ubyte": bytes([0, 0, 8, 1])
        + np.array([len(labels)], dtype=">i4").tobytes()
        + labels.tobytes(),
    }
    for name, data in files.items():
        if compress:
            (folder / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)


def test_idx_record_ids_digest_the_raw_pixels_whatever_the_preprocessing(tmp_path: Path):
    images = np.random.default_rng(0).integers(0, 256, size=(12, 28, 28), dtype=np.uint8)
    _write_idx_test_split(tmp_path / "a", images, compress=False)
    _write_idx_test_split(tmp_path / "b", images, compress=True)
    base = MNIST(idx_dir=tmp_path / "a", split="test-only", test_size=0).load()
    assert base.id_namespace == "idx-uint8-pixels" and base.train_ids.dtype == torch.int64
    assert len(set(base.train_ids.tolist())) == 12
    for other in (
        MNIST(idx_dir=tmp_path / "b", split="test-only", test_size=0, image_size=32),
        FashionMNIST(idx_dir=tmp_path / "b", split="test-only", test_size=0, split_seed=5),
    ):
        data = other.load()
        assert data.id_namespace == base.id_namespace
        assert sorted(data.train_ids.tolist()) == sorted(base.train_ids.tolist())
        images_by_id = dict(zip(base.train_ids.tolist(), base.train, strict=True))
        for i, image in zip(data.train_ids.tolist(), data.train, strict=True):
            assert torch.equal(pad_to(images_by_id[i], image.shape[-1]), image)


def test_image_folder_record_ids_digest_the_files_wherever_they_are(tmp_path: Path):
    _write_png_folder(tmp_path / "here", {"a": 3, "b": 3})
    shutil.copytree(tmp_path / "here", tmp_path / "there")
    base = ImageFolder(tmp_path / "here", image_size=16).load()
    assert base.id_namespace == "image-file-bytes" and len(set(base.train_ids.tolist())) == 6
    moved = ImageFolder(tmp_path / "there", image_size=8, grayscale=True, split_seed=3).load()
    assert sorted(moved.train_ids.tolist()) == sorted(base.train_ids.tolist())
