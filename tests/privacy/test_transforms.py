"""The DCT transform is orthonormal and its declared sensitivities hold."""

import math

import pytest
import torch

from lightning_dpot.privacy.mechanisms.transforms import DCT2D, dct_matrix, make_transform


def test_dct_matrix_is_orthonormal():
    d = dct_matrix(28)
    assert torch.allclose(d @ d.T, torch.eye(28, dtype=d.dtype), atol=1e-12)


def test_full_dct_round_trips_and_preserves_norm():
    t = DCT2D((1, 28, 28))
    x = torch.randn(4, 1, 28, 28)
    y = t.forward(x)
    assert torch.allclose(t.inverse(y), x, atol=1e-4)
    assert torch.allclose(y.norm(dim=1), x.flatten(1).norm(dim=1), rtol=1e-4)


def test_masked_dct_sensitivities_bound_worst_pairs():
    t = DCT2D((1, 8, 8), keep=4)
    diam1, diam2 = t.diameters(2.0 * 64, 2.0 * 8)
    assert diam2 == 16.0 and diam1 == pytest.approx(math.sqrt(16) * 16.0)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(500, 1, 8, 8, generator=gen).round() * 2 - 1  # box corners
    y = t.forward(x)
    diffs = y[:250] - y[250:]
    assert diffs.norm(dim=1).max() <= diam2 + 1e-4
    assert diffs.abs().sum(dim=1).max() <= diam1 + 1e-4


def test_refusals():
    with pytest.raises(ValueError, match="dct_keep must lie in"):
        DCT2D((1, 8, 8), keep=9)
    with pytest.raises(ValueError, match=r"shape \(C, H, W\)"):
        DCT2D((2,))
    with pytest.raises(ValueError, match="transform must be"):
        make_transform("fft", (1, 8, 8))
