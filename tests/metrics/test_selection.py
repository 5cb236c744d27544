"""One metric selection for ``dpot evaluate``, ``dpot compare`` and the evaluation callbacks."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_dpot.callbacks import W2Evaluation
from lightning_dpot.compare.suite import suite_metrics
from lightning_dpot.data.manifolds import HalfCircle
from lightning_dpot.metrics.evaluators import W2Evaluator
from lightning_dpot.metrics.selection import MetricSelection


def test_every_spelling_selects_the_same_metrics():
    names = ("frechet", "utility", "w2")
    assert tuple(MetricSelection.parse("fid, utility,w2").metrics) == names
    assert tuple(MetricSelection.parse(["fid", "utility", "w2"]).metrics) == names
    spec = {"frechet": None, "utility": True, "w2": {}, "manifold": False}
    assert tuple(MetricSelection.parse(spec).metrics) == names


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fid,bogus", "unknown metric 'bogus'"),
        ({"w2": {"subsample": 5, "size": 3}}, r"metrics.w2: unknown options \['size'\]"),
        ({"utility": {"mode": "slow"}}, "metrics.utility.mode must be one of"),
        ("", "select at least one"),
    ],
)
def test_a_bad_selection_is_refused_in_one_line(spec, message):
    with pytest.raises(ValueError, match=message):
        MetricSelection.parse(spec)


def test_score_gives_one_section_per_metric_from_the_same_evaluators():
    gen = torch.Generator().manual_seed(0)
    source = HalfCircle(n=500, n_test=300)
    reference = source.load().test
    samples = reference + 0.05 * torch.randn(reference.shape, generator=gen)
    selection = MetricSelection.parse({"w2": {"subsample": 50, "repeats": 3}, "manifold": True})
    sections = selection.score(samples, None, reference, None, seed=4, source=source)
    direct = W2Evaluator(50, 3, seed=4).score(samples, reference)
    assert sections["w2"]["w2"] == pytest.approx(direct["w2"])
    assert sections["w2"]["repeats"] == 3 and sections["w2"]["subsample"] == 50
    assert 0 < sections["manifold"]["manifold_error"] < 0.1
    assert math.isclose(sections["manifold"]["arc_coverage"], 1.0)
    # Unlabelled samples: the utility metric says why it is skipped instead of failing.
    utility = MetricSelection.parse("utility").score(samples, None, reference, torch.zeros(300))
    assert "skipped" in utility["utility"]


def test_the_suite_and_the_callbacks_parse_through_the_same_selection():
    with pytest.raises(ValueError, match="metrics.w2: unknown options"):
        suite_metrics({"w2": {"subsamples": 5}})
    assert suite_metrics({"num_samples": 500, "grid": 16}) is None  # no metric: only samples
    assert suite_metrics({"manifold": False}) is None
    frechet = suite_metrics({"frechet": {}}).metrics["frechet"]
    assert frechet == {"feature_extractor": "classifier", "split_reference": True}
    with pytest.raises(ValueError, match="subsample must be an integer >= 1"):
        W2Evaluation(num_samples=10, subsample=0)
