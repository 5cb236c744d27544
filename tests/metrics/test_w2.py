"""Exact W₂ on subsamples (Reshetova et al. 2024, §IV-C): assignment = exact OT for uniform
equal-size sets."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from lightning_dpot.metrics.w2 import subsampled_w2, w2_distance


def _brute_force_w2(x: torch.Tensor, y: torch.Tensor) -> float:
    n = x.shape[0]
    cost = ((x.double()[:, None, :] - y.double()[None, :, :]) ** 2).sum(-1).numpy()
    permutations = np.array(list(itertools.permutations(range(n))))  # all n! assignments
    return math.sqrt(cost[np.arange(n), permutations].sum(1).min() / n)


def test_w2_of_identical_sets_is_zero_even_when_shuffled() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 1, 28, 28, generator=g)
    assert w2_distance(x, x) == 0.0
    assert w2_distance(x, x[torch.randperm(50, generator=g)]) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_w2_matches_brute_force_assignment_on_small_sets(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(7, 3, generator=g), torch.randn(7, 3, generator=g) + 0.5
    assert w2_distance(x, y) == pytest.approx(_brute_force_w2(x, y), rel=1e-10)
    assert w2_distance(x, y, squared=True) == pytest.approx(_brute_force_w2(x, y) ** 2, rel=1e-10)


def test_w2_of_a_translated_set_is_the_translation_length() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 5, generator=g)
    shift = torch.tensor([3.0, 0.0, -4.0, 0.0, 0.0])
    assert w2_distance(x, x + shift) == pytest.approx(5.0, rel=1e-9)


def test_w2_accepts_numpy_and_flattens_images() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 2, 2)), rng.normal(size=(6, 2, 2))
    flat = w2_distance(torch.from_numpy(x.reshape(6, 4)), torch.from_numpy(y.reshape(6, 4)))
    assert w2_distance(x, y) == pytest.approx(flat)


def test_w2_refuses_sets_of_different_sizes() -> None:
    with pytest.raises(ValueError, match="same number of samples"):
        w2_distance(torch.zeros(3, 2), torch.zeros(4, 2))


def test_subsampled_w2_of_a_set_with_itself_at_full_size_is_zero() -> None:
    x = torch.randn(30, 4, generator=torch.Generator().manual_seed(0))
    mean, stderr = subsampled_w2(x, x, subsample=30, repeats=3)
    assert mean == pytest.approx(0.0, abs=1e-9) and stderr == pytest.approx(0.0, abs=1e-9)


def test_subsampled_w2_is_reproducible_and_reports_a_standard_error() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(500, 8, generator=g), torch.randn(400, 8, generator=g) + 1.0
    first = subsampled_w2(x, y, subsample=50, repeats=5, generator=torch.Generator().manual_seed(7))
    again = subsampled_w2(x, y, subsample=50, repeats=5, generator=torch.Generator().manual_seed(7))
    assert first == again
    mean, stderr = first
    # W₂ between N(0, I₈) and N(1, I₈) is √8 ≈ 2.83; 50-point sets add sampling error on top.
    assert math.sqrt(8) < mean < 2 * math.sqrt(8)
    assert 0 < stderr < 0.5 * mean
    assert math.isnan(subsampled_w2(x, y, subsample=10, repeats=1)[1])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"subsample": 101}, r"subsample must lie in \[1, min\(len\(x\), len\(y\)\)\] = \[1, 100"),
        ({"subsample": 0}, "subsample must be an integer >= 1"),
        ({"repeats": 0}, "repeats must be an integer >= 1"),
    ],
)
def test_subsampled_w2_names_the_bad_parameter_and_range(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        subsampled_w2(torch.zeros(100, 2), torch.zeros(120, 2), **kwargs)
