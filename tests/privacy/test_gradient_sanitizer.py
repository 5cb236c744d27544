"""GradientSanitizer at the edges: float64 noise under every precision, a finite release
whatever the gradient, and no noise reused between releases."""

from __future__ import annotations

import pytest
import torch

from lightning_dpot.privacy.mechanisms.gradient_sanitizer import GradientSanitizer, clip_frobenius
from lightning_dpot.rng import seeded_generator


def test_noise_is_drawn_and_added_in_float64_under_bf16_autocast():
    grad = torch.randn(6, 5, generator=torch.Generator().manual_seed(0)).bfloat16()
    sanitizer = GradientSanitizer(0.5, 1.3, noise_seed=11, sample_rate=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        released = sanitizer(grad, 4)
    assert released.dtype == torch.bfloat16
    noise = torch.randn((4, 5), generator=seeded_generator(11, 0, 0), dtype=torch.float64)
    cross = clip_frobenius(grad[:4], 0.5) + sanitizer.noise_std * noise
    expected = torch.cat([cross, clip_frobenius(grad[4:], 0.5)]).bfloat16()
    torch.testing.assert_close(released, expected, rtol=0, atol=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 3e38])
def test_a_non_finite_or_huge_gradient_still_releases_finite_bounded_values(bad):
    grad = torch.ones(5, 4)
    grad[1, 2] = bad
    sanitizer = GradientSanitizer(0.5, 1.0, noise_seed=3, sample_rate=1.0)
    released = sanitizer(grad, 3)
    assert torch.isfinite(released).all()
    clipped = clip_frobenius(grad[:3], 0.5)
    assert torch.isfinite(clipped).all() and torch.linalg.vector_norm(clipped) <= 0.5 + 1e-12
    torch.testing.assert_close(released[3:], clip_frobenius(grad[3:], 0.5).float())


def test_an_explicit_noise_seed_never_repeats_across_releases():
    from lightning_dpot.privacy.mechanisms.gradient_sanitizer import GradientSanitizer

    grad = torch.zeros(4, 3)
    sanitizer = GradientSanitizer(1.0, 1.0, noise_seed=7, sample_rate=1.0)
    first, second = sanitizer(grad, 4), sanitizer(grad, 4)  # two micro-batches of one step
    assert not torch.equal(first, second)
    again = GradientSanitizer(1.0, 1.0, noise_seed=7, sample_rate=1.0)
    torch.testing.assert_close(again(grad, 4), first, rtol=0, atol=0)  # still reproducible
