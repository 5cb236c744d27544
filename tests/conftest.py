"""Shared fixtures: the offline data shipped beside the repository (``../shared/data``)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest

from lightning_dpot.data.ledger import LEDGER_ENV

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """``../shared/data``; tests that need it are skipped with a reason where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"offline data not found at {SHARED_DATA} (see docs/image_experiments.md)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def mnist_test_dir(shared_data_dir: Path) -> Path:
    path = shared_data_dir / "mnist-test"
    if not (path / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"MNIST test split not found in {path}")
    return path


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The suite's runs are tiny: on a 2-core CI machine torch's thread pool costs more than it
    gains, and tests running beside each other contend less."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


@pytest.fixture(scope="session", autouse=True)
def session_ledger(tmp_path_factory):
    """A ledger for the whole session, in force before any module-scoped fixture runs, so no
    test ever writes to the user's own ledger."""
    with _ledger_at(tmp_path_factory.mktemp("session_ledger")):
        yield


@pytest.fixture(autouse=True)
def private_ledger(tmp_path_factory):
    """Each test's releases go to a privacy ledger of its own, not the user's
    (:mod:`lightning_dpot.data.ledger`)."""
    with _ledger_at(tmp_path_factory.mktemp("ledger")):
        yield
