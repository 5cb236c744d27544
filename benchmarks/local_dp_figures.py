"""Reshetova et al. 2024, Figs. 11, 13 and 14 on Fashion-MNIST: train each panel, sample, score.

    python benchmarks/local_dp_figures.py --variant cpu_demo --out docs/results/local_dp_figures_cpu
    python benchmarks/local_dp_figures.py --variant paper --device gpu --parallel 1 \\
        --out docs/results/local_dp_figures_gpu

Each panel is one config of ``configs/entropic_wgan/`` (``--variant paper``: the paper's
settings, batch 6,000 and 100 epochs; ``--variant cpu_demo``: the ``*_cpu_demo`` files, whose
headers say what they change to fit 20 CPU minutes). The panels are

- Fig. 11: Laplace b = 7 on raw pixels (ε = 224 per record), the noisy 1-WGAN (a, eq. 23)
  against the entropic 1-WGAN (b);
- Fig. 13: Laplace b = 7 in the DCT domain after an ℓ1 projection, ε = 100 (a) and 78.57 (b);
- Fig. 14: Gaussian after an ℓ2 projection, (ε, δ) = (35, 1e-4) (a) and (25, 1e-4) (b).

**Fit.** ``dpot fit`` per panel, ``--parallel`` at a time, each with ``--threads`` torch threads,
its runs under ``--runs-dir`` (``--set KEY=VALUE`` adds a config override to every fit). The
release is drawn from the public seed ``--release-seed`` (the report then says
``seed_is_public: true``; the panels of Fig. 11 share one release), so that the figure can be
reproduced; a real release leaves the seed out. A panel whose fit finished with the same command
line before (``<runs-dir>/<config>.json``) is not fitted again.

**Score.** From each run's checkpoint, ``--num_samples`` samples drawn with ``--seed``:

- the classifier Fréchet distance to the raw held-out test split (``dpot evaluate --metrics fid
  --feature_extractor classifier``: features of a classifier trained on that split; it is *not*
  FID, and the paper's FIDs are listed beside it, not compared with it);
- the mean ℓ2 distance to the nearest held-out image, its label diversity and the coverage
  (``benchmarks/nearest_heldout.py``), with the same numbers for the privatized release (raw and
  clipped to [−1, 1]) and for held-out images against each other;
- a grid of the first 64 samples and one of the release.

**Write** ``--out``: ``results.json`` (machine, variant, every panel: config, privacy, steps,
wall time, scores, the paper's FID) and ``results.md`` (the table), ``<figure>/<panel>.png`` and
``<figure>/<panel>_privatized.png``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
ROOT = BENCHMARKS.parent
CONFIGS = ROOT / "configs" / "entropic_wgan"


@dataclass(frozen=True)
class Panel:
    """One panel of a figure: its config (paper variant) and the FID the paper reports."""

    figure: str
    panel: str
    config: str
    label: str
    paper_fid: float


PANELS = (
    Panel("fig11", "a", "fashion_fig11_laplace_b7_noisy", "noisy 1-WGAN, ε = 224", 318),
    Panel("fig11", "b", "fashion_fig11_laplace_b7_entropic", "entropic 1-WGAN, ε = 224", 208),
    Panel(
        "fig13",
        "a",
        "fashion_fig13_laplace_dct_l1radius350_b7_entropic",
        "entropic 1-WGAN, DCT, ε = 100",
        183,
    ),
    Panel(
        "fig13",
        "b",
        "fashion_fig13_laplace_dct_l1radius275_b7_entropic",
        "entropic 1-WGAN, DCT, ε = 78.57",
        214,
    ),
    Panel(
        "fig14",
        "a",
        "fashion_fig14_gaussian_l2radius20_eps35_entropic",
        "entropic 2-WGAN, (35, 1e-4)",
        207,
    ),
    Panel(
        "fig14",
        "b",
        "fashion_fig14_gaussian_l2radius20_eps25_entropic",
        "entropic 2-WGAN, (25, 1e-4)",
        237,
    ),
)


def config_name(panel: Panel, variant: str) -> str:
    return panel.config + ("_cpu_demo" if variant == "cpu_demo" else "")


def max_time(minutes: float) -> str:
    """Lightning's ``DD:HH:MM:SS`` for a limit in minutes, rounded to the second."""
    seconds = round(minutes * 60)
    days, seconds = divmod(seconds, 86_400)
    hours, seconds = divmod(seconds, 3_600)
    return f"{days:02d}:{hours:02d}:{seconds // 60:02d}:{seconds % 60:02d}"


def config_digest(name: str) -> str:
    """sha256 of the panel's config composed with its ``__base__`` fragments: an edited file
    (or fragment) is a new config, whose earlier run is not reused."""
    from lightning_dpot.config import compose_config

    composed = compose_config(CONFIGS / f"{name}.yaml")
    return hashlib.sha256(json.dumps(composed, sort_keys=True).encode()).hexdigest()


