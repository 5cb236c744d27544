"""Downstream utility: train classifiers on labelled synthetic data, test on the real test split.

Cao et al. 2021, §D.2 ("Classifiers"; see also docs/evaluation.md): a conditional generator's
samples (x̃, ỹ) are used as a training set and the accuracy on the *real* test split is reported
for

- **LogReg**: scikit-learn ``LogisticRegression`` with the L-BFGS solver, ``max_iter = 5000``;
- **MLP**: one hidden layer of 100 units with ReLU, trained with Adam (PyTorch defaults,
  lr = 10⁻³, β = (0.9, 0.999));
- **CNN**: two convolutional hidden layers with 32 and 64 filters, ReLU, dropout p = 0.5 between
  all intermediate layers, trained with Adam;

MLP and CNN hold out 10 % of the training data and stop when the hold-out accuracy has not
improved for 30 consecutive epochs (patience 30); the weights of the best hold-out epoch are
restored before testing. The paper reports the error rate 1 − accuracy.

``FULL`` follows the paper; ``QUICK`` uses fewer samples and epochs so the metric can be
logged during training (its numbers are indicative only and are not the paper's protocol).
Unconditional generators have no labels: ``downstream_utility`` then raises
``UnlabelledSamplesError`` so callers can skip the metric with that message.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from torch import Tensor, nn

from lightning_dpot.checks import check_positive_int

__all__ = [
    "CLASSIFIERS",
    "FULL",
    "QUICK",
    "ConvClassifier",
    "MLPClassifier",
    "UnlabelledSamplesError",
    "UtilitySettings",
    "downstream_utility",
    "seeded_rng",
    "train_torch_classifier",
]

CLASSIFIERS: tuple[str, ...] = ("logreg", "mlp", "cnn")

ArrayLike = Tensor | np.ndarray


class UnlabelledSamplesError(ValueError):
    """The synthetic samples carry no labels (unconditional generator): utility is undefined."""


@dataclass(frozen=True)
class UtilitySettings:
    """How the utility classifiers are trained.

    Attributes:
        max_train_samples: use at most this many synthetic samples (a seeded random subset);
            ``None`` uses all of them (paper: 60,000).
        max_epochs: hard cap on MLP/CNN epochs (the paper has early stopping only).
        patience: epochs without hold-out accuracy improvement before stopping (paper: 30).
        holdout_fraction: share of the training data held out for early stopping (paper: 0.1).
        batch_size: Adam mini-batch size (not stated in the paper).
        logreg_max_iter: L-BFGS iteration cap for LogReg (paper: 5000).
    """

    max_train_samples: int | None = None
    max_epochs: int = 1000
    patience: int = 30
    holdout_fraction: float = 0.1
    batch_size: int = 128
    logreg_max_iter: int = 5000

    def __post_init__(self) -> None:
        if self.max_train_samples is not None:
            check_positive_int("max_train_samples", self.max_train_samples)
        check_positive_int("max_epochs", self.max_epochs)
        check_positive_int("patience", self.patience)
        check_positive_int("batch_size", self.batch_size)
        check_positive_int("logreg_max_iter", self.logreg_max_iter)
        fraction = float(self.holdout_fraction)
        if not math.isfinite(fraction) or not 0.0 < fraction < 1.0:
            raise ValueError(
                f"holdout_fraction must lie in the open interval (0, 1), got {fraction!r}"
            )


#: Cao et al. 2021, §D.2 protocol: all samples, patience 30, LogReg max_iter 5000.
FULL = UtilitySettings()
#: For logging during training: 5,000 samples, ≤ 10 epochs, patience 3.
QUICK = UtilitySettings(max_train_samples=5000, max_epochs=10, patience=3)


class MLPClassifier(nn.Sequential):
    """MLP of Cao et al. 2021, §D.2: x ↦ W₂ ReLU(W₁ vec(x) + b₁) + b₂, one hidden layer of 100
    units."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 100) -> None:
        super().__init__(
            nn.Flatten(),
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )


