"""Accuracy and Fréchet distance against training length at ε = 10 on Fashion-MNIST, from the
ε = 10 cells of the CPU suites ``fashion_cpu`` and ``fashion_cpu_steps`` (2 CPU cores; seeds
averaged) and, when given, the runs of the GPU playbook (``benchmarks/gpu_playbook.py``), beside
the published numbers.

    dpot compare --config configs/compare/fashion_cpu.yaml --output runs/compare/fashion_cpu
    dpot compare --config configs/compare/fashion_cpu_steps.yaml \\
        --output runs/compare/fashion_cpu_steps
    python benchmarks/accuracy_vs_steps.py \\
        --cpu runs/compare/fashion_cpu/comparison.json \\
              runs/compare/fashion_cpu_steps/comparison.json \\
        --gpu docs/results/gpu_playbook_h100/summary.json --out docs/results/fashion_steps

Writes ``accuracy_vs_steps.png`` (left: CNN accuracy of the conditional methods; right: the
classifier FD of every method) and ``accuracy_vs_steps.md`` (one row per run). Every run has
its noise calibrated for its own length, so each point spends the same ε; DP-MERF releases once
and its later steps are post-processing. The averaging, the table and the plot are
``lightning_dpot.compare.lengths``, which the GPU playbook's plot uses too; the published numbers
are the suites' one table, ``configs/compare/published/fashion_mnist.yaml``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(REPO))

from lightning_dpot.compare.lengths import (  # noqa: E402
    LengthPoint,
    length_table,
    plot_against_steps,
    points_from_cells,
    run_point,
)
from lightning_dpot.compare.published import load_published  # noqa: E402

#: The methods plotted, and the published numbers (the suites' one table).
METHODS = ("dp_sinkhorn", "dp_merf", "dpswflow_r")
PUBLISHED = load_published(REPO / "configs" / "compare" / "published" / "fashion_mnist.yaml")
EPSILON = 10.0


def cpu_points(paths: list[Path]) -> list[LengthPoint]:
    """The ``METHODS`` cells at target ε = 10 of the comparisons ``paths``, seeds averaged."""
    cells = [cell for path in paths for cell in json.loads(path.read_text())["cells"]]
    return points_from_cells(cells, METHODS, EPSILON, "2 CPU cores")


def gpu_points(path: Path) -> list[LengthPoint]:
    """The runs of a GPU playbook ``summary.json``."""
    summary = json.loads(path.read_text())
    return [run_point(run, summary["device"]) for run in summary["runs"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cpu", type=Path, nargs="+", required=True, help="comparison.json of the CPU suites"
    )
    parser.add_argument("--gpu", type=Path, help="a GPU playbook summary.json")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    args = parser.parse_args(argv)
    points = cpu_points(args.cpu) + (gpu_points(args.gpu) if args.gpu else [])
    if not points:
        parser.error(f"--cpu: no cell of {sorted(METHODS)} at ε = 10")
    args.out.mkdir(parents=True, exist_ok=True)
    plot_against_steps(points, PUBLISHED, args.out / "accuracy_vs_steps.png", EPSILON)
    (args.out / "accuracy_vs_steps.md").write_text(length_table(points))
    print(f"{len(points)} runs → {args.out / 'accuracy_vs_steps.png'}, accuracy_vs_steps.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
