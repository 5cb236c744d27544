"""Downstream accuracy against training time of one private run, from the checkpoints it wrote
along the way (e.g. ``configs/dp_sinkhorn/fashion_mnist_cpu30min_eps10.yaml``, which saves one
every 2,000 steps).

    dpot fit --config configs/dp_sinkhorn/fashion_mnist_cpu30min_eps10.yaml
    python benchmarks/accuracy_vs_time.py --run runs/dp_sinkhorn/fashion_mnist_cpu30min_eps10 \\
        --out docs/results/dp_sinkhorn_cpu30min

Each checkpoint is scored by ``dpot evaluate`` (``--metrics utility``, quick mode by default,
4,000 labelled samples, the raw held-out split) and placed at its training time: the checkpoint
file's modification time minus that of the run's ``config.yaml`` (written when the fit starts; a
resumed fit rewrites it, so score runs that were not resumed). Every point is a snapshot of the
one run, whose noise was calibrated once for its planned length; the run as a whole spends its
target ε whichever snapshot is used. Writes ``accuracy_vs_time.json``, ``.md`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

_STEP = re.compile(r"step=(\d+)")


def checkpoints(run: Path) -> list[tuple[int, Path]]:
    """The run's checkpoints with their global step, in step order."""
    found = []
    for path in run.glob("checkpoints/*.ckpt"):
        match = _STEP.search(path.name)
        if match:
            found.append((int(match.group(1)), path))
    if not found:
        raise SystemExit(f"--run {run}: no checkpoints/*step=N*.ckpt in it")
    return sorted(found)


def evaluate(checkpoint: Path, num_samples: int, mode: str) -> dict:
    """``dpot evaluate`` of one checkpoint (utility only); its JSON."""
    command = [
        sys.executable, "-m", "lightning_dpot.cli", "evaluate", "--ckpt_path", str(checkpoint),
        "--metrics", "utility", "--utility_mode", mode, "--num_samples", str(num_samples),
        "--no_report", "--no_progress",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"dpot evaluate {checkpoint} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout)


def plot(rows: list[dict], path: Path, title: str) -> None:
    """The three accuracies against training minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    minutes = [r["minutes"] for r in rows]
    for name in ("cnn", "mlp", "logreg"):
        ax.plot(minutes, [r["utility"].get(name) for r in rows], marker="o", label=name)
    ax.set(xlabel="training time (minutes)", ylabel="accuracy on the real test split")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, help="run directory (config.yaml, checkpoints/)")
    parser.add_argument("--out", required=True, help="folder for the JSON, table and plot")
    parser.add_argument("--num_samples", type=int, default=4000)
    parser.add_argument("--utility_mode", choices=("quick", "full"), default="quick")
    parser.add_argument(
        "--stride", type=int, default=1, help="score every STRIDE-th checkpoint and the last"
    )
    args = parser.parse_args()
    if args.stride < 1:
        parser.error(f"--stride must be an integer >= 1, got {args.stride}")
    run, out = Path(args.run), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = (run / "config.yaml").stat().st_mtime
    rows = []
    found = checkpoints(run)
    chosen = found[args.stride - 1 :: args.stride]
    if chosen[-1:] != found[-1:]:
        chosen.append(found[-1])
    for step, checkpoint in chosen:
        result = evaluate(checkpoint, args.num_samples, args.utility_mode)
        utility = result["results"]["utility"]
        rows.append(
            {
                "step": step,
                "minutes": round((checkpoint.stat().st_mtime - start) / 60.0, 2),
                "utility": {k: utility[k] for k in ("logreg", "mlp", "cnn") if k in utility},
                "checkpoint": checkpoint.name,
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    report = run / "report.json"
    privacy = json.loads(report.read_text()).get("privacy") if report.is_file() else None
    record = {"run": str(run), "utility_mode": args.utility_mode,
              "num_samples": args.num_samples, "privacy": privacy, "rows": rows}  # fmt: skip
    (out / "accuracy_vs_time.json").write_text(json.dumps(record, indent=2, default=str))
    lines = ["| step | minutes | LogReg | MLP | CNN |", "|---|---|---|---|---|"]
    for r in rows:
        u = r["utility"]
        lines.append(
            f"| {r['step']:,} | {r['minutes']:.1f} | {u.get('logreg', float('nan')):.3f} "
            f"| {u.get('mlp', float('nan')):.3f} | {u.get('cnn', float('nan')):.3f} |"
        )
    (out / "accuracy_vs_time.md").write_text("\n".join(lines) + "\n")
    epsilon = f"ε = {privacy['epsilon']:.3g}" if privacy else "ε unknown"
    plot(rows, out / "accuracy_vs_time.png", f"{run.name}: {epsilon} for the whole run")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