def fit_command(name: str, args: argparse.Namespace) -> list[str]:
    """The ``dpot fit`` call of one panel."""
    command = [
        "dpot",
        "fit",
        "--config",
        str(CONFIGS / f"{name}.yaml"),
        "--trainer.enable_progress_bar=false",
        f"--trainer.logger.init_args.save_dir={args.runs_dir}",
        f"--data.init_args.seed={args.release_seed}",
    ]
    if args.device != "auto":
        command.append(f"--trainer.accelerator={args.device}")
    if args.max_minutes is not None:
        command.append(f"--trainer.max_time={max_time(args.max_minutes)}")
    if args.data_dir is not None:
        command.append(f"--data.init_args.source.init_args.idx_dir={args.data_dir}")
    return command + [f"--{item}" for item in args.set]


def fit(name: str, args: argparse.Namespace) -> dict:
    """Fit one panel, or reuse the run that the same command on the same config made before."""
    marker = Path(args.runs_dir) / f"{name}.json"
    command, digest = fit_command(name, args), config_digest(name)
    if marker.exists():
        done = json.loads(marker.read_text())
        same = done["command"] == command and done.get("config_sha256") == digest
        if same and Path(done["run_dir"], "report.json").exists():
            print(f"{name}: reusing {done['run_dir']}", flush=True)
            return done
    log = Path(args.runs_dir) / f"{name}.log"
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    print(f"{name}: {shlex.join(command)}", flush=True)
    start = time.time()
    with log.open("w") as out:
        status = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    if status.returncode != 0:
        raise RuntimeError(f"{name}: dpot fit exited {status.returncode}; see {log}")
    lines = [line for line in log.read_text().splitlines() if line.startswith("run directory: ")]
    if not lines:
        raise RuntimeError(f"{name}: dpot fit printed no run directory; see {log}")
    done = {
        "command": command,
        "config_sha256": digest,
        "run_dir": lines[-1].removeprefix("run directory: ").strip(),
        "wall_seconds": round(time.time() - start, 1),
        "threads": args.threads,
    }
    marker.write_text(json.dumps(done, indent=2))
    return done


def classifier_fd(ckpt: Path, args: argparse.Namespace) -> float:
    """Classifier Fréchet distance of the run's samples to the raw held-out split."""
    from lightning_dpot.commands.evaluate import build_parser, evaluate

    parser = build_parser(argparse.ArgumentParser())
    options = parser.parse_args(
        [
            "--ckpt_path",
            str(ckpt),
            "--metrics",
            "fid",
            "--feature_extractor",
            "classifier",
            "--num_samples",
            str(args.num_samples),
            "--seed",
            str(args.seed),
            "--device",
            {"gpu": "cuda"}.get(args.device, args.device),
            "--no_progress",
        ]
    )
    return float(evaluate(options)["results"]["fd_classifier"]["fd_classifier"])