class ConvClassifier(nn.Sequential):
    """CNN of Cao et al. 2021, §D.2: two 3×3 conv layers (32, 64 filters), ReLU, dropout 0.5
    between layers.

    conv(C→32) → ReLU → maxpool 2 → dropout → conv(32→64) → ReLU → maxpool 2 → dropout →
    linear(64·⌊H/4⌋·⌊W/4⌋ → classes). Works for any ``(C, H, W)`` with H, W ≥ 4.
    """

    def __init__(self, image_shape: Sequence[int], num_classes: int, dropout: float = 0.5) -> None:
        channels, height, width = (int(s) for s in image_shape)
        if height < 4 or width < 4:
            raise ValueError(f"image_shape must have H, W >= 4, got {tuple(image_shape)}")
        super().__init__(
            nn.Conv2d(channels, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(dropout),
            nn.Conv2d(32, 64, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(dropout),
            nn.Flatten(),
            nn.Linear(64 * (height // 4) * (width // 4), num_classes),
        )


@contextlib.contextmanager
def seeded_rng(seed: int, device: torch.device | str = "cpu") -> Iterator[None]:
    """Seed torch's global RNG inside the block (weight init, dropout), restoring it on exit.

    ``torch.random.fork_rng`` saves and restores the CPU (and the given CUDA device's) RNG state,
    so library code can be reproducible without setting a global seed for the caller.
    """
    device = torch.device(device)
    cuda_devices: list[int] = []
    if device.type == "cuda":
        cuda_devices = [torch.cuda.current_device() if device.index is None else device.index]
    with torch.random.fork_rng(devices=cuda_devices):
        torch.default_generator.manual_seed(seed)
        if cuda_devices:
            with torch.cuda.device(cuda_devices[0]):
                torch.cuda.manual_seed(seed)
        yield


@torch.no_grad()
def _accuracy(model: nn.Module, x: Tensor, y: Tensor, batch_size: int) -> float:
    model.eval()
    correct = 0
    for start in range(0, x.shape[0], batch_size * 8):
        logits = model(x[start : start + batch_size * 8])
        correct += int((logits.argmax(1) == y[start : start + batch_size * 8]).sum())
    return correct / x.shape[0]


def train_torch_classifier(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    settings: UtilitySettings,
    seed: int = 0,
) -> tuple[nn.Module, int]:
    """Adam with hold-out early stopping (Cao et al. 2021, §D.2); returns the best model and
    epochs run.

    A fraction ``settings.holdout_fraction`` of (x, y) is held out (seeded permutation); after
    each epoch the hold-out accuracy is measured and training stops once it has not improved for
    ``settings.patience`` consecutive epochs (or after ``settings.max_epochs``). The weights of
    the best hold-out epoch are restored. ``x``, ``y`` and ``model`` must be on one device.
    """
    device = x.device
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(x.shape[0], generator=generator).to(device)
    num_holdout = max(1, round(settings.holdout_fraction * x.shape[0]))
    if num_holdout >= x.shape[0]:
        raise ValueError(
            f"need at least 2 training samples to hold out {settings.holdout_fraction:.0%}, "
            f"got {x.shape[0]}"
        )
    holdout, train = order[:num_holdout], order[num_holdout:]
    x_hold, y_hold, x_train, y_train = x[holdout], y[holdout], x[train], y[train]

    with seeded_rng(seed, device):
        optimizer = torch.optim.Adam(model.parameters())
        loss_fn = nn.CrossEntropyLoss()
        best_accuracy, best_state, since_best, epochs_run = -1.0, None, 0, 0
        for epoch in range(1, settings.max_epochs + 1):
            epochs_run = epoch
            model.train()
            perm = torch.randperm(x_train.shape[0], generator=generator).to(device)
            for start in range(0, perm.shape[0], settings.batch_size):
                batch = perm[start : start + settings.batch_size]
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(x_train[batch]), y_train[batch]).backward()
                optimizer.step()
            accuracy = _accuracy(model, x_hold, y_hold, settings.batch_size)
            if accuracy > best_accuracy:
                best_accuracy, since_best = accuracy, 0
                best_state = copy.deepcopy(model.state_dict())
            else:
                since_best += 1
                if since_best >= settings.patience:
                    break
    assert best_state is not None
    model.load_state_dict(best_state)
    model.eval()
    return model, epochs_run


def _as_tensor(name: str, value: ArrayLike, dtype: torch.dtype) -> Tensor:
    if isinstance(value, Tensor):
        tensor = value.detach().cpu().to(dtype)
    else:
        tensor = torch.as_tensor(np.asarray(value)).to(dtype)
    if tensor.ndim < 1 or tensor.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one sample, got shape {tuple(tensor.shape)}")
    return tensor


def downstream_utility(
    synthetic_x: ArrayLike,
    synthetic_y: ArrayLike | None,
    test_x: ArrayLike,
    test_y: ArrayLike,
    classifiers: Sequence[str] = CLASSIFIERS,
    settings: UtilitySettings | None = None,
    num_classes: int | None = None,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> dict[str, float]:
    """Accuracy on the real test split of classifiers trained on labelled synthetic data.

    Cao et al. 2021, §D.2 ("train on synthetic, test on real"): for each classifier f trained on
    {(x̃ᵢ, ỹᵢ)}, report acc(f) = (1/N_test) Σⱼ 1[f(xⱼ) = yⱼ] on the real test split
    (the paper's error rate is 1 − acc).

    Args:
        synthetic_x: generated samples ``(n, C, H, W)`` (or ``(n, d)`` without ``"cnn"``), on the
            same scale as ``test_x`` (e.g. both in [−1, 1]).
        synthetic_y: integer class labels ``(n,)`` of the generated samples. ``None`` means the
            generator is unconditional; ``UnlabelledSamplesError`` is raised.
        test_x: real test samples, same per-sample shape as ``synthetic_x``.
        test_y: real test labels ``(n_test,)``.
        classifiers: any of ``"logreg"``, ``"mlp"``, ``"cnn"``.
        settings: training settings, ``FULL`` (the paper's protocol, the default) or
            ``QUICK``.
        num_classes: number of classes; default ``max(label) + 1`` over both label sets.
        seed: seeds the subset, hold-out split, shuffling, weight init, dropout and LogReg
            (through local generators; the caller's global RNG state is left unchanged).
        device: device for the MLP/CNN (LogReg runs on CPU).

    Returns:
        ``{name: accuracy in [0, 1]}`` for each requested classifier.
    """
    if synthetic_y is None:
        raise UnlabelledSamplesError(
            "downstream utility needs labelled synthetic samples (a class-conditional "
            "generator); got synthetic_y=None from an unconditional generator, so the utility "
            "metric is skipped"
        )
    unknown = [name for name in classifiers if name not in CLASSIFIERS]
    if unknown or not classifiers:
        raise ValueError(
            f"classifiers must be a non-empty subset of {CLASSIFIERS}, got {tuple(classifiers)!r}"
        )
    if settings is None:
        settings = FULL
    x_syn = _as_tensor("synthetic_x", synthetic_x, torch.float32)
    y_syn = _as_tensor("synthetic_y", synthetic_y, torch.int64).reshape(-1)
    x_test = _as_tensor("test_x", test_x, torch.float32)
    y_test = _as_tensor("test_y", test_y, torch.int64).reshape(-1)
    if y_syn.shape[0] != x_syn.shape[0]:
        raise ValueError(
            f"synthetic_y must have one label per sample: {x_syn.shape[0]} samples, "
            f"{y_syn.shape[0]} labels"
        )
    if y_test.shape[0] != x_test.shape[0]:
        raise ValueError(
            f"test_y must have one label per sample: {x_test.shape[0]} samples, "
            f"{y_test.shape[0]} labels"
        )
    if x_syn.shape[1:] != x_test.shape[1:]:
        raise ValueError(
            f"synthetic_x and test_x must have the same per-sample shape, got "
            f"{tuple(x_syn.shape[1:])} and {tuple(x_test.shape[1:])}"
        )
    if "cnn" in classifiers and x_syn.ndim != 4:
        raise ValueError(
            f"the CNN needs images shaped (n, C, H, W); got synthetic_x of shape "
            f"{tuple(x_syn.shape)} (drop 'cnn' from classifiers for flat data)"
        )
    if min(int(y_syn.min()), int(y_test.min())) < 0:
        raise ValueError("labels must be integers >= 0")
    if num_classes is None:
        num_classes = max(int(y_syn.max()), int(y_test.max())) + 1
    num_classes = check_positive_int("num_classes", num_classes)
    if max(int(y_syn.max()), int(y_test.max())) >= num_classes:
        raise ValueError(f"labels must lie in [0, num_classes - 1] = [0, {num_classes - 1}]")
    if int(torch.unique(y_syn).numel()) < 2:
        raise ValueError(
            f"synthetic_y must contain at least 2 distinct classes to train a classifier, "
            f"got only {torch.unique(y_syn).tolist()}"
        )

    generator = torch.Generator().manual_seed(seed)
    if settings.max_train_samples is not None and settings.max_train_samples < x_syn.shape[0]:
        keep = torch.randperm(x_syn.shape[0], generator=generator)[: settings.max_train_samples]
        x_syn, y_syn = x_syn[keep], y_syn[keep]

    device = torch.device(device)
    accuracies: dict[str, float] = {}
    for name in classifiers:
        if name == "logreg":
            model = LogisticRegression(
                solver="lbfgs", max_iter=settings.logreg_max_iter, random_state=seed
            )
            model.fit(x_syn.reshape(x_syn.shape[0], -1).numpy(), y_syn.numpy())
            predicted = model.predict(x_test.reshape(x_test.shape[0], -1).numpy())
            accuracies[name] = float((predicted == y_test.numpy()).mean())
            continue
        with seeded_rng(seed, device):
            if name == "mlp":
                net: nn.Module = MLPClassifier(math.prod(x_syn.shape[1:]), num_classes)
            else:
                net = ConvClassifier(x_syn.shape[1:], num_classes)
        net = net.to(device)
        net, _ = train_torch_classifier(
            net, x_syn.to(device), y_syn.to(device), settings, seed=seed
        )
        accuracies[name] = _accuracy(net, x_test.to(device), y_test.to(device), settings.batch_size)
    return accuracies
