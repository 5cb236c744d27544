"""Evaluation metrics: FID and a classifier-feature Fréchet distance, exact W₂ to the raw data
on subsamples, and downstream utility of labelled synthetic data (see docs/evaluation.md)."""

from lightning_dpot.metrics.fid import (
    ClassifierFrechetDistance,
    FeatureClassifier,
    InceptionFID,
    frechet_distance,
    load_or_train_feature_classifier,
    train_feature_classifier,
)
from lightning_dpot.metrics.utility import (
    FULL,
    QUICK,
    UnlabelledSamplesError,
    UtilitySettings,
    downstream_utility,
)
from lightning_dpot.metrics.w2 import subsampled_w2, w2_distance

__all__ = [
    "FULL",
    "QUICK",
    "ClassifierFrechetDistance",
    "FeatureClassifier",
    "InceptionFID",
    "UnlabelledSamplesError",
    "UtilitySettings",
    "downstream_utility",
    "frechet_distance",
    "load_or_train_feature_classifier",
    "subsampled_w2",
    "train_feature_classifier",
    "w2_distance",
]
