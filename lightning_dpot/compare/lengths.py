"""Scores against training length: one ``LengthPoint`` per (method, machine, steps), from a
suite's cells (seeds averaged) or from single runs, written as one table and one plot beside the
published numbers (``lightning_dpot.compare.published``).

Every run has its noise calibrated for its own length, so every point of a method spends the same
target ε; the points differ in how far training got, not in privacy.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lightning_dpot.compare.published import PublishedResult
from lightning_dpot.grids import save_figure

__all__ = [
    "LengthPoint",
    "length_table",
    "method_of",
    "plot_against_steps",
    "points_from_cells",
    "run_point",
]

#: A suite method named for its length, ``<method>_<steps>``, counts as ``<method>``.
_LENGTH = re.compile(r"^(?P<method>.+)_(?P<steps>\d+)(steps)?$")
CLASSIFIERS = ("logreg", "mlp", "cnn")


@dataclass(frozen=True)
class LengthPoint:
    """A method's scores after ``steps`` training steps on ``device``: the mean over ``seeds``
    runs of each metric (``fd_classifier``, ``fid``, ``utility_logreg`` / ``_mlp`` /
    ``_cnn``), the largest ε they reported and their mean fit time; for a single run also its
    accountant and adjacency (``guarantee``), σ and step and evaluation times."""

    method: str
    device: str
    steps: int
    seeds: int
    epsilon: float
    metrics: dict[str, float]
    fit_seconds: float
    guarantee: str | None = None
    noise_multiplier: float | None = None
    step_seconds: float | None = None
    evaluate_seconds: float | None = None


def _metrics(record: dict) -> dict[str, float]:
    """A cell's or run's metrics under the published table's keys."""
    metrics = record["metrics"]
    out = {key: metrics[key] for key in ("fd_classifier", "fid") if metrics.get(key) is not None}
    utility = metrics.get("utility") or {}
    out |= {f"utility_{k}": utility[k] for k in CLASSIFIERS if utility.get(k) is not None}
    return out


def method_of(name: str) -> str:
    """``dp_sinkhorn`` for a cell named ``dp_sinkhorn_1000`` or a run ``dp_sinkhorn_1000steps``."""
    match = _LENGTH.match(name)
    return match["method"] if match else name


