"""Published numbers a suite is read beside, and the protocol differences that separate them.

A suite may state, under ``published``, numbers from the literature for its methods, and under
``differences``, how its protocol departs from the papers'::

    published:
      - method: dp_sinkhorn            # a method of the suite
        reference: Cao et al. 2021, Table 1
        epsilon: 10                    # the published run's ε (δ: the suite's)
        metrics: {utility_cnn: 0.711, fid: 128.3}
    differences:
      - [image size, 28x28, 32x32 (padded)]    # [aspect, the papers, this suite]

``published`` may instead name a table file shared by several suites (relative to the suite,
a mapping whose ``published`` is such a list), ``published: published/fashion_mnist.yaml``:
the suite shows the entries of its own methods. An entry may say how many training ``steps``
the published run took.

Metric keys are the suite's own (``utility_cnn``, ``utility_mlp``, ``utility_logreg``,
``fd_classifier``, ``fid``, ``w2``...); a published metric the suite does not measure is shown
beside "not measured", never beside another metric (a classifier FD is not an FID).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from lightning_dpot.resources import resolve_path

__all__ = [
    "PublishedResult",
    "load_published",
    "parse_differences",
    "parse_published",
    "published_table",
]

#: Display names of the metric keys a published entry may use.
METRIC_TITLES = {
    "utility_cnn": "CNN accuracy",
    "utility_mlp": "MLP accuracy",
    "utility_logreg": "LogReg accuracy",
    "utility_mean": "mean accuracy",
    "fd_classifier": "FD (classifier)",
    "fid": "FID (Inception)",
    "w2": "W2",
}


@dataclass(frozen=True)
class PublishedResult:
    """One published run: the suite method it sits beside, where it is from, its ε, its
    numbers, and its training length where the paper states it."""

    method: str
    reference: str
    epsilon: float
    metrics: dict[str, float]
    note: str = ""
    steps: int | None = None


def load_published(path: str | Path) -> tuple[PublishedResult, ...]:
    """Every entry of a published-numbers table file (``published:`` list), checked as
    ``parse_published`` checks a suite's, for any method name."""
    path = Path(resolve_path(str(path)))
    raw = yaml.safe_load(path.read_text()) if path.is_file() else None
    if not isinstance(raw, dict) or "published" not in raw:
        raise ValueError(f"published={str(path)!r} must be a file with a `published:` list")
    try:
        return parse_published(raw["published"], None)
    except ValueError as err:
        raise ValueError(f"published={str(path)!r}: {err}") from None


def parse_published(
    raw: Any, methods: dict[str, Any] | None, folder: Path | None = None
) -> tuple[PublishedResult, ...]:
    """``published`` entries, checked: a method of ``methods`` (any name with ``None``), a
    reference, ε > 0, known metric keys with finite values, a whole number of ``steps`` > 0.
    A table file's name (``raw`` a string, relative to ``folder``) gives its entries for
    ``methods``. Raises ``ValueError`` naming the entry and the key."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        table = load_published(raw if folder is None else folder / raw)
        return tuple(e for e in table if methods is None or e.method in methods)
    if not isinstance(raw, list):
        raise ValueError("published must be a list of {method, reference, epsilon, metrics}")
    entries = []
    for i, entry in enumerate(raw):
        where = f"published[{i}]"
        if not isinstance(entry, dict) or set(entry) - {
            "method", "reference", "epsilon", "metrics", "note", "steps"
        }:  # fmt: skip
            raise ValueError(f"{where} must be a mapping of method, reference, epsilon, metrics")
        if methods is not None and entry.get("method") not in methods:
            raise ValueError(
                f"{where}.method={entry.get('method')!r} is not a method of the suite "
                f"{sorted(methods)}"
            )
        if not isinstance(entry.get("reference"), str) or not entry["reference"]:
            raise ValueError(f"{where}.reference must name the paper and table")
        epsilon = entry.get("epsilon")
        if not isinstance(epsilon, (int, float)) or not epsilon > 0:
            raise ValueError(f"{where}.epsilon must be > 0, got {epsilon!r}")
        metrics = entry.get("metrics")
        if not isinstance(metrics, dict) or not metrics:
            raise ValueError(f"{where}.metrics must map metric keys to numbers")
        for key, value in metrics.items():
            if key not in METRIC_TITLES:
                known = list(METRIC_TITLES)
                raise ValueError(f"{where}.metrics.{key}: unknown metric; known: {known}")
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{where}.metrics.{key} must be a finite number, got {value!r}")
        steps = entry.get("steps")
        if steps is not None and (
            not isinstance(steps, int) or isinstance(steps, bool) or steps < 1
        ):
            raise ValueError(f"{where}.steps must be a whole number > 0, got {steps!r}")
        entries.append(
            PublishedResult(
                entry["method"],
                entry["reference"],
                float(epsilon),
                {k: float(v) for k, v in metrics.items()},
                str(entry.get("note", "")),
                steps,
            )  # fmt: skip
        )
    return tuple(entries)


def parse_differences(raw: Any) -> tuple[tuple[str, str, str], ...]:
    """``differences``: a list of ``[aspect, the papers, this suite]`` triples of strings."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(
        isinstance(row, list) and len(row) == 3 and all(isinstance(s, str) for s in row)
        for row in raw
    ):
        raise ValueError("differences must be a list of [aspect, the papers, this suite] strings")
    return tuple((a, b, c) for a, b, c in raw)


def _ours(rows: list[dict], method: str, epsilon: float, key: str) -> str:
    """The suite's mean ± std of ``key`` for ``method`` at target ``epsilon``."""
    for row in rows:
        if row["method"] == method and math.isclose(row["target_epsilon"], epsilon):
            value = row["metrics"].get(key)
            if value is None:
                return "not measured"
            mean, std = value  # a single run has no spread (``None``)
            return f"{mean:.3g}" if std is None else f"{mean:.3g} ± {std:.2g}"
    return "not run"


def published_table(
    published: tuple[PublishedResult, ...],
    differences: tuple[tuple[str, str, str], ...],
    rows: list[dict],
) -> list[str]:
    """Markdown lines: each published number beside the suite's at the same method, ε and
    metric, then the protocol differences. Accuracies are fractions in [0, 1]."""
    if not published:
        return []
    lines = [
        "## Beside the published numbers",
        "",
        "| method | published in | ε | metric | published | this suite |",
        "|---|---|---|---|---|---|",
    ]
    for entry in published:
        for key, value in entry.metrics.items():
            cells = [
                entry.method, entry.reference, f"{entry.epsilon:g}", METRIC_TITLES[key],
                f"{value:.4g}", _ours(rows, entry.method, entry.epsilon, key),
            ]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {e.method} ({e.reference}): {e.note}" for e in published if e.note]
    lines += ["", *notes, *([""] if notes else [])]
    if differences:
        lines += ["| | the papers | this suite |", "|---|---|---|"]
        lines += [f"| {a} | {b} | {c} |" for a, b, c in differences]
        lines.append("")
    return lines
