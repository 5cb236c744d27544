r"""Fréchet distances between generated and real images: Inception FID and a classifier-feature FD.

Both compare Gaussian fits N(μ_r, Σ_r), N(μ_g, Σ_g) of feature vectors φ(x) of real and generated
images (Heusel et al. 2017, "GANs trained by a two time-scale update rule…", Eq. 6):

.. math::

    d^2 = \lVert μ_r − μ_g \rVert_2^2 + \operatorname{Tr}\bigl(Σ_r + Σ_g − 2 (Σ_r Σ_g)^{1/2}\bigr),

with Tr (Σ_r Σ_g)^{1/2} = Σ_k √λ_k(Σ_r Σ_g) (the product of two PSD matrices has real, ≥ 0
eigenvalues). Both are torchmetrics' ``FrechetInceptionDistance``: it accumulates, in float64,
sums S = Σᵢ φᵢ, Q = Σᵢ φᵢ φᵢᵀ and counts n, declared with ``dist_reduce_fx="sum"``, so the value
under DDP is the single-process value on the union of the shards; μ = S/n,
Σ = (Q − n μ μᵀ)/(n − 1), and the trace term from ``torch.linalg.eigvals`` (no scipy ``sqrtm``).

- ``InceptionFID`` is **FID** proper (Cao et al. 2021, §D.1): the standard torch-fidelity
  InceptionV3 weights (``weights-inception-2015-12-05-6726825d.pth``, pool3 features, 2048-d),
  grayscale repeated to 3 channels, inputs in [−1, 1] mapped to [0, 1]. Offline it needs the
  weights file, either in the torch hub cache or at ``feature_extractor_weights_path``; without
  it, construction fails.
- ``ClassifierFrechetDistance`` is the offline alternative: the same metric with
  ``feature=`` the penultimate features of a small CNN (``FeatureClassifier``) trained on
  real public/test data. Its values are not comparable with FID and are never reported as FID
  (log key ``"fd_classifier"``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torchmetrics.image.fid import FrechetInceptionDistance
from torchmetrics.utilities.imports import _TORCH_FIDELITY_AVAILABLE
from typing_extensions import override

from lightning_dpot.checks import check_positive_int
from lightning_dpot.metrics.utility import UtilitySettings, seeded_rng, train_torch_classifier

__all__ = [
    "INCEPTION_WEIGHTS_FILENAME",
    "INCEPTION_WEIGHTS_URL",
    "ClassifierFrechetDistance",
    "FeatureClassifier",
    "InceptionFID",
    "classifier_weights_sha256",
    "default_inception_weights_path",
    "frechet_distance",
    "load_or_train_feature_classifier",
    "resolve_inception_weights",
    "to_inception_input",
    "train_feature_classifier",
]

#: File name torch-fidelity (and hence torchmetrics) downloads the FID InceptionV3 weights to.
INCEPTION_WEIGHTS_FILENAME = "weights-inception-2015-12-05-6726825d.pth"
INCEPTION_WEIGHTS_URL = f"https://github.com/toshas/torch-fidelity/releases/download/v0.2.0/{INCEPTION_WEIGHTS_FILENAME}"
_CLASSIFIER_FILE_VERSION = 1


# --------------------------------------------------------------------------------------------
# The distance itself
# --------------------------------------------------------------------------------------------


def frechet_distance(mu1: Tensor, sigma1: Tensor, mu2: Tensor, sigma2: Tensor) -> Tensor:
    r"""Squared Fréchet (W₂) distance between N(μ₁, Σ₁) and N(μ₂, Σ₂), for statistics at hand.

    d² = ‖μ₁ − μ₂‖² + Tr Σ₁ + Tr Σ₂ − 2 Σ_k √λ_k(Σ₁ Σ₂)  (Heusel et al. 2017, Eq. 6), in float64,
    as torchmetrics' ``FrechetInceptionDistance.compute`` evaluates it. The eigenvalues of Σ₁Σ₂
    are real and ≥ 0 in exact arithmetic; round-off imaginary parts and tiny negative values are
    discarded by taking the real part of the complex square root.
    """
    mu1, mu2, sigma1, sigma2 = (t.double() for t in (mu1, mu2, sigma1, sigma2))
    mean_term = (mu1 - mu2).square().sum()
    trace_sqrt = torch.linalg.eigvals(sigma1 @ sigma2).sqrt().real.sum()
    return mean_term + sigma1.trace() + sigma2.trace() - 2.0 * trace_sqrt


# --------------------------------------------------------------------------------------------
# FID on Inception features (torchmetrics)
# --------------------------------------------------------------------------------------------


def default_inception_weights_path() -> Path:
    """Where torch-fidelity's download lands: ``<torch hub dir>/checkpoints/<file>``.

    The hub dir is ``$TORCH_HOME/hub`` (default ``~/.cache/torch/hub``), see
    ``torch.hub.get_dir``.
    """
    return Path(torch.hub.get_dir()) / "checkpoints" / INCEPTION_WEIGHTS_FILENAME


def _how_to_provide(cache_path: Path) -> str:
    return (
        f"FID needs the standard torch-fidelity InceptionV3 weights file "
        f"'{INCEPTION_WEIGHTS_FILENAME}' (from {INCEPTION_WEIGHTS_URL}). Provide it offline by "
        f"passing feature_extractor_weights_path='/path/to/{INCEPTION_WEIGHTS_FILENAME}' or by "
        f"copying the file to the torch hub cache at {cache_path}; online, pass "
        f"allow_download=True. Without the weights use ClassifierFrechetDistance (log key "
        f"'fd_classifier'), which is not FID."
    )


def resolve_inception_weights(
    feature_extractor_weights_path: str | os.PathLike[str] | None = None,
    allow_download: bool = False,
) -> str | None:
    """Local path of the FID Inception weights, or ``None`` to let torch-fidelity download them.

    Order: an explicit ``feature_extractor_weights_path`` (must be an existing file), then the
    torch hub cache (``default_inception_weights_path``), then download if
    ``allow_download``. Otherwise raises ``FileNotFoundError`` naming
    ``feature_extractor_weights_path`` and the expected file.
    """
    cache_path = default_inception_weights_path()
    if feature_extractor_weights_path is not None:
        path = Path(feature_extractor_weights_path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"feature_extractor_weights_path={str(feature_extractor_weights_path)!r} is not "
                f"an existing file. " + _how_to_provide(cache_path)
            )
        return str(path)
    if cache_path.is_file():
        return str(cache_path)
    if allow_download:
        return None
    raise FileNotFoundError(
        f"Inception weights not found: feature_extractor_weights_path=None and no cached file at "
        f"{cache_path}. " + _how_to_provide(cache_path)
    )


def to_inception_input(images: Tensor, data_range: Sequence[float] = (-1.0, 1.0)) -> Tensor:
    """``(N, C, H, W)`` images in ``data_range`` → ``(N, 3, H, W)`` floats in [0, 1].

    x ↦ clamp((x − low)/(high − low), 0, 1); one channel is repeated to three (Cao et al. 2021,
    §D.1: "we repeat the channel dimension 3 times"). ``(N, H, W)`` is read as one channel.
    """
    low, high = (float(v) for v in data_range)
    if not high > low:
        raise ValueError(f"data_range must be (low, high) with high > low, got {tuple(data_range)}")
    if images.ndim == 3:
        images = images.unsqueeze(1)
    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(
            f"images must be shaped (N, C, H, W) with C in (1, 3), got {tuple(images.shape)}"
        )
    images = ((images.float() - low) / (high - low)).clamp(0.0, 1.0)
    return images.expand(-1, 3, -1, -1) if images.shape[1] == 1 else images


class InceptionFID(FrechetInceptionDistance):
    """FID: torchmetrics ``FrechetInceptionDistance`` set up for this project.

    - Weights: ``feature_extractor_weights_path`` or the torch hub cache (see
      ``resolve_inception_weights``); missing weights fail here, at construction, with a
      message saying how to provide them (never a silent download unless ``allow_download``).
    - Inputs: ``update(images, real)`` takes ``(N, 1 or 3, H, W)`` images in ``data_range``
      (default [−1, 1], the generators' tanh range); they are mapped to [0, 1], repeated to
      3 channels and passed with ``normalize=True`` (torchmetrics then quantizes to uint8 and
      torch-fidelity resizes to 299×299).
    - ``reset_real_features=False``: real statistics are accumulated once (e.g. the 10k test
      split) and survive ``reset()``, so each evaluation only adds generated images.

    Paper protocol (Cao et al. 2021, §D.1): 60,000 generated images against the full test split.
    Log key: ``"fid"``.
    """

    log_key = "fid"

    def __init__(
        self,
        feature_extractor_weights_path: str | os.PathLike[str] | None = None,
        feature: int = 2048,
        data_range: Sequence[float] = (-1.0, 1.0),
        reset_real_features: bool = False,
        allow_download: bool = False,
        **kwargs: Any,
    ) -> None:
        if not _TORCH_FIDELITY_AVAILABLE:
            raise ModuleNotFoundError(
                "InceptionFID needs the torch-fidelity package for the FID InceptionV3 network: "
                "pip install torch-fidelity (or use ClassifierFrechetDistance, which is not FID)"
            )
        weights = resolve_inception_weights(feature_extractor_weights_path, allow_download)
        try:
            super().__init__(
                feature=feature,
                reset_real_features=reset_real_features,
                normalize=True,
                feature_extractor_weights_path=weights,
                **kwargs,
            )
        except OSError as error:  # failed download (URLError is an OSError)
            raise FileNotFoundError(
                f"could not download the Inception weights ({error}). "
                + _how_to_provide(default_inception_weights_path())
            ) from error
        low, high = (float(v) for v in data_range)
        if not high > low:
            raise ValueError(
                f"data_range must be (low, high) with high > low, got {tuple(data_range)}"
            )
        self.data_range = (low, high)

    @override
    def update(self, imgs: Tensor, real: bool) -> None:  # type: ignore[override]
        """Add a batch of real (``real=True``) or generated images in ``data_range``."""
        super().update(to_inception_input(imgs, self.data_range), real)


# --------------------------------------------------------------------------------------------
# Fréchet distance on a small classifier's features (offline alternative, not FID)
# --------------------------------------------------------------------------------------------


class FeatureClassifier(nn.Module):
    """Small CNN whose penultimate layer is the feature map φ of ``ClassifierFrechetDistance``.

    ``features``: conv 3×3 (C→32) → ReLU → maxpool 2 → conv 3×3 (32→64) → ReLU → maxpool 2 →
    linear (64·⌊H/4⌋·⌊W/4⌋ → ``num_features``) → ReLU;  ``head``: dropout 0.5 → linear → logits.
    Dropout sits only in the head, so φ(x) is deterministic in train and eval mode.
    """

    def __init__(
        self,
        image_shape: Sequence[int] = (1, 28, 28),
        num_classes: int = 10,
        num_features: int = 128,
    ) -> None:
        super().__init__()
        channels, height, width = (int(s) for s in image_shape)
        if height < 4 or width < 4:
            raise ValueError(f"image_shape must have H, W >= 4, got {tuple(image_shape)}")
        self.image_shape = (channels, height, width)
        self.num_classes = check_positive_int("num_classes", num_classes)
        self.num_features = check_positive_int("num_features", num_features)
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * (height // 4) * (width // 4), num_features),
            nn.ReLU(),
        )
        self.head = nn.Sequential(nn.Dropout(0.5), nn.Linear(num_features, num_classes))

    def forward(self, x: Tensor) -> Tensor:
        """Class logits of ``(N, C, H, W)`` images."""
        return self.head(self.features(x))


def train_feature_classifier(
    images: Tensor,
    labels: Tensor,
    epochs: int = 5,
    num_features: int = 128,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> FeatureClassifier:
    """Train ``FeatureClassifier`` on real labelled images (e.g. the public test split).

    Adam with 10 % hold-out early stopping (patience 2) for at most ``epochs`` epochs, via
    ``lightning_dpot.metrics.utility.train_torch_classifier``. ``images`` must be on the
    scale later passed to ``ClassifierFrechetDistance`` (project convention [−1, 1]).
    """
    epochs = check_positive_int("epochs", epochs)
    if images.ndim != 4:
        raise ValueError(f"images must be shaped (N, C, H, W), got {tuple(images.shape)}")
    labels = labels.reshape(-1).long()
    device = torch.device(device)
    with seeded_rng(seed, device):
        model = FeatureClassifier(images.shape[1:], int(labels.max()) + 1, num_features)
    settings = UtilitySettings(max_epochs=epochs, patience=2)
    model, _ = train_torch_classifier(
        model.to(device), images.float().to(device), labels.to(device), settings, seed=seed
    )
    return model.cpu().eval()


def load_or_train_feature_classifier(
    path: str | os.PathLike[str],
    images: Tensor | None = None,
    labels: Tensor | None = None,
    **train_kwargs: Any,
) -> FeatureClassifier:
    """Load the cached feature classifier from ``path``, training and saving it if absent.

    The file holds the architecture arguments and the ``state_dict``. When ``path`` does not
    exist, ``images``/``labels`` (real public data) are required; the classifier is trained with
    ``train_feature_classifier`` (``train_kwargs`` passed on) and written atomically.
    """
    path = Path(path).expanduser()
    if path.is_file():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if saved.get("version") != _CLASSIFIER_FILE_VERSION:
            raise ValueError(
                f"{path} is not a feature classifier file of version {_CLASSIFIER_FILE_VERSION}; "
                f"delete it to retrain"
            )
        model = FeatureClassifier(saved["image_shape"], saved["num_classes"], saved["num_features"])
        model.load_state_dict(saved["state_dict"])
        return model.eval()
    if images is None or labels is None:
        raise FileNotFoundError(
            f"no feature classifier at path={str(path)!r}; pass real labelled images and labels "
            f"to train it on demand"
        )
    model = train_feature_classifier(images, labels, **train_kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "version": _CLASSIFIER_FILE_VERSION,
        "image_shape": list(model.image_shape),
        "num_classes": model.num_classes,
        "num_features": model.num_features,
        "state_dict": model.state_dict(),
    }
    handle, tmp_name = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(handle)
    torch.save(payload, tmp_name)
    os.replace(tmp_name, path)
    return model


def classifier_weights_sha256(path: str | os.PathLike[str]) -> str:
    """The first 16 hex digits of the SHA-256 of a feature classifier file's weights (names,
    shapes and values, in order): two classifier FDs are comparable only when it agrees."""
    saved = torch.load(Path(path).expanduser(), map_location="cpu", weights_only=True)
    digest = hashlib.sha256()
    for name, tensor in saved["state_dict"].items():
        digest.update(f"{name} {tuple(tensor.shape)} {tensor.dtype}".encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class _FeatureMap(nn.Module):
    """φ as torchmetrics' ``FrechetInceptionDistance(feature=...)`` takes a custom extractor: it
    declares ``num_features`` (no probe forward on 299×299 RGB) and returns ``(N, num_features)``.
    """

    def __init__(self, net: nn.Module, num_features: int) -> None:
        super().__init__()
        self.net = net
        self.num_features = num_features

    @override
    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).reshape(x.shape[0], -1)


class ClassifierFrechetDistance(FrechetInceptionDistance):
    r"""Fréchet distance on a classifier's penultimate features — an offline stand-in, **not FID**.

    torchmetrics' ``FrechetInceptionDistance`` with ``feature=`` the map φ =
    ``feature_extractor`` (by default the penultimate layer of ``FeatureClassifier``,
    trained on the real test/public split): d² = ‖μ_r − μ_g‖² + Tr(Σ_r + Σ_g − 2(Σ_r Σ_g)^{1/2})
    between the Gaussian fits of φ on real and generated images, from float64 sums declared with
    ``dist_reduce_fx="sum"`` (the value under DDP equals the single-process value on the union of
    the shards). Images go to φ as given (same scale as the classifier's training data, project
    convention [−1, 1]); nothing is quantized. With ``reset_real_features=False`` the real
    statistics survive ``reset()``. The feature extractor is kept in eval mode and receives no
    gradients.

    Values depend on the feature network and are comparable only between runs that share its
    weights file. Log key: ``"fd_classifier"``.

    Args:
        feature_extractor: φ, mapping ``(N, C, H, W)`` images to ``N`` feature vectors.
        num_features: length of φ's feature vectors (> 0).
        reset_real_features: whether ``reset()`` also clears the real statistics.
        kwargs: passed on to torchmetrics' ``Metric``.

    Example (a stand-in feature map; in use ``from_classifier_file`` loads the trained
    classifier)::

        >>> import torch
        >>> from torch import nn
        >>> _ = torch.manual_seed(0)
        >>> features = nn.Sequential(nn.Flatten(), nn.Linear(64, 4))
        >>> metric = ClassifierFrechetDistance(features, num_features=4)
        >>> images = torch.rand(128, 1, 8, 8) * 2 - 1
        >>> metric.update(images[:64], real=True)
        >>> metric.update(images[64:], real=False)  # the same law: a small distance
        >>> metric.update(-torch.ones(64, 1, 8, 8) + 0.01 * torch.rand(64, 1, 8, 8), real=False)
        >>> 0 < float(metric.compute()) < 1
        True
    """

    log_key = "fd_classifier"

    def __init__(
        self,
        feature_extractor: nn.Module,
        num_features: int,
        reset_real_features: bool = False,
        **kwargs: Any,
    ) -> None:
        num_features = check_positive_int("num_features", num_features)
        feature_map = _FeatureMap(feature_extractor.eval().requires_grad_(False), num_features)
        super().__init__(
            feature=feature_map, reset_real_features=bool(reset_real_features), **kwargs
        )

    @property
    def feature_extractor(self) -> nn.Module:
        """φ, the network the features come from."""
        return self.inception.net

    @classmethod
    def from_classifier_file(
        cls,
        path: str | os.PathLike[str],
        images: Tensor | None = None,
        labels: Tensor | None = None,
        train_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> ClassifierFrechetDistance:
        """Metric on the features of the classifier cached at ``path`` (trained if absent)."""
        classifier = load_or_train_feature_classifier(path, images, labels, **(train_kwargs or {}))
        return cls(classifier.features, classifier.num_features, **kwargs)

    @override
    def train(self, mode: bool = True) -> ClassifierFrechetDistance:
        """Keep the feature extractor in eval mode whatever the parent module's mode."""
        super().train(mode)
        self.feature_extractor.eval()
        return self

    @override
    def compute(self) -> Tensor:
        """d² between the Gaussian fits of the real and generated features (float32 scalar)."""
        if self.real_features_num_samples < 2 or self.fake_features_num_samples < 2:
            raise RuntimeError(
                "ClassifierFrechetDistance needs at least 2 real and 2 generated samples, got "
                f"{int(self.real_features_num_samples)} and {int(self.fake_features_num_samples)}"
            )
        return super().compute()
