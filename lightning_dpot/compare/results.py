"""A suite's results: ``comparison.json``, the Markdown table and the plots.

Cells are aggregated over seeds per (source, method, target ε): mean ± sample std of every
metric and of the reported ε. Rows are grouped by privacy notion and never mixed: a local ε
and a central ε are different guarantees (see ``NOTION_NOTE``).
"""

from __future__ import annotations

import importlib
import math
import statistics
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_dpot.compare.published import published_table
from lightning_dpot.compare.suite import Cell, Suite
from lightning_dpot.grids import save_figure

__all__ = [
    "CELLS_NOTE",
    "NOTION_NOTE",
    "aggregate",
    "markdown_table",
    "plot_metrics",
    "plot_samples",
]

NOTION_NOTE = (
    "Local and central ε are not the same currency: a local ε bounds what each released record "
    "reveals about its owner before any training (every record is privatized on its own), while "
    "a central (ε, δ) bounds what the trained model reveals about one record of the dataset, so "
    "compare methods only within a group."
)

CELLS_NOTE = (
    "Every cell draws its own release of the same people (a fresh LDP release or a fresh "
    "private run per method, ε and seed): each cell's ε holds for that cell alone, and a person "
    "in the data has spent the sum over all cells (sequential composition, Dwork & Roth 2014, "
    "Thm. 3.16). A suite compares methods; it is not one private deployment."
)

#: (key in a cell's metrics, column title, lower is better)
METRICS: tuple[tuple[str, str, bool], ...] = (
    ("w2", "W2 ↓", True),
    ("manifold_error", "dist. to support ↓", True),
    ("arc_coverage", "arc coverage ↑", False),
    ("fd_classifier", "FD (classifier) ↓", True),
    ("fid", "FID ↓", True),
    ("utility_mean", "utility acc. ↑", False),
)

NOTION_TITLES = {
    "local": "Local DP — per-record ε of the release (ε, δ of the randomizer)",
    "central": "Central DP — (ε, δ) of the trained model, from the run's accountant",
}


def _mean_std(values: list[float]) -> tuple[float, float] | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else 0.0


def _cell_metrics(cell: dict) -> dict[str, float]:
    metrics = dict(cell["metrics"])
    utility = metrics.pop("utility", None)
    if isinstance(utility, dict) and utility:
        metrics["utility_mean"] = statistics.fmean(utility.values())
        metrics.update({f"utility_{name}": acc for name, acc in utility.items()})
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}


