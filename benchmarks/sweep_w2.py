"""Sweep driver for Reshetova et al. 2024, Fig. 6 (W2 vs the noise scale σ) and Fig. 7 (W2 vs n).

Each point is one ``dpot fit`` of a config in configs/entropic_wgan with LightningCLI overrides:

* ``sigma``: ``mnist_fig6_w2_vs_sigma_{entropic,unregularized,divergence}.yaml`` with
  ``--data.init_args.noise_scale=σ`` for each σ (Gaussian mechanism, ε derived from Δ2 = 56 and
  δ = 1e-4 and recorded);
* ``n``: ``mnist_fig7_w2_vs_n_entropic.yaml`` (σ = 2) with
  ``--data.init_args.source.init_args.limit=n`` (the source keeps its first n training records;
  ``limit`` caps the held-out split too).

After training, ``--num`` samples are drawn and W2 to the raw data is measured by exact OT on
random subsamples (``lightning_dpot.metrics.w2.subsampled_w2``; the paper uses 200): against
the raw held-out split, and for ``n`` also against the raw training records ("train" curve of
Fig. 7). The latter re-reads the raw training split from the source: an evaluation-only use of
raw data that a real LDP deployment would not have (the trainer itself never sees it).

    python benchmarks/sweep_w2.py sigma --sigmas 1 2 3 4 5 --out runs/fig6
    python benchmarks/sweep_w2.py n --ns 500 1000 2000 4000 8000 --out runs/fig7
    python benchmarks/sweep_w2.py sigma --sigmas 1 2 --max-steps 5 --num 200 --subsample 50 \\
        --repeats 2 --out /tmp/sweep   # a quick check

Writes ``<out>/results.json`` and ``<out>/w2_vs_<sweep>.png``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs" / "entropic_wgan"
LOSSES = ("entropic", "unregularized", "divergence")


def fit(config: Path, overrides: list[str]):
    """One ``dpot fit``; returns the LightningCLI object (trained model and datamodule)."""
    from lightning_dpot.training import run_lightning

    return run_lightning(["fit", "--config", str(config), *overrides])


def measure(cli, num: int, subsample: int, repeats: int, seed: int, with_train: bool) -> dict:
    from lightning_dpot.metrics.w2 import subsampled_w2

    model, datamodule = cli.model, cli.datamodule
    torch.manual_seed(seed)
    samples = model.sample(num).flatten(1)
    generator = torch.Generator().manual_seed(seed)
    test = datamodule.test_records.flatten(1)
    m = min(subsample, len(samples), len(test))
    w2_test, se_test = subsampled_w2(samples, test, m, repeats, generator)
    out = {
        "epsilon": datamodule.mechanism.epsilon,
        "noise_scale": datamodule.mechanism.noise_scale,
        "n_train": len(datamodule.release),
        "w2_test": w2_test,
        "w2_test_stderr": se_test,
        "global_step": cli.trainer.global_step,
    }
    if with_train:
        raw_train = datamodule.source.load().train.flatten(1)  # evaluation only, see docstring
        m = min(subsample, len(samples), len(raw_train))
        out["w2_train"], out["w2_train_stderr"] = subsampled_w2(
            samples, raw_train, m, repeats, generator
        )
    return out


def plot(results: list[dict], sweep: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    if sweep == "sigma":
        for loss in sorted({r["loss"] for r in results}):
            rows = sorted((r for r in results if r["loss"] == loss), key=lambda r: r["sigma"])
            ax.errorbar(
                [r["sigma"] for r in rows],
                [r["w2_test"] for r in rows],
                yerr=[r["w2_test_stderr"] for r in rows],
                marker="o",
                label=loss,
            )
        ax.set_xlabel("noise scale σ")
    else:
        rows = sorted(results, key=lambda r: r["n"])
        for key in ("w2_train", "w2_test"):
            ax.errorbar(
                [r["n"] for r in rows],
                [r[key] for r in rows],
                yerr=[r[f"{key}_stderr"] for r in rows],
                marker="o",
                label=key.removeprefix("w2_"),
            )
        ax.set_xscale("log")
        ax.set_xlabel("number of privatized training records n")
    ax.set_ylabel("W2 to raw data (subsampled, exact OT)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", choices=["sigma", "n"])
    parser.add_argument("--sigmas", type=float, nargs="+", default=[1.0, 2.0, 3.0, 4.0, 5.0])
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    parser.add_argument("--ns", type=int, nargs="+", default=[500, 1000, 2000, 4000, 8000])
    parser.add_argument("--max-epochs", type=int, help="override trainer.max_epochs")
    parser.add_argument("--max-steps", type=int, help="override trainer.max_steps")
    parser.add_argument("--num", type=int, default=2000, help="generated samples per point")
    parser.add_argument("--subsample", type=int, default=200, help="W2 subsample size m")
    parser.add_argument("--repeats", type=int, default=10, help="W2 subsample repeats")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-seed", type=int, help="public noise seed (default: secret)")
    parser.add_argument("--out", default="runs/sweep_w2")
    parser.add_argument("overrides", nargs="*", help="extra LightningCLI overrides (--a.b=c)")
    args, extra = parser.parse_known_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    common = [
        *args.overrides,
        *extra,
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
    ]
    common += ["--trainer.enable_checkpointing=false", f"--seed_everything={args.seed}"]
    if args.max_epochs is not None:
        common.append(f"--trainer.max_epochs={args.max_epochs}")
    if args.max_steps is not None:
        common.append(f"--trainer.max_steps={args.max_steps}")
    if args.data_seed is not None:
        common.append(f"--data.init_args.seed={args.data_seed}")

    if args.sweep == "sigma":
        points = [
            (
                {"loss": loss, "sigma": s},
                CONFIGS / f"mnist_fig6_w2_vs_sigma_{loss}.yaml",
                [f"--data.init_args.noise_scale={s}"],
            )
            for loss in args.losses
            for s in args.sigmas
        ]
    else:
        points = [
            (
                {"n": n},
                CONFIGS / "mnist_fig7_w2_vs_n_entropic.yaml",
                [f"--data.init_args.source.init_args.limit={n}"],
            )
            for n in args.ns
        ]

    results = []
    for tag, config, point_overrides in points:
        name = "_".join(f"{k}{v}" for k, v in tag.items())
        cli = fit(config, [*common, *point_overrides, f"--trainer.default_root_dir={out / name}"])
        row = {**tag, "config": config.name}
        row.update(
            measure(cli, args.num, args.subsample, args.repeats, args.seed, args.sweep == "n")
        )
        results.append(row)
        print(json.dumps(row), flush=True)
        (out / "results.json").write_text(json.dumps(results, indent=2))
    plot(results, args.sweep, out / f"w2_vs_{args.sweep}.png")
    return results


if __name__ == "__main__":
    main()