def score(panel: Panel, done: dict, args: argparse.Namespace) -> dict:
    """Scores, grids and facts of one fitted panel."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    from nearest_heldout import main as nearest_heldout

    from lightning_dpot.commands.checkpoint import find_checkpoint

    run_dir = Path(done["run_dir"])
    ckpt = find_checkpoint(run_dir)
    report = json.loads((run_dir / "report.json").read_text())
    grid_dir = Path(args.out) / panel.figure
    nearest = nearest_heldout(
        ["--run", f"{panel.panel}={ckpt}", "--num", str(args.num_samples), "--seed", str(args.seed)]
        + ["--grid-dir", str(grid_dir)]
    )
    (grid_dir / "privatized.png").replace(grid_dir / f"{panel.panel}_privatized.png")
    privacy = report["privacy"]
    return {
        "figure": panel.figure,
        "panel": panel.panel,
        "label": panel.label,
        "config": f"configs/entropic_wgan/{config_name(panel, args.variant)}.yaml",
        "mechanism": privacy["mechanism"],
        "epsilon": privacy["epsilon"],
        "delta": privacy["delta"],
        "release_seed": args.release_seed,
        "seed_is_public": privacy["seed_is_public"],
        "noise_scale": privacy["noise_scale"],
        "steps": report["global_step"],
        "epochs": report["epochs"],
        "fit_command": done["command"],
        "fit_wall_seconds": done.get("wall_seconds"),
        "threads": done.get("threads"),
        "fd_classifier": classifier_fd(ckpt, args),
        "paper_fid": panel.paper_fid,
        "nearest_heldout": nearest["sets"],
    }


#: The options every panel of one table shares.
SETTINGS = ("variant", "num_samples", "seed", "release_seed", "max_minutes", "set", "data_dir")


def settings(args: argparse.Namespace) -> dict:
    return {key: getattr(args, key) for key in SETTINGS}


def merged(path: Path, rows: list[dict], args: argparse.Namespace) -> list[dict]:
    """``rows`` with the other panels of an earlier call into the same ``--out`` with the same
    ``SETTINGS``, in the order of ``PANELS``: one figure per call adds up."""
    previous: list[dict] = []
    if path.exists():
        earlier = json.loads(path.read_text())
        if earlier.get("settings") == settings(args):
            previous = earlier["panels"]
    new = {(row["figure"], row["panel"]) for row in rows}
    order = {(p.figure, p.panel): i for i, p in enumerate(PANELS)}
    kept = [row for row in previous if (row["figure"], row["panel"]) not in new]
    return sorted(kept + rows, key=lambda row: order[row["figure"], row["panel"]])


def table(rows: list[dict]) -> str:
    """The markdown table of ``results.md``."""
    lines = [
        "| figure | panel | ε per record | steps | classifier FD ↓ | nearest held-out ↓ "
        "| distinct NN labels | coverage ↓ | release, clipped: nearest / coverage | paper FID |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        mine, release = row["nearest_heldout"][row["panel"]], row["nearest_heldout"]
        clipped = release["privatized_clipped"]
        lines.append(
            f"| {row['figure']} | ({row['panel']}) {row['label']} | {row['epsilon']:.4g} "
            f"| {row['steps']} | {row['fd_classifier']:.1f} "
            f"| {mine['mean_nearest_distance']:.2f} ± {mine['std_nearest_distance']:.2f} "
            f"| {mine['distinct_nearest_labels']} | {mine['coverage_mean_distance']:.2f} "
            f"| {clipped['mean_nearest_distance']:.2f} / {clipped['coverage_mean_distance']:.2f} "
            f"| {row['paper_fid']:g} |"
        )
    public = sorted({row["release_seed"] for row in rows if row["seed_is_public"]})
    if public:
        lines.append(
            f"\nThe releases were drawn from the public seed {', '.join(map(str, public))} so "
            "that they can be reproduced: anyone can then recompute the noise, and the ε above "
            "holds only for a release drawn from a secret seed (the default of `dpot fit`)."
        )
    reference = rows[0]["nearest_heldout"]["reference_heldout_leave_one_out"]
    blank = rows[0]["nearest_heldout"]["reference_blank_image"]
    lines.append(
        f"\nReferences: held-out images against the other held-out images, nearest "
        f"{reference['mean_nearest_distance']:.2f} ± {reference['std_nearest_distance']:.2f}; "
        f"one blank image (all −1), nearest {blank['mean_nearest_distance']:.2f}, coverage "
        f"{blank['coverage_mean_distance']:.2f} (the nearest distance alone rewards blank images)."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=("cpu_demo", "paper"), default="cpu_demo")
    parser.add_argument("--figures", nargs="+", choices=("fig11", "fig13", "fig14"), default=None)
    parser.add_argument("--out", required=True, help="results, tables and grids")
    parser.add_argument("--runs-dir", default="runs/local_dp_figures", help="the fitted runs")
    parser.add_argument("--parallel", type=int, default=2, help="fits at a time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per fit")
    parser.add_argument("--device", default="auto", help="trainer accelerator: auto | cpu | gpu")
    parser.add_argument("--max-minutes", type=float, help="training time limit per panel")
    parser.add_argument("--data-dir", help="directory of the Fashion-MNIST IDX files")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override given to every fit, e.g. trainer.max_steps=500 (repeatable)",
    )
    parser.add_argument("--release-seed", type=int, default=0, help="public seed of the release")
    parser.add_argument("--num_samples", type=int, default=2000, help="samples scored per panel")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample draws")
    args = parser.parse_args(argv)
    if args.parallel < 1 or args.threads < 1:
        parser.error("--parallel and --threads must be at least 1")
    if args.max_minutes is not None and round(args.max_minutes * 60) < 1:
        parser.error(f"--max-minutes must be at least one second, got {args.max_minutes}")
    panels = [p for p in PANELS if args.figures is None or p.figure in args.figures]
    Path(args.runs_dir).mkdir(parents=True, exist_ok=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)

    names = [config_name(panel, args.variant) for panel in panels]
    with ThreadPoolExecutor(args.parallel) as pool:
        fitted = list(pool.map(lambda name: fit(name, args), names))

    import torch

    machine = {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
    }
    rows = []
    for panel, done in zip(panels, fitted, strict=True):
        row = score(panel, done, args)
        rows.append({**row, "machine": {**machine, "load_average": os.getloadavg()}})
    results = {
        "settings": settings(args),
        "panels": merged(Path(args.out) / "results.json", rows, args),
    }
    out = Path(args.out)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (out / "results.md").write_text(table(results["panels"]))
    print(table(results["panels"]))
    return results


if __name__ == "__main__":
    main()