def aggregate(cells: list[dict]) -> list[dict]:
    """One row per (source, method, target ε): mean / std over seeds."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for cell in cells:
        groups[(cell["source"], cell["method"], cell["target_epsilon"])].append(cell)
    rows = []
    for (source, method, target), group in sorted(groups.items()):
        notions = {c["privacy"]["notion"] for c in group}
        if len(notions) != 1:
            raise ValueError(f"{method} on {source} reports mixed privacy notions {notions}")
        for key in ("delta", "accountant", "adjacency", "sampling_seed_is_public"):
            seen = {repr(c["privacy"].get(key)) for c in group}
            if len(seen) > 1:
                raise ValueError(
                    f"{method} on {source} at target ε={target:g}: the seeds report different "
                    f"privacy {key} ({', '.join(sorted(seen))}); a row averages one guarantee"
                )
        privacy = group[0]["privacy"]
        metrics = defaultdict(list)
        for cell in group:
            for key, value in _cell_metrics(cell).items():
                metrics[key].append(float(value))
        row = {
            "source": source,
            "method": method,
            "method_class": group[0]["method_class"],
            "notion": notions.pop(),
            "target_epsilon": target,
            "epsilon": _mean_std([c["privacy"]["epsilon"] for c in group]),
            "delta": privacy.get("delta"),
            "accountant": privacy.get("accountant"),
            "adjacency": privacy.get("adjacency"),
            "shuffled_central_epsilon": _mean_std(
                [c["privacy"].get("shuffled_central_epsilon") for c in group]
            ),
            "shuffled_central_delta": privacy.get("shuffled_central_delta"),
            "sampling_seed_is_public": privacy.get("sampling_seed_is_public"),
            "exceeds_target": any(c["privacy"].get("exceeds_target") for c in group),
            "seeds": sorted(c["seed"] for c in group),
            "metrics": {k: _mean_std(v) for k, v in metrics.items()},
            "fd_classifier_weights": sorted(
                {
                    c["metrics"].get("fd_classifier_weights", "unrecorded")
                    for c in group
                    if "fd_classifier" in c["metrics"]
                }
            ),
            "fit_seconds": statistics.fmean(c["fit_seconds"] for c in group),
        }
        rows.append(row)
    return rows


def _fmt(value: tuple[float, float] | None, digits: int = 3) -> str:
    if value is None:
        return "—"
    mean, std = value
    return f"{mean:.{digits}g} ± {std:.2g}"


def markdown_table(suite: Suite, rows: list[dict]) -> str:
    """The suite's results as Markdown: one section per source, one table per notion."""
    lines = [f"# `dpot compare`: {suite.name}", ""]
    if suite.description:
        lines += [suite.description, ""]
    lines += [
        f"Mean ± std over seeds {list(suite.seeds)}; every seed is a fresh secret release and "
        "a fresh model. Metrics against the raw held-out split; ε is what each run's own "
        "report states (its accountant or LDP report), not the suite's target.",
        "",
        f"> {NOTION_NOTE}",
        "",
        f"> {CELLS_NOTE}",
        "",
    ]
    if len(suite.seeds) < 3:
        lines += [f"> Only {len(suite.seeds)} seed(s): the ± is not a reliable spread.", ""]
    fewer = [
        f"{r['method']} / {r['source']} / ε = {r['target_epsilon']:g}: seeds {r['seeds']}"
        for r in rows
        if len(r["seeds"]) < len(suite.seeds)
    ]
    if fewer:
        lines += [
            f"> Rows over fewer seeds than the suite's (their other cells failed): "
            f"{'; '.join(fewer)}.",
            "",
        ]
    above = sorted({r["method"] for r in rows if r["exceeds_target"]})
    if above:
        lines += [
            f"> ⚠ {', '.join(above)}: a run reported ε above the suite's target, so its row is "
            "not at equal privacy with the others (see the cells' report.json).",
            "",
        ]
    for source in dict.fromkeys(r["source"] for r in rows):
        lines += [f"## {source}", ""]
        here = [r for r in rows if r["source"] == source]
        lines += _feature_classifier_note(here)  # each source's held-out split has its own
        present = [m for m in METRICS if any(r["metrics"].get(m[0]) for r in here)]
        per_classifier = sorted(
            {k for r in here for k in r["metrics"] if k.startswith("utility_")} - {"utility_mean"}
        )
        present += [(k, f"acc. {k.removeprefix('utility_')} ↑", False) for k in per_classifier]
        for notion in ("local", "central"):
            group = [r for r in rows if r["source"] == source and r["notion"] == notion]
            if not group:
                continue
            header = ["method", "target ε", "reported ε", "δ", "privacy"]
            header += [title for _, title, _ in present] + ["fit s"]
            lines += [f"### {NOTION_TITLES[notion]}", ""]
            lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            for row in sorted(group, key=lambda r: (r["target_epsilon"], r["method"])):
                if notion == "local":
                    shuffled = row["shuffled_central_epsilon"]
                    shuffled_delta = row.get("shuffled_central_delta")
                    how = "per record" + (
                        f"; shuffled: central (ε, δ) = ({shuffled[0]:.3g}, {shuffled_delta:g})"
                        if shuffled and shuffled_delta is not None
                        else ""
                    )
                else:
                    how = f"{row['accountant']}, {row['adjacency']}"
                    if row["sampling_seed_is_public"]:
                        how += "; public sampling seed (no amplification)"
                name = row["method"] + (" ⚠ ε above target" if row["exceeds_target"] else "")
                cells = [
                    name,
                    f"{row['target_epsilon']:g}",
                    _fmt(row["epsilon"], digits=4),
                    "—" if row["delta"] is None else f"{row['delta']:g}",
                    how,
                ]
                cells += [_fmt(row["metrics"].get(key)) for key, _, _ in present]
                cells.append(f"{row['fit_seconds']:.1f}")
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    lines += published_table(suite.published, suite.differences, rows)
    return "\n".join(lines)


def _feature_classifier_note(rows: list[dict]) -> list[str]:
    """Which feature classifier the classifier FDs were computed on. Their scale depends on the
    classifier's weights (one trained with another seed moves every value by tens of percent),
    so FDs compare only under the same weights: ``unrecorded`` marks cells scored before the
    weights were recorded."""
    weights = sorted({w for r in rows for w in r.get("fd_classifier_weights", [])})
    if not weights:
        return []
    if len(weights) == 1 and weights[0] != "unrecorded":
        return [
            f"> FD (classifier): one feature classifier for these cells, weights sha256 "
            f"{weights[0]}. Compare these values with each other, or with a run scored on the "
            "same file (evaluation.frechet.classifier_path); a classifier trained with another "
            "seed rescales them.",
            "",
        ]
    return [
        f"> ⚠ FD (classifier) of these cells comes from more than one feature classifier, or "
        f"from weights not recorded (weights sha256 {', '.join(weights)}): values on "
        "different weights are not comparable.",
        "",
    ]


