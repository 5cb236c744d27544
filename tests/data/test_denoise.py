"""Wavelet-thresholding baseline (Reshetova et al. 2024, Fig. 3) with the known noise level."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lightning_dpot.data.denoise import universal_threshold, wavelet_denoise
from lightning_dpot.data.images import MNIST


@pytest.fixture(scope="module")
def digits(digit_idx_dir: Path) -> torch.Tensor:
    """128 generated 28×28 digits in [−1, 1] (tests/conftest.py)."""
    return MNIST(idx_dir=digit_idx_dir, split="test-only", test_size=0, limit=128).load().train


def _mse(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b) ** 2).mean().item()


@pytest.mark.parametrize("noise_std", [0.5, 1.0, 3.0])
def test_denoising_noisy_digits_reduces_the_error_to_the_clean_images(digits, noise_std):
    gen = torch.Generator().manual_seed(0)
    noisy = digits + noise_std * torch.randn(digits.shape, generator=gen)
    denoised = wavelet_denoise(noisy, noise_std)
    assert denoised.shape == digits.shape and denoised.dtype == digits.dtype
    assert _mse(denoised, digits) < 0.5 * _mse(noisy, digits)


def test_clipping_to_the_declared_bounds_only_helps(digits):
    gen = torch.Generator().manual_seed(1)
    noisy = digits + 3.0 * torch.randn(digits.shape, generator=gen)
    clipped = wavelet_denoise(noisy, 3.0, clip=(-1.0, 1.0))
    assert clipped.min() >= -1.0 and clipped.max() <= 1.0
    assert _mse(clipped, digits) <= _mse(wavelet_denoise(noisy, 3.0), digits)


def test_batched_denoising_equals_denoising_each_image(digits):
    gen = torch.Generator().manual_seed(2)
    noisy = digits[:4] + 0.5 * torch.randn(digits[:4].shape, generator=gen)
    batched = wavelet_denoise(noisy, 0.5)
    one_by_one = torch.cat([wavelet_denoise(img[None], 0.5) for img in noisy])
    assert torch.allclose(batched, one_by_one, atol=1e-6)
    assert torch.allclose(wavelet_denoise(noisy[:, 0], 0.5), batched[:, 0], atol=1e-6)


def test_images_without_detail_pass_unchanged():
    constant = torch.full((2, 3, 32, 32), 0.3)
    assert torch.allclose(wavelet_denoise(constant, 1.0), constant, atol=1e-6)


def test_zero_threshold_reconstructs_exactly_and_hard_mode_works():
    x = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert torch.allclose(wavelet_denoise(x, 1.0, threshold=0.0), x, atol=1e-10)
    assert wavelet_denoise(x, 1.0, mode="hard", wavelet="haar", level=3).shape == x.shape


def test_universal_threshold_is_sigma_sqrt_2_log_n():
    assert universal_threshold(2.0, 784) == pytest.approx(2.0 * math.sqrt(2 * math.log(784)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"noise_std": 0.0}, "noise_std must be a finite number > 0"),
        ({"noise_std": 1.0, "wavelet": "nope"}, "wavelet must be a discrete"),
        ({"noise_std": 1.0, "mode": "median"}, "mode must be"),
        ({"noise_std": 1.0, "level": 5}, r"level must be an integer in \[1, 2\]"),
        ({"noise_std": 1.0, "threshold": -1.0}, "threshold must be"),
        ({"noise_std": 1.0, "clip": (1.0, -1.0)}, "clip must be"),
    ],
)
def test_invalid_arguments_are_refused_with_the_range(kwargs, message):
    with pytest.raises(ValueError, match=message):
        wavelet_denoise(torch.zeros(1, 1, 28, 28), **kwargs)
