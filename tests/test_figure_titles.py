"""No plot title is cut: every figure the package saves holds its titles and suptitle inside the
saved canvas, also the longest realistic ones (a long suite name over a single ε column)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import matplotlib
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from lightning_dpot.callbacks import ManifoldEvaluation, SampleGrid
from lightning_dpot.compare.results import plot_metrics, plot_samples
from lightning_dpot.compare.suite import MethodSpec, Suite

matplotlib.use("Agg")


@pytest.fixture
def saved(monkeypatch) -> list[tuple[Figure, dict]]:
    """Every ``Figure.savefig`` call made in the test: (figure, keyword arguments)."""
    calls: list[tuple[Figure, dict]] = []
    savefig = Figure.savefig

    def spy(figure: Figure, fname, **kwargs):
        calls.append((figure, kwargs))
        return savefig(figure, fname, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    return calls


def _cut_titles(figure: Figure, kwargs: dict) -> list[str]:
    """The titles (axes titles and the suptitle) that reach outside the saved canvas."""
    renderer = FigureCanvasAgg(figure).get_renderer()  # the figure is closed once saved
    if kwargs.get("bbox_inches") == "tight":
        canvas = figure.get_tightbbox(renderer).padded(kwargs.get("pad_inches", 0.1))
    else:
        canvas = figure.bbox_inches
    titles = [*figure.texts, *(ax.title for ax in figure.axes)]
    cut = []
    for text in titles:
        if not text.get_text():
            continue
        box = text.get_window_extent(renderer).transformed(figure.dpi_scale_trans.inverted())
        inside = canvas.x0 <= box.x0 and box.x1 <= canvas.x1
        if not (inside and canvas.y0 <= box.y0 and box.y1 <= canvas.y1):
            cut.append(text.get_text())
    return cut


def test_compare_samples_suptitle_of_a_long_suite_over_one_column_is_not_cut(tmp_path, saved):
    suite = Suite(
        name="fashion_gpu_playbook",
        path=tmp_path / "suite.yaml",
        epsilons=(10.0,),
        delta=1e-5,
        seeds=(0,),
        sources={"fashion_mnist": {"class_path": "lightning_dpot.data.FashionMNIST"}},
        methods={
            "dpswflow_r": MethodSpec("dpswflow_r", tmp_path / "m.yaml", {}, ("fashion_mnist",))
        },
    )
    (path,) = plot_samples(suite, [], tmp_path, tmp_path / "cells")
    ((figure, kwargs),) = saved
    assert figure.texts[0].get_text() == "fashion_gpu_playbook / fashion_mnist: samples (seed 0)"
    assert _cut_titles(figure, kwargs) == [] and path.is_file()


def test_compare_metric_panels_keep_their_titles(tmp_path, saved):
    rows = [
        {
            "source": "five_gaussians_mixture",
            "notion": notion,
            "method": method,
            "target_epsilon": eps,
            "metrics": {"w2": (1.0 / eps, 0.1)},
        }
        for notion, method in (("local", "entropic_wgan"), ("central", "dpswflow_r"))
        for eps in (1.0, 5.0, 10.0)
    ]
    plot_metrics(rows, tmp_path)
    ((figure, kwargs),) = saved
    assert [ax.get_title() for ax in figure.axes] == [
        "five_gaussians_mixture: local DP",
        "five_gaussians_mixture: central DP",
    ]
    assert _cut_titles(figure, kwargs) == []


def test_manifold_scatter_and_sample_scatter_keep_their_titles(tmp_path, saved):
    points = torch.rand(100, 2)
    trainer = SimpleNamespace(datamodule=SimpleNamespace(test_records=points, release=points))
    ManifoldEvaluation.save_scatter(trainer, points, tmp_path / "scatter.png", error=0.123456)
    SampleGrid._save_scatter(points, tmp_path / "samples.png", "samples at step 1234567")
    assert len(saved) == 2
    for figure, kwargs in saved:
        assert _cut_titles(figure, kwargs) == []
    assert Path(tmp_path / "scatter.png").is_file() and Path(tmp_path / "samples.png").is_file()
