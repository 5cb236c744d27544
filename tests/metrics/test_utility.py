"""Downstream utility (Cao et al. 2021, App. D.2): classifiers trained on labelled samples, tested
on real data."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import Tensor

from lightning_dpot.metrics.utility import (
    QUICK,
    MLPClassifier,
    UnlabelledSamplesError,
    UtilitySettings,
    downstream_utility,
    train_torch_classifier,
)


@pytest.fixture(scope="module")
def mnist_split(mnist_test_tensors) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Seeded 8,000 / 2,000 split of the shipped MNIST test split (real "training" data)."""
    images, labels = mnist_test_tensors
    order = torch.randperm(images.shape[0], generator=torch.Generator().manual_seed(0))
    train, test = order[:8000], order[8000:]
    return images[train], labels[train], images[test], labels[test]


def test_logreg_on_real_mnist_reaches_the_real_data_order_of_magnitude(mnist_split) -> None:
    x_train, y_train, x_test, y_test = mnist_split
    settings = UtilitySettings(max_train_samples=2000)  # paper LogReg, on a 2,000-sample subset
    result = downstream_utility(x_train, y_train, x_test, y_test, ("logreg",), settings=settings)
    assert set(result) == {"logreg"}
    assert result["logreg"] > 0.85


def test_mlp_and_cnn_in_a_quick_mode_learn_real_mnist(mnist_split) -> None:
    x_train, y_train, x_test, y_test = mnist_split
    settings = replace(QUICK, max_train_samples=1500, max_epochs=3)
    result = downstream_utility(
        x_train, y_train, x_test[:1000], y_test[:1000], ("mlp", "cnn"), settings=settings
    )
    assert result["mlp"] > 0.75 and result["cnn"] > 0.75  # chance is 0.1


def test_unconditional_generator_is_refused_with_a_skip_message(digit_tensors) -> None:
    images, labels = digit_tensors
    with pytest.raises(UnlabelledSamplesError, match="unconditional.*skipped"):
        downstream_utility(images[:100], None, images[100:200], labels[100:200])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"classifiers": ("svm",)}, "classifiers must be a non-empty subset"),
        ({"y": torch.zeros(20, dtype=torch.long)}, "at least 2 distinct classes"),
        ({"x": torch.randn(20, 16), "test_x": torch.randn(5, 16)}, r"\(n, C, H, W\)"),
        ({"y": torch.arange(19) % 2}, "one label per sample"),
    ],
)
def test_utility_names_what_is_wrong_with_its_inputs(kwargs: dict, message: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = kwargs.pop("x", torch.randn(20, 1, 4, 4, generator=g))
    y = kwargs.pop("y", torch.arange(20) % 2)
    test_x = kwargs.pop("test_x", torch.randn(5, 1, 4, 4, generator=g))
    with pytest.raises(ValueError, match=message):
        downstream_utility(x, y, test_x, torch.arange(5) % 2, **kwargs)


def test_settings_refuse_out_of_range_values() -> None:
    with pytest.raises(
        ValueError, match=r"holdout_fraction must lie in the open interval \(0, 1\)"
    ):
        UtilitySettings(holdout_fraction=1.0)
    with pytest.raises(ValueError, match="patience must be an integer >= 1, got 0"):
        UtilitySettings(patience=0)


def test_early_stopping_stops_after_patience_epochs_without_improvement() -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 8, generator=g), torch.randint(0, 2, (200,), generator=g)  # noise
    settings = UtilitySettings(max_epochs=200, patience=2, batch_size=50)
    _, epochs = train_torch_classifier(MLPClassifier(8, 2), x, y, settings, seed=0)
    assert 3 <= epochs < 200


def test_utility_is_seeded_without_touching_the_global_rng() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 1, 4, 4, generator=g)
    y = (x.flatten(1).sum(1) > 0).long()
    settings = UtilitySettings(max_epochs=3, patience=1)
    state = torch.get_rng_state()
    runs = [downstream_utility(x, y, x, y, ("mlp", "cnn"), settings=settings, seed=3) for _ in "ab"]
    assert runs[0] == runs[1]
    assert torch.equal(torch.get_rng_state(), state)
