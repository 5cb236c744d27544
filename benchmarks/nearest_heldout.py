"""Mean distance from generated images to their nearest held-out raw image (MNIST, Fashion-MNIST).

For generated samples g_1..g_N and the raw held-out images h_1..h_M of the run's data source
(pixels in [−1, 1], flattened to R^784) it reports

    D = (1/N) Σ_i min_j ‖g_i − h_j‖₂,

for each trained run, for the privatized release itself (the first N released records; also
clipped to [−1, 1], a free post-processing), and for two references that calibrate the scale:
the held-out images against the *other* held-out images (leave-one-out: what real images score)
and a blank image (all −1). D alone rewards blank or average images (on MNIST the blank
reference scores *below* real digits), so it also reports, for each set, the number of distinct
labels among the nearest held-out neighbours and their entropy (diversity), and the coverage
C = (1/M) Σ_j min_i ‖h_j − g_i‖₂ (how far held-out images are from the generated set).

The data section is read from the first run's config.yaml; the cached release is loaded (never
redrawn). Run from the repository root, e.g.

    python benchmarks/nearest_heldout.py \\
        --run entropic=runs/demo/<entropic run>/…/last.ckpt \\
        --run unregularized=runs/demo/<unregularized run>/…/last.ckpt \\
        --num 2000 --seed 0 --grid-dir docs/img --json docs/img/nearest_heldout.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from torch import Tensor

from lightning_dpot.commands.checkpoint import find_run_config, instantiate, load_model


def datamodule_from_run_config(config_path: Path):
    """The run's PrivatizedDataModule (its ``data`` section), set up from the cached release."""
    import lightning as L
    import yaml
    from jsonargparse import ArgumentParser

    section = yaml.safe_load(config_path.read_text())["data"]
    parser = ArgumentParser()
    parser.add_subclass_arguments(L.LightningDataModule, "data")
    datamodule = instantiate(parser, parser.parse_object({"data": section})).data
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule


def nearest_stats(samples: Tensor, heldout: Tensor, labels: Tensor, exclude_self: bool = False):
    """D (mean nearest distance), its std, nearest-label diversity and coverage C."""
    dist = torch.cdist(samples.double(), heldout.double())
    if exclude_self:
        dist.fill_diagonal_(math.inf)
    nearest, index = dist.min(1)
    counts = torch.bincount(labels[index], minlength=10).double()
    freq = counts / counts.sum()
    entropy = float(-(freq[freq > 0] * freq[freq > 0].log()).sum())
    coverage = dist.min(0).values
    return {
        "mean_nearest_distance": float(nearest.mean()),
        "std_nearest_distance": float(nearest.std()) if len(nearest) > 1 else 0.0,
        "distinct_nearest_labels": int((counts > 0).sum()),
        "nearest_label_entropy_nats": entropy,
        "coverage_mean_distance": float(coverage[torch.isfinite(coverage)].mean()),
        "n": len(samples),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, help="NAME=CHECKPOINT")
    parser.add_argument("--num", type=int, default=2000, help="generated samples per run")
    parser.add_argument("--seed", type=int, default=0, help="seed of the latent draws")
    parser.add_argument("--grid-dir", help="write <name>.png grids (64 samples) here")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    runs = dict(item.split("=", 1) for item in args.run)

    datamodule = datamodule_from_run_config(find_run_config(next(iter(runs.values()))))
    heldout = datamodule.test_records.reshape(len(datamodule.test_records), -1)
    labels = datamodule.test_labels
    release = datamodule.transform.inverse(datamodule.release[: args.num])
    flat = release.reshape(len(release), -1)

    results: dict = {
        "heldout": {"n": len(heldout), "split": "raw held-out split of the data source"},
        "privacy": datamodule.privacy_report(),
        "sets": {},
    }
    grids: dict[str, Tensor] = {}
    for name, ckpt in runs.items():
        model, _ = load_model(ckpt)
        torch.manual_seed(args.seed)
        samples = model.sample(args.num)
        results["sets"][name] = {
            "checkpoint": ckpt,
            **nearest_stats(samples.flatten(1), heldout, labels),
        }
        grids[name] = samples[:64]
    results["sets"]["privatized"] = nearest_stats(flat, heldout, labels)
    results["sets"]["privatized_clipped"] = nearest_stats(flat.clamp(-1, 1), heldout, labels)
    grids["privatized"] = release[:64].clamp(-1, 1)
    results["sets"]["reference_heldout_leave_one_out"] = nearest_stats(
        heldout, heldout, labels, exclude_self=True
    )
    results["sets"]["reference_blank_image"] = nearest_stats(
        -torch.ones(1, heldout.shape[1]), heldout, labels
    )

    if args.grid_dir is not None:
        from torchvision.utils import save_image

        from lightning_dpot.callbacks.samples import images_to_grid

        Path(args.grid_dir).mkdir(parents=True, exist_ok=True)
        for name, images in grids.items():
            save_image(images_to_grid(images, nrow=8), Path(args.grid_dir) / f"{name}.png")
    if args.json is not None:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))

    print("| set | mean nearest held-out distance (± std) | distinct NN labels | coverage |")
    print("|---|---|---|---|")
    for name, r in results["sets"].items():
        print(
            f"| {name} | {r['mean_nearest_distance']:.2f} ± {r['std_nearest_distance']:.2f} "
            f"| {r['distinct_nearest_labels']} | {r['coverage_mean_distance']:.2f} |"
        )
    return results


if __name__ == "__main__":
    main()
