"""Which metrics to compute and how, decided in one place for ``dpot evaluate``, ``dpot compare``
and the evaluation callbacks.

A ``MetricSelection`` maps metric names to the options of their evaluators
(``lightning_dpot.metrics.evaluators``):

* ``frechet`` — FID (``feature_extractor: inception``, the standard InceptionV3 weights) or the
  classifier-feature Fréchet distance (``classifier``, reported as ``fd_classifier``, never as
  FID); ``dpot evaluate`` also accepts the name ``fid``. With ``split_reference`` the feature
  classifier is trained on one half of the held-out split and the other half is the reference,
  so the features are never fitted to the images they are compared with;
* ``utility`` — accuracy on the raw held-out split of classifiers trained on labelled samples
  (Cao et al. 2021, App. D.2), ``mode: quick | full``;
* ``w2`` — exact W₂ to the raw held-out split on subsamples (Reshetova et al. 2024, §IV-C);
* ``manifold`` — distance to a planar curve and arc coverage (curve sources only).

``MetricSelection.score`` scores given samples against the raw held-out split and returns
one section per metric; callers only format the sections.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_dpot.data.manifolds import CurveSource
from lightning_dpot.metrics.evaluators import (
    FrechetEvaluator,
    ManifoldEvaluator,
    UtilityEvaluator,
    W2Evaluator,
)
from lightning_dpot.metrics.utility import FULL, QUICK, UnlabelledSamplesError

METRICS = ("frechet", "utility", "w2", "manifold")
ALIASES = {"fid": "frechet"}
OPTIONS: dict[str, tuple[str, ...]] = {
    "frechet": (
        "feature_extractor",
        "weights_path",
        "classifier_path",
        "classifier_epochs",
        "batch_size",
        "data_range",
        "split_reference",
    ),
    "utility": ("mode", "classifiers"),
    "w2": ("subsample", "repeats"),
    "manifold": (),
}
UTILITY_MODES = ("quick", "full")


@dataclass(frozen=True)
class MetricSelection:
    """The metrics to compute, each with its evaluator's options (module docstring).

    Example::

        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> selection = MetricSelection.parse({"w2": {"subsample": 100, "repeats": 2}})
        >>> samples, reference = torch.randn(300, 2), torch.randn(300, 2) + 3.0
        >>> sections = selection.score(samples, None, reference, None)
        >>> 3.5 < sections["w2"]["w2"] < 5.0  # W₂ of a shift by (3, 3): 3√2 ≈ 4.24
        True
    """

    metrics: Mapping[str, Mapping[str, Any]]

    @classmethod
    def parse(cls, spec: str | Sequence[str] | Mapping[str, Any]) -> MetricSelection:
        """From ``"fid,utility,w2"``, a list of names, or a mapping ``{name: options}`` whose
        options may be ``true``/``null`` (defaults) or ``false`` (left out).

        Raises:
            ValueError: for an unknown metric or option, a bad utility mode, or no metric.
        """
        if isinstance(spec, str):
            spec = [name.strip() for name in spec.split(",") if name.strip()]
        if not isinstance(spec, Mapping):
            spec = {name: None for name in spec}
        selected: dict[str, dict[str, Any]] = {}
        for name, options in spec.items():
            metric = ALIASES.get(name, name)
            if metric not in METRICS:
                raise ValueError(
                    f"metrics: unknown metric {name!r}; accepted: {', '.join(METRICS)} "
                    "(fid is frechet)"
                )
            if options is False:
                continue
            options = {} if options in (None, True) else dict(options)
            unknown = sorted(set(options) - set(OPTIONS[metric]))
            if unknown:
                raise ValueError(
                    f"metrics.{metric}: unknown options {unknown}; accepted: {OPTIONS[metric]}"
                )
            if options.get("mode", "quick") not in UTILITY_MODES:
                raise ValueError(
                    f"metrics.utility.mode must be one of {UTILITY_MODES}, got {options['mode']!r}"
                )
            selected[metric] = options
        if not selected:
            raise ValueError(f"metrics: select at least one of {', '.join(METRICS)}")
        return cls(selected)

    @property
    def needs_labels(self) -> bool:
        """Whether the samples must carry labels (the utility metric)."""
        return "utility" in self.metrics

    def frechet_evaluator(self) -> FrechetEvaluator:
        """The Fréchet evaluator (Inception weights are loaded here: a missing file fails before
        any sample is drawn)."""
        options = {k: v for k, v in self.metrics["frechet"].items() if k != "split_reference"}
        return FrechetEvaluator(**options)

    def utility_evaluator(
        self, seed: int = 0, device: torch.device | str = "cpu"
    ) -> UtilityEvaluator:
        options = self.metrics["utility"]
        return UtilityEvaluator(options.get("classifiers", ("logreg", "mlp", "cnn")), seed, device)

    def w2_evaluator(self, seed: int = 0) -> W2Evaluator:
        return W2Evaluator(**self.metrics["w2"], seed=seed)

    def _splits(self, evaluator: FrechetEvaluator, reference_labels: Tensor | None) -> bool:
        """Whether the classifier is trained here on half of the held-out split."""
        return (
            bool(self.metrics["frechet"].get("split_reference"))
            and evaluator.feature_extractor == "classifier"
            and evaluator.classifier_path is None
            and reference_labels is not None
        )

    def score(
        self,
        samples: Tensor,
        labels: Tensor | None,
        reference: Tensor,
        reference_labels: Tensor | None,
        *,
        seed: int = 0,
        cache_dir: str | Path = ".dpot_cache",
        device: torch.device | str = "cpu",
        source: Any = None,
        frechet: FrechetEvaluator | None = None,
    ) -> dict[str, dict[str, Any]]:
        """One section per selected metric, in selection order:

        * ``frechet``: the evaluator's key (``fid`` | ``fd_classifier``) with its value and
          description;
        * ``utility``: ``{classifier: accuracy, "mode": ...}``, or ``{"skipped": reason}``
          when the samples or the held-out split carry no labels;
        * ``w2``: ``w2``, ``w2_stderr``, ``subsample``, ``repeats``;
        * ``manifold``: ``manifold_error``, ``arc_coverage`` (``source``: the data's curve).

        ``frechet``: an evaluator built earlier by ``frechet_evaluator`` (to fail before
        sampling); built here otherwise."""
        sections: dict[str, dict[str, Any]] = {}
        for metric, options in self.metrics.items():
            if metric == "frechet":
                evaluator = frechet or self.frechet_evaluator()
                fd_reference, fd_labels = reference, reference_labels
                if self._splits(evaluator, reference_labels):
                    order = torch.randperm(
                        len(reference), generator=torch.Generator().manual_seed(0)
                    )
                    train, part = order[: len(order) // 2], order[len(order) // 2 :]
                    evaluator.build_classifier(reference[train], reference_labels[train], cache_dir)
                    fd_reference, fd_labels = reference[part], reference_labels[part]
                evaluator.set_reference(
                    fd_reference.float(), fd_labels, cache_dir=cache_dir, device=device
                )
                sections["frechet"] = {**evaluator.score(samples.float()), **evaluator.describe()}
            elif metric == "utility":
                mode = options.get("mode", "quick")
                if reference_labels is None:
                    sections["utility"] = {"skipped": "the raw held-out split has no labels"}
                    continue
                settings = FULL if mode == "full" else QUICK
                evaluator = self.utility_evaluator(seed, device)
                try:
                    accuracies = evaluator.score(
                        samples, labels, reference, reference_labels, settings
                    )
                except UnlabelledSamplesError as err:
                    sections["utility"] = {"skipped": str(err)}
                else:
                    sections["utility"] = {**accuracies, "mode": mode}
            elif metric == "w2":
                evaluator = self.w2_evaluator(seed)
                w2 = evaluator.score(samples.float(), reference.float())
                sections["w2"] = {
                    "w2": w2["w2"],
                    "w2_stderr": w2["w2_stderr"],
                    "subsample": w2["w2_subsample"],
                    "repeats": evaluator.repeats,
                }
            elif isinstance(source, CurveSource):
                sections["manifold"] = ManifoldEvaluator(source).score(samples)
            else:
                sections["manifold"] = {"skipped": "the data source is not a planar curve"}
        return sections