def plot_metrics(rows: list[dict], out_dir: Path) -> list[Path]:
    """``<source>_<metric>.png``: the metric against the target ε (log axis), one line per
    method with ±1 std error bars, in one panel per privacy notion (local and central ε are not
    the same currency, so they never share an axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for source in dict.fromkeys(r["source"] for r in rows):
        for key, title, _ in METRICS:
            series = [r for r in rows if r["source"] == source and r["metrics"].get(key)]
            notions = [n for n in NOTION_TITLES if any(r["notion"] == n for r in series)]
            if not notions:
                continue
            fig, axes = plt.subplots(
                1, len(notions), figsize=(5.0 * len(notions), 3.6), squeeze=False
            )
            for ax, notion in zip(axes[0], notions, strict=True):
                here = [r for r in series if r["notion"] == notion]
                for method in dict.fromkeys(r["method"] for r in here):
                    points = sorted(
                        (r for r in here if r["method"] == method),
                        key=lambda r: r["target_epsilon"],
                    )
                    ax.errorbar(
                        [r["target_epsilon"] for r in points],
                        [r["metrics"][key][0] for r in points],
                        yerr=[r["metrics"][key][1] for r in points],
                        label=method,
                        marker="o",
                        capsize=3,
                    )
                ax.set_xscale("log")
                ax.set_xlabel(
                    "per-record local ε" if notion == "local" else "central (ε, δ): target ε"
                )
                ax.set_title(f"{source}: {notion} DP", fontsize=10)
                ax.legend(fontsize=7)
            for ax in axes[0]:
                ax.set_ylabel(title)
            fig.tight_layout()
            written.append(save_figure(fig, out_dir / f"{source}_{key}.png", dpi=120))
    return written


def plot_samples(suite: Suite, cells: list[dict], out_dir: Path, cells_dir: Path) -> list[Path]:
    """``<source>_samples.png``: samples of the first seed, methods in rows, ε in columns
    (scatter for 2-D records, an image grid for images)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from lightning_dpot.grids import images_to_grid

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    seed = suite.seeds[0]
    for source in suite.sources:
        methods = [m for m in suite.methods if source in suite.methods[m].sources]
        if not methods:
            continue
        support = _public_support(suite.sources[source])
        fig, axes = plt.subplots(
            len(methods),
            len(suite.epsilons),
            figsize=(2.2 * len(suite.epsilons), 2.2 * len(methods)),
            squeeze=False,
        )
        for i, method in enumerate(methods):
            for j, eps in enumerate(suite.epsilons):
                ax = axes[i][j]
                ax.set_xticks([])
                ax.set_yticks([])
                match = [
                    c
                    for c in cells
                    if (c["method"], c["source"], c["target_epsilon"], c["seed"])
                    == (method, source, eps, seed)
                ]
                if match:
                    path = cells_dir / Cell(method, source, eps, seed).key / "samples.pt"
                    samples = torch.load(path, weights_only=True)
                    if samples.ndim == 2 and samples.shape[1] == 2:
                        _draw_support(ax, support)
                        ax.scatter(samples[:, 0], samples[:, 1], s=2)
                        ax.set_xlim(-1.5, 1.5)
                        ax.set_ylim(-1.5, 1.5)
                    elif samples.ndim == 4:
                        ax.imshow(images_to_grid(samples).permute(1, 2, 0).numpy())
                if i == 0:
                    ax.set_title(f"ε = {eps:g}", fontsize=9)
                if j == 0:
                    ax.set_ylabel(method, fontsize=8)
        fig.suptitle(f"{suite.name} / {source}: samples (seed {seed})", fontsize=10)
        fig.tight_layout()
        written.append(save_figure(fig, out_dir / f"{source}_samples.png", dpi=120))
    return written


def _public_support(spec: dict) -> Tensor | None:
    """The known support of a synthetic source (a curve's polyline, a mixture's centres) for the
    scatter panels; ``None`` for data without one. Public by construction: no record is read."""
    from lightning_dpot.data.manifolds import CurveSource, GaussianMixture2D

    module_name, _, class_name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not issubclass(cls, (CurveSource, GaussianMixture2D)):
        return None
    source = cls(**spec.get("init_args", {}))
    return source.polyline() if isinstance(source, CurveSource) else source.centers()


def _draw_support(ax: Any, support: Tensor | None) -> None:
    if support is None:
        return
    if support.shape[0] > 20:  # a curve
        ax.plot(support[:, 0], support[:, 1], color="0.6", linewidth=2, zorder=0)
    else:  # mixture centres
        ax.scatter(support[:, 0], support[:, 1], marker="x", color="0.4", s=40, zorder=3)


def comparison_record(suite: Suite, cells: list[dict], rows: list[dict]) -> dict[str, Any]:
    """The content of ``comparison.json``."""
    return {
        "suite": suite.name,
        "suite_file": str(suite.path),
        "epsilons": list(suite.epsilons),
        "delta": suite.delta,
        "seeds": list(suite.seeds),
        "protocol": {
            "reference": "raw held-out split of each source (never trained on)",
            "samples": suite.evaluation.get("num_samples", 2000),
            "evaluation": suite.evaluation,
            "utility_model_selection": "early stopping on synthetic validation data only",
            "privacy": "each cell's ε is read from its own report.json",
            "notions": NOTION_NOTE,
            "cells_are_separate_releases": CELLS_NOTE,
        },
        "published": [asdict(entry) for entry in suite.published],
        "differences": [list(row) for row in suite.differences],
        "rows": rows,
        "cells": cells,
    }
