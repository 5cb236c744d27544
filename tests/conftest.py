"""Shared fixtures: the image data of the tests, and a privacy ledger and one torch thread per
test.

Image data. Tests that check MNIST or Fashion-MNIST themselves (the official files, their
label counts, the shipped split) read them from ``$DPOT_DATA_DIR``: a folder holding
``mnist-test/`` (the MNIST test split, ``t10k-images-idx3-ubyte.gz`` and
``t10k-labels-idx1-ubyte.gz``) and/or ``fashion-mnist/`` (Fashion-MNIST's four IDX ``.gz``
files). When the variable is set it is the only place looked; unset, the tests look where the
project's machines keep the files (:data:`DEFAULT_LOCATIONS`). Without the files those tests are
skipped, naming the variable. Every other image test reads :func:`digit_idx_dir`: scikit-learn's
8×8 digits, upsampled into 28×28 IDX files written to a temporary folder, in the layout of both
datasets, so it runs on every clone.

Writes. :mod:`write_guard` (imported before the package) points every cache a dependency keeps
under ``$HOME`` at a temporary folder for the test run, which fails, naming the files, if a
test wrote into the repository or the user's caches; each test's privacy ledger is a
temporary folder of its own.
"""

from __future__ import annotations

import gzip
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from write_guard import WriteGuard

from lightning_dpot.data.ledger import LEDGER_ENV

DATA_ENV = "DPOT_DATA_DIR"
DEFAULT_LOCATIONS = {
    "mnist-test": Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist-test",
    "fashion-mnist": Path("/usr/share/datasets/fashion-mnist"),
}
DATA_NEEDED = {
    "mnist-test": ("t10k-images-idx3-ubyte.gz", "the MNIST test split's t10k IDX .gz files"),
    "fashion-mnist": ("train-images-idx3-ubyte.gz", "Fashion-MNIST's IDX .gz files"),
}


def data_folder(name: str) -> Path:
    """``$DPOT_DATA_DIR/<name>`` (``name`` in :data:`DATA_NEEDED`), or its default location when
    the variable is unset; skips the calling test when the folder lacks the dataset."""
    root = os.environ.get(DATA_ENV)
    folder = Path(root) / name if root else DEFAULT_LOCATIONS[name]
    required, what = DATA_NEEDED[name]
    if not (folder / required).is_file():
        pytest.skip(f"set {DATA_ENV} to a folder whose {name}/ holds {what}")
    return folder


@pytest.fixture(scope="session")
def mnist_test_dir() -> Path:
    """The official MNIST test split (10,000 images), ``$DPOT_DATA_DIR/mnist-test``."""
    return data_folder("mnist-test")


@pytest.fixture(scope="session")
def fashion_mnist_dir() -> Path:
    """Fashion-MNIST, official split (60,000 + 10,000), ``$DPOT_DATA_DIR/fashion-mnist``."""
    return data_folder("fashion-mnist")


def write_idx(path: Path, array: np.ndarray) -> None:
    """An unsigned-byte IDX file (the MNIST format), gzip-compressed: magic ``0 0 8 ndim``,
    the sizes as big-endian int32, then the bytes."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">i4").tobytes()
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes(), compresslevel=1))


def digit_images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` 28×28 uint8 digit images and their labels: scikit-learn's 8×8 digits (pixels
    0…16) upsampled to 20×20 (bilinear) and placed at a seeded offset in a black 28×28 frame,
    as MNIST centres its digits in a 20×20 box."""
    import torch
    from sklearn.datasets import load_digits

    bunch = load_digits()
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(bunch.images), size=n)
    small = torch.as_tensor(bunch.images[pick], dtype=torch.float32).unsqueeze(1) * (255 / 16)
    large = torch.nn.functional.interpolate(small, size=(20, 20), mode="bilinear")
    digits = large.squeeze(1).round().clamp(0, 255).to(torch.uint8).numpy()
    images = np.zeros((n, 28, 28), dtype=np.uint8)
    rows, cols = rng.integers(2, 7, size=n), rng.integers(2, 7, size=n)
    for image, digit, row, col in zip(images, digits, rows, cols, strict=True):
        image[row : row + 20, col : col + 20] = digit
    return images, bunch.target[pick].astype(np.uint8)


@pytest.fixture(scope="session")
def digit_idx_dir(tmp_path_factory) -> Path:
    """A folder of MNIST-format IDX files of generated digits (:func:`digit_images`): 2,000
    training and 10,000 test images (``train-*`` and ``t10k-*``), readable by ``MNIST`` and
    ``FashionMNIST`` with ``idx_dir`` and either split."""
    folder = tmp_path_factory.mktemp("digit_idx")
    for prefix, n, seed in (("train", 2000, 0), ("t10k", 10_000, 1)):
        images, labels = digit_images(n, seed)
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
    return folder


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The suite's runs are tiny: on a 2-core CI machine torch's thread pool costs more than it
    gains, and tests running beside each other contend less."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def fresh_ddp_port(monkeypatch):
    """Each test's DDP run asks the OS for a free port: Lightning keeps the port of a run in
    ``MASTER_PORT``, and with the suite spread over workers another worker may take it."""
    monkeypatch.delenv("MASTER_PORT", raising=False)


@contextmanager
def _ledger_at(directory: Path):
    """``$DPOT_LEDGER_DIR`` set to ``directory`` inside the block (child processes inherit it)."""
    previous = os.environ.get(LEDGER_ENV)
    os.environ[LEDGER_ENV] = str(directory)
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(LEDGER_ENV, None)
        else:
            os.environ[LEDGER_ENV] = previous


@pytest.fixture(scope="module", autouse=True)
def module_ledger(tmp_path_factory):
    """A ledger for each test module, in force before its module-scoped fixtures run, so no
    test ever writes to the user's own ledger, and the runs of one module never meet the
    records of another's in a ledger."""
    with _ledger_at(tmp_path_factory.mktemp("module_ledger")):
        yield


@pytest.fixture(autouse=True)
def private_ledger(tmp_path_factory):
    """Each test's releases go to a privacy ledger of its own, not the user's
    (:mod:`lightning_dpot.data.ledger`)."""
    with _ledger_at(tmp_path_factory.mktemp("ledger")):
        yield


GUARD = pytest.StashKey[WriteGuard]()
WRITTEN = pytest.StashKey[list]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[GUARD] = WriteGuard()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the test run if a test wrote outside temporary folders (:mod:`write_guard`)."""
    written = session.config.stash[GUARD].written()
    if written:
        session.config.stash[WRITTEN] = written
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    written = config.stash.get(WRITTEN, [])
    if written:
        terminalreporter.section("files written outside temporary folders", red=True)
        for path in written:
            terminalreporter.line(str(path))
        terminalreporter.line("tests write under tmp_path (or tmp_path_factory); the run fails")
