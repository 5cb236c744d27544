"""Image tensors for the metric tests, the MNIST test split or generated digits (a private IDX
reader: magic, dims, uint8)."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_limits
from torch import Tensor


def _read_idx_gz(path: Path) -> np.ndarray:
    data = gzip.decompress(path.read_bytes())
    if data[:2] != b"\x00\x00" or data[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _t10k_tensors(folder: Path) -> tuple[Tensor, Tensor]:
    """``(10000, 1, 28, 28)`` float32 images in [−1, 1] and ``(10000,)`` int64 labels."""
    images = _read_idx_gz(folder / "t10k-images-idx3-ubyte.gz")
    labels = _read_idx_gz(folder / "t10k-labels-idx1-ubyte.gz")
    x = torch.from_numpy(images.astype(np.float32) / 127.5 - 1.0).unsqueeze(1)
    return x, torch.from_numpy(labels.astype(np.int64))


@pytest.fixture(scope="session")
def mnist_test_tensors(mnist_test_dir: Path) -> tuple[Tensor, Tensor]:
    """The official MNIST test split (tests that need real MNIST)."""
    return _t10k_tensors(mnist_test_dir)


@pytest.fixture(scope="session")
def digit_tensors(digit_idx_dir: Path) -> tuple[Tensor, Tensor]:
    """10,000 generated digits (tests that need images, not MNIST itself)."""
    return _t10k_tensors(digit_idx_dir)


@pytest.fixture(scope="module", autouse=True)
def _one_thread_per_test_process() -> Iterator[None]:
    """Run these CPU-heavy tests single-threaded (torch and BLAS), restoring the settings after.

    The test machine is small and shared; oversubscribed intra-op threads make small conv and
    L-BFGS workloads many times slower than one thread.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1):
        yield
    torch.set_num_threads(threads)