def points_from_cells(
    cells: Iterable[dict], methods: tuple[str, ...], epsilon: float, device: str
) -> list[LengthPoint]:
    """One point per (method, steps) of the ``methods`` among a comparison's ``cells`` at target
    ``epsilon``, the metrics averaged over seeds (a metric some seeds lack: over the others)."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for cell in cells:
        method = method_of(cell["method"])
        if method in methods and math.isclose(cell["target_epsilon"], epsilon):
            groups.setdefault((method, cell["steps"]), []).append(cell)
    points = []
    for (method, steps), group in groups.items():
        per_cell = [_metrics(cell) for cell in group]
        keys = sorted({key for metrics in per_cell for key in metrics})
        points.append(
            LengthPoint(
                method,
                device,
                steps,
                len(group),
                max(cell["privacy"]["epsilon"] for cell in group),
                {k: statistics.fmean(m[k] for m in per_cell if k in m) for k in keys},
                statistics.fmean(cell["fit_seconds"] for cell in group),
            )  # fmt: skip
        )
    return points


def run_point(run: dict, device: str) -> LengthPoint:
    """The point of one run (a GPU playbook run: ``method``, ``steps``, ``privacy``,
    ``metrics``, ``fit_seconds`` and, where it has them, ``noise_multiplier``,
    ``step_seconds``, ``evaluate_seconds``)."""
    privacy = run["privacy"]
    guarantee = ", ".join(str(privacy[k]) for k in ("accountant", "adjacency") if privacy.get(k))
    return LengthPoint(
        run["method"], device, run["steps"], 1, privacy["epsilon"], _metrics(run),
        run["fit_seconds"], guarantee or None, run.get("noise_multiplier"),
        run.get("step_seconds"), run.get("evaluate_seconds"),
    )  # fmt: skip


def _cell(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


def length_table(points: Iterable[LengthPoint]) -> str:
    """The points as Markdown, by machine, method and length: the Inception FID where any point
    measured it, else the classifier FD; σ, ms/step and evaluation time where any point has
    them."""
    points = sorted(points, key=lambda p: (p.device, p.method, p.steps))
    fid = any("fid" in p.metrics for p in points)
    sigma = any(p.noise_multiplier is not None for p in points)
    timed = any(p.step_seconds is not None for p in points)
    scored = any(p.evaluate_seconds is not None for p in points)
    titles = [
        "device", "method", "steps", "seeds", *(["σ (noise multiplier)"] if sigma else []),
        "ε (largest)", "FID (Inception) ↓" if fid else "FD (classifier) ↓",
        "LogReg ↑", "MLP ↑", "CNN ↑", *(["ms/step"] if timed else []), "fit s",
        *(["evaluation s"] if scored else []),
    ]  # fmt: skip
    lines = ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]
    for p in points:
        epsilon = f"{p.epsilon:.4g}" + (f" ({p.guarantee})" if p.guarantee else "")
        step_ms = None if p.step_seconds is None else 1e3 * p.step_seconds
        cells = [
            p.device, p.method, f"{p.steps:,}", str(p.seeds),
            *([_cell(p.noise_multiplier, 4)] if sigma else []), epsilon,
            _cell(p.metrics.get("fid" if fid else "fd_classifier"), 4),
            *(_cell(p.metrics.get(f"utility_{k}")) for k in CLASSIFIERS),
            *([_cell(step_ms, 3)] if timed else []), f"{p.fit_seconds:.0f}",
            *([_cell(p.evaluate_seconds, 3)] if scored else []),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _published_mark(ax, entry: PublishedResult, value: float, what: str) -> None:
    """A published number: a star at its steps where the paper says them, else a line."""
    label = f"{entry.method} {what}, {entry.reference}"
    if entry.steps is not None:
        ax.plot([entry.steps], [value], marker="*", markersize=12, linestyle="none",
                color="black", label=label)  # fmt: skip
        return
    ax.axhline(value, ls=":", lw=1, color="gray")
    ax.annotate(f"{label}: {value:g}", (1, value), xycoords=("axes fraction", "data"),
                ha="right", va="bottom", fontsize=7, color="gray")  # fmt: skip


def plot_against_steps(
    points: list[LengthPoint],
    published: tuple[PublishedResult, ...],
    path: str | Path,
    epsilon: float,
) -> Path:
    """Left: CNN accuracy on the real test split against steps (the conditional methods);
    right: the Fréchet distance — the Inception FID where the points measured it (beside the
    published FIDs), else the classifier FD (beside no published number: it is not an FID).
    Log x axis; one line per (method, machine); the published numbers of the plotted methods
    at ``epsilon``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frechet = "fid" if any("fid" in p.metrics for p in points) else "fd_classifier"
    fig, (acc_ax, fd_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    lines = sorted({(p.method, p.device) for p in points})
    for (method, device), marker in zip(lines, "osD^v<>xP", strict=False):
        mine = sorted((p for p in points if (p.method, p.device) == (method, device)),
                      key=lambda p: p.steps)  # fmt: skip
        for ax, key in ((acc_ax, "utility_cnn"), (fd_ax, frechet)):
            shown = [p for p in mine if key in p.metrics]
            if shown:
                ax.plot([p.steps for p in shown], [p.metrics[key] for p in shown],
                        marker=marker, label=f"{method} ({device})")  # fmt: skip
    plotted = {p.method for p in points}
    for entry in published:
        if entry.method in plotted and math.isclose(entry.epsilon, epsilon):
            if "utility_cnn" in entry.metrics:
                _published_mark(acc_ax, entry, entry.metrics["utility_cnn"], "CNN")
            if frechet == "fid" and "fid" in entry.metrics:
                _published_mark(fd_ax, entry, entry.metrics["fid"], "FID")
    acc_ax.axhline(0.1, ls="--", lw=1, color="black")
    acc_ax.annotate("chance", (0, 0.1), xycoords=("axes fraction", "data"), fontsize=7)
    acc_ax.set(xscale="log", xlabel="training steps", ylabel="CNN accuracy (real test split)",
               title=f"Downstream CNN accuracy at ε = {epsilon:g}")  # fmt: skip
    name = "FID (Inception features)" if frechet == "fid" else "FD (classifier features)"
    title = "FID" if frechet == "fid" else "Classifier Fréchet distance"
    fd_ax.set(xscale="log", xlabel="training steps", ylabel=f"{name} ↓",
              title=f"{title} at ε = {epsilon:g}")  # fmt: skip
    for ax in (acc_ax, fd_ax):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # nothing to name before the first run
            ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)
