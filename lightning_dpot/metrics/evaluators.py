r"""One evaluator per metric, shared by the evaluation callbacks, ``dpot evaluate`` and
``dpot compare`` (see docs/evaluation.md).

An evaluator holds a metric's settings and turns samples into a result ``dict``; it knows
nothing of Lightning. The callbacks add only the schedule (every n epochs, at the end, DDP
shares); the commands add only the sampling. The reference is always the **raw held-out split**
(``held_out_split``), never seen in training.

* ``FrechetEvaluator`` — d² = ‖μ_r − μ_g‖² + Tr(Σ_r + Σ_g − 2(Σ_rΣ_g)^{1/2}) between
  Gaussian fits of image features (Heusel et al. 2017, Eq. 6), named for its extractor: ``fid``
  with InceptionV3 (Cao et al. 2021, §D.1), ``fd_classifier`` with the project classifier (an
  offline stand-in, never called FID).
* ``UtilityEvaluator`` — accuracy on the real held-out split of LogReg / MLP / CNN trained
  on labelled synthetic samples, early-stopped on a synthetic hold-out only (Cao et al. 2021,
  §D.2; DPImageBench's rule that the sensitive test split never selects a model).
* ``W2Evaluator`` — exact W₂ between m-point subsamples of generated and held-out records,
  mean and standard error over R repeats (Reshetova et al. 2024, §IV-C, m = 200).
* ``ManifoldEvaluator`` — mean distance to a known planar curve and the share of the
  curve covered (Reshetova et al. 2024, Figs. 1–2).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor

from lightning_dpot.checks import check_positive_int
from lightning_dpot.data.manifolds import CurveSource
from lightning_dpot.metrics.fid import (
    ClassifierFrechetDistance,
    InceptionFID,
    classifier_weights_sha256,
)
from lightning_dpot.metrics.utility import CLASSIFIERS, UtilitySettings, downstream_utility
from lightning_dpot.metrics.w2 import subsampled_w2

__all__ = [
    "FeatureExtractor",
    "FrechetEvaluator",
    "ManifoldEvaluator",
    "UtilityEvaluator",
    "W2Evaluator",
    "default_classifier_path",
    "rank_share",
]

FeatureExtractor = Literal["inception", "classifier"]


def rank_share(total: int, rank: int, world_size: int) -> int:
    """Samples rank ``rank`` of ``world_size`` generates: ⌊N/W⌋ + [rank < N mod W] (sums to N)."""
    return total // world_size + int(rank < total % world_size)


def default_classifier_path(
    reference: Tensor, cache_dir: str | Path = ".dpot_cache", epochs: int = 5
) -> Path:
    """``<cache_dir>/feature_classifier-<sha256 of the reference split>-e<epochs>.pt``: one
    feature classifier per real split and training length, so every run evaluated against that
    split shares its weights (classifier-FD values are comparable only under the same
    weights)."""
    from lightning_dpot.data.release import tensor_sha256

    digest = tensor_sha256(reference.float())[:16]
    return Path(cache_dir) / f"feature_classifier-{digest}-e{epochs}.pt"


class FrechetEvaluator:
    """FID (Inception features) or the classifier-feature Fréchet distance.

    The real side is added once (``set_reference``) and kept; each ``score`` resets the
    generated side only. Under DDP every rank adds its shard of the reference and scores its
    share of the samples: the metric states are sums, so the value equals the single-process
    value on the union.

    Args:
        feature_extractor: ``"inception"`` (FID, torch-fidelity InceptionV3 weights; key
            ``fid``) or ``"classifier"`` (the penultimate features of
            ``FeatureClassifier``; key ``fd_classifier``).
        weights_path: local InceptionV3 weights (offline FID). Checked at construction.
        classifier_path: cached feature classifier, trained on the held-out split and saved
            there if absent (default ``default_classifier_path`` in ``cache_dir``).
        classifier_epochs: training epochs of that classifier.
        batch_size: images per metric update.
        data_range: value range of the images (project convention [−1, 1]).
    """

    def __init__(
        self,
        feature_extractor: FeatureExtractor = "inception",
        weights_path: str | None = None,
        classifier_path: str | None = None,
        classifier_epochs: int = 5,
        batch_size: int = 500,
        data_range: tuple[float, float] = (-1.0, 1.0),
    ) -> None:
        if feature_extractor not in ("inception", "classifier"):
            raise ValueError(
                f"feature_extractor must be 'inception' or 'classifier', got {feature_extractor!r}"
            )
        self.feature_extractor = feature_extractor
        self.weights_path = weights_path
        self.classifier_path = classifier_path
        self.classifier_epochs = check_positive_int("classifier_epochs", classifier_epochs)
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.data_range = (float(data_range[0]), float(data_range[1]))
        self.metric: InceptionFID | ClassifierFrechetDistance | None = None
        self.classifier_sha256: str | None = None
        self.num_real = 0
        if feature_extractor == "inception":  # fail now, not after training, without weights
            self.metric = InceptionFID(weights_path, data_range=self.data_range)

    @property
    def key(self) -> str:
        return "fid" if self.feature_extractor == "inception" else "fd_classifier"

    def describe(self) -> dict:
        if self.feature_extractor == "inception":
            extractor = (
                "InceptionV3 pool3 (2048-d), torch-fidelity FID weights "
                f"({self.weights_path or 'torch hub cache'})"
            )
        else:
            extractor = (
                f"FeatureClassifier penultimate layer, weights {self.classifier_path} "
                "(trained on the raw held-out split; not FID)"
            )
        described = {
            "metric": self.key,
            "feature_extractor": extractor,
            "num_real": self.num_real,
            "real_split": "raw held-out split",
        }
        if self.classifier_sha256 is not None:
            described["features_sha256"] = self.classifier_sha256
        return described

    def build_classifier(
        self, reference: Tensor, labels: Tensor | None, cache_dir: str | Path = ".dpot_cache"
    ) -> None:
        """Load (or train on the held-out split and cache) the feature classifier."""
        if self.metric is not None:
            return
        if self.classifier_path is None:
            path = default_classifier_path(reference, cache_dir, self.classifier_epochs)
            self.classifier_path = str(path)
        path = Path(self.classifier_path)
        if not path.is_file() and labels is None:
            raise ValueError(
                f"classifier_path={self.classifier_path!r} does not exist and the held-out split "
                "has no labels to train the feature classifier on; give a trained classifier file"
            )
        self.metric = ClassifierFrechetDistance.from_classifier_file(
            path, reference, labels, train_kwargs={"epochs": self.classifier_epochs, "seed": 0}
        )
        self.classifier_sha256 = classifier_weights_sha256(path)

    def set_reference(
        self,
        reference: Tensor,
        labels: Tensor | None = None,
        *,
        cache_dir: str | Path = ".dpot_cache",
        device: torch.device | str = "cpu",
        rank: int = 0,
        world_size: int = 1,
        barrier: Callable[[], None] | None = None,
    ) -> None:
        """Add this rank's shard ``reference[rank::world_size]`` as the real side (once).

        The classifier is trained by rank 0 first (the others wait at ``barrier`` and then load
        the cached file), so all ranks share its weights."""
        if self.num_real:
            return
        if self.metric is None and world_size > 1:
            if rank == 0:
                self.build_classifier(reference, labels, cache_dir)
            if barrier is not None:
                barrier()
        self.build_classifier(reference, labels, cache_dir)
        assert self.metric is not None
        self.metric = self.metric.to(device)
        shard = reference[rank::world_size].float()
        for start in range(0, shard.shape[0], self.batch_size):
            self.metric.update(shard[start : start + self.batch_size].to(device), real=True)
        self.num_real = int(reference.shape[0])

    def score(self, fake: Tensor) -> dict[str, float]:
        """``{key: d²}`` of ``fake`` (this rank's share) against the reference (synced)."""
        if self.metric is None or not self.num_real:
            raise RuntimeError("call set_reference() before score()")
        self.metric.reset()  # generated side only: the real statistics are kept
        device = self.metric.device
        fake = fake.float()
        for start in range(0, fake.shape[0], self.batch_size):
            self.metric.update(fake[start : start + self.batch_size].to(device), real=False)
        return {self.key: float(self.metric.compute())}


class UtilityEvaluator:
    """Train-on-synthetic, test-on-real accuracy (``downstream_utility``). Raises
    ``UnlabelledSamplesError`` for samples without labels (unconditional generators).

    Args:
        classifiers: any of ``"logreg"``, ``"mlp"``, ``"cnn"``.
        seed: seeds the classifiers' training (not the samples).
        device: device of the MLP / CNN.
    """

    def __init__(
        self,
        classifiers: Sequence[str] = CLASSIFIERS,
        seed: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        unknown = [c for c in classifiers if c not in CLASSIFIERS]
        if unknown or not classifiers:
            raise ValueError(
                f"classifiers must be a non-empty subset of {CLASSIFIERS}, got {tuple(classifiers)}"
            )
        self.classifiers = tuple(classifiers)
        self.seed = int(seed)
        self.device = device

    def describe(self) -> dict:
        return {
            "metric": "downstream utility (accuracy on the raw held-out split)",
            "classifiers": list(self.classifiers),
            "model_selection": "early stopping on a held-out share of the synthetic data only",
        }

    def score(
        self,
        x: Tensor,
        y: Tensor | None,
        test_x: Tensor,
        test_y: Tensor,
        settings: UtilitySettings,
    ) -> dict[str, float]:
        """``{classifier: accuracy}`` on ``(test_x, test_y)``."""
        return downstream_utility(
            x,
            y,
            test_x,
            test_y,
            classifiers=self.classifiers,
            settings=settings,
            seed=self.seed,
            device=self.device,
        )


class W2Evaluator:
    """Exact W₂ on subsamples (``subsampled_w2``): for
    r = 1..R, w_r = W₂(μ_{G[I_r]}, μ_{X[J_r]}) with |I_r| = |J_r| = m; mean and s/√R. Records
    are flattened (pixel units for images).

    Args:
        subsample: m (Reshetova et al. 2024: 200); capped at the smaller sample count.
        repeats: R.
        seed: seed of the subsample draws.
    """

    def __init__(self, subsample: int = 200, repeats: int = 10, seed: int = 0) -> None:
        self.subsample = check_positive_int("subsample", subsample)
        self.repeats = check_positive_int("repeats", repeats)
        self.seed = int(seed)

    def describe(self) -> dict:
        return {
            "metric": "exact W2 to the raw held-out split on subsamples (mean, stderr)",
            "subsample": self.subsample,
            "repeats": self.repeats,
        }

    def score(self, fake: Tensor, reference: Tensor) -> dict[str, float]:
        m = min(self.subsample, fake.shape[0], reference.shape[0])
        generator = torch.Generator().manual_seed(self.seed)
        mean, stderr = subsampled_w2(fake, reference, m, self.repeats, generator)
        return {"w2": mean, "w2_stderr": stderr, "w2_subsample": m}


class ManifoldEvaluator:
    """Distance of generated points to a known planar curve, and arc coverage
    (Reshetova et al. 2024, Figs. 1–2): ``manifold_error`` = mean dist(x, support);
    ``arc_coverage`` = ``coverage`` (share of 18
    equal arc pieces holding at least a quarter of the uniform share of the points within 0.25 of
    the curve)."""

    def __init__(self, source: CurveSource) -> None:
        if not isinstance(source, CurveSource):
            raise TypeError(
                "ManifoldEvaluator needs a curve source with a known support (HalfCircle, "
                f"Ellipse, Rectangle), got {type(source).__name__}"
            )
        self.source = source

    def score(self, samples: Tensor) -> dict[str, float]:
        return {
            "manifold_error": float(self.source.distance_to_support(samples).mean()),
            "arc_coverage": self.source.coverage(samples),
        }
