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
and its later steps are post-processing.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(REPO))

from lightning_dpot.compare.published import load_published  # noqa: E402

#: The methods plotted, and their published numbers at (10, 1e-5) from the suites' one table
#: (CNN accuracy: Cao et al. 2021, Table 1; FID: Cao et al. 2021, Sebag et al. 2023, Table 1).
METHODS = ("dp_sinkhorn", "dp_merf", "dpswflow_r")
PUBLISHED = {
    entry.method: entry
    for entry in load_published(REPO / "configs" / "compare" / "published" / "fashion_mnist.yaml")
    if entry.method in METHODS
}
_LENGTH = re.compile(r"^(?P<method>.+)_(?P<steps>\d+)$")


def _mean(values: list[float | None]) -> float | None:
    finite = [v for v in values if v is not None]
    return sum(finite) / len(finite) if finite else None


def cpu_runs(paths: list[Path], methods: tuple[str, ...], epsilon: float = 10.0) -> list[dict]:
    """One record per (method, steps) of the ``methods`` among the cells at target ``epsilon``
    of the comparisons ``paths`` (a ``<method>_<steps>`` name counts as ``<method>``), the
    metrics averaged over seeds."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for path in paths:
        for cell in json.loads(path.read_text())["cells"]:
            match = _LENGTH.match(cell["method"])
            method = match["method"] if match else cell["method"]
            if method in methods and cell["target_epsilon"] == epsilon:
                groups.setdefault((method, cell["steps"]), []).append(cell)
    runs = []
    for (method, steps), cells in groups.items():
        utilities = [c["metrics"].get("utility") or {} for c in cells]
        runs.append({
            "device": "2 CPU cores", "method": method, "steps": steps, "seeds": len(cells),
            "epsilon": max(c["privacy"]["epsilon"] for c in cells),
            "fd": _mean([c["metrics"].get("fd_classifier") for c in cells]),
            **{k: _mean([u.get(k) for u in utilities]) for k in ("cnn", "mlp", "logreg")},
            "fit_seconds": _mean([c["fit_seconds"] for c in cells]),
        })  # fmt: skip
    return runs


def gpu_runs(path: Path) -> list[dict]:
    """One record per run of a GPU playbook ``summary.json``."""
    summary = json.loads(path.read_text())
    runs = []
    for run in summary["runs"]:
        utility = run["metrics"].get("utility") or {}
        runs.append({
            "device": summary["device"], "method": run["method"], "steps": run["steps"], "seeds": 1,
            "epsilon": run["privacy"]["epsilon"], "fd": run["metrics"].get("fd_classifier"),
            "cnn": utility.get("cnn"), "mlp": utility.get("mlp"), "logreg": utility.get("logreg"),
            "fit_seconds": run["fit_seconds"],
        })  # fmt: skip
    return runs


def _cell(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


def table(runs: list[dict]) -> str:
    """The runs as Markdown, by device, method and length."""
    lines = [
        "| device | method | steps | seeds | ε (largest) | FD (classifier) ↓ | LogReg ↑ | MLP ↑ "
        "| CNN ↑ | fit s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in sorted(runs, key=lambda r: (r["device"], r["method"], r["steps"])):
        cells = [
            run["device"], run["method"], f"{run['steps']:,}", str(run["seeds"]),
            f"{run['epsilon']:.4g}",
            _cell(run["fd"], 4), _cell(run["logreg"]), _cell(run["mlp"]), _cell(run["cnn"]),
            f"{run['fit_seconds']:.0f}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    """CNN accuracy (conditional methods) and classifier FD against steps, log x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, fd_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (method, device), marker in zip(
        sorted({(r["method"], r["device"]) for r in runs}), "osD^v<>", strict=False
    ):
        mine = sorted((r for r in runs if (r["method"], r["device"]) == (method, device)),
                      key=lambda r: r["steps"])  # fmt: skip
        label = f"{method} ({device})"
        with_acc = [r for r in mine if r["cnn"] is not None]
        if with_acc:
            acc_ax.plot([r["steps"] for r in with_acc], [r["cnn"] for r in with_acc],
                        marker=marker, label=label)  # fmt: skip
        with_fd = [r for r in mine if r["fd"] is not None]
        fd_ax.plot([r["steps"] for r in with_fd], [r["fd"] for r in with_fd], marker=marker,
                   label=label)  # fmt: skip
    for method, published in PUBLISHED.items():
        cnn = published.metrics.get("utility_cnn")
        if cnn is not None:
            acc_ax.axhline(cnn, ls=":", lw=1, color="gray")
            acc_ax.annotate(f"{method}, published {cnn:.1%}",
                            (1, cnn), xycoords=("axes fraction", "data"),
                            ha="right", va="bottom", fontsize=7, color="gray")  # fmt: skip
    acc_ax.axhline(0.1, ls="--", lw=1, color="black")
    acc_ax.annotate("chance", (0, 0.1), xycoords=("axes fraction", "data"), fontsize=7)
    acc_ax.set(xscale="log", xlabel="training steps", ylabel="CNN accuracy (real test set)",
               title="Downstream CNN accuracy at ε = 10")  # fmt: skip
    fd_ax.set(xscale="log", xlabel="training steps", ylabel="FD (classifier features) ↓",
              title="Classifier Fréchet distance at ε = 10")  # fmt: skip
    for ax in (acc_ax, fd_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cpu", type=Path, nargs="+", required=True, help="comparison.json of the CPU suites"
    )
    parser.add_argument("--gpu", type=Path, help="a GPU playbook summary.json")
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    args = parser.parse_args(argv)
    runs = cpu_runs(args.cpu, METHODS) + (gpu_runs(args.gpu) if args.gpu else [])
    if not runs:
        parser.error(f"--cpu: no cell of {sorted(METHODS)} at ε = 10")
    args.out.mkdir(parents=True, exist_ok=True)
    plot(runs, args.out / "accuracy_vs_steps.png")
    (args.out / "accuracy_vs_steps.md").write_text(table(runs))
    print(f"{len(runs)} runs → {args.out / 'accuracy_vs_steps.png'}, accuracy_vs_steps.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
