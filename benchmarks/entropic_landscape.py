"""How much the entropic loss separates digits from the mean digit and from fitted noise.

On the shipped MNIST test split (seeded 8,000 / 2,000 split), Gaussian LDP (ε, δ) = (35, 1e-4),
σ = 10.145 per pixel, it evaluates the entropic 2-WGAN loss of Reshetova et al. 2024,

    L(S) = W_{2,λ}(S, Y),   λ = 2σ²,   Y = the whole release (8,000 records),

for reference sets S: the raw training digits (all of them, and random sets of 400), the mean
raw digit, the ten class means, and **free atoms**: K points in [−1, 1]^784 moved by the
fixed-point iteration of the loss (each atom to the barycentre of the released records it is
coupled with, x_i ← Σ_j π_ij y_j / a_i, then clipped to the pixel range). Free atoms are what an
unconstrained generator with K distinct outputs can reach; their loss shows whether the finite
release rewards digits or fitted noise. A grid of the atoms is saved with ``--grid-dir``.

This is an analysis of the loss, so it reads the raw training digits of public MNIST; training
never does. The release is the cached one of the given seed (never redrawn).

    python benchmarks/entropic_landscape.py --json docs/results/entropic_landscape.json \\
        --grid-dir docs/img/mnist_fig3_gaussian
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import Tensor

from lightning_dpot.data import MNIST, PrivatizedDataModule
from lightning_dpot.ot import EntropicOT

REPO = Path(__file__).resolve().parents[1]
MNIST_TEST = REPO.parent / "shared" / "data" / "mnist-test"


def free_atoms(loss: EntropicOT, release: Tensor, start: Tensor, iterations: int) -> Tensor:
    """Fixed-point iteration x_i ← clip(barycentre of the records coupled with x_i).

    For the cost ‖x − y‖² and uniform weights a_i = 1/K, ∂L/∂x_i = 2 a_i (x_i − ŷ_i) with
    ŷ_i = Σ_j π_ij y_j / a_i, so ŷ_i = x_i − (K/2) ∂L/∂x_i.
    """
    atoms = start.clone()
    for _ in range(iterations):
        atoms.requires_grad_(True)
        (grad,) = torch.autograd.grad(loss(atoms, release), atoms)
        with torch.no_grad():
            atoms = (atoms - 0.5 * len(atoms) * grad).clamp(-1.0, 1.0)
    return atoms.detach()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="release seed (public, for the study)")
    parser.add_argument("--atoms", type=int, nargs="+", default=[10, 400])
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--draws", type=int, default=5, help="random sets of 400 raw digits")
    parser.add_argument("--cache-dir", default=str(REPO / ".dpot_cache"))
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--grid-dir", help="save free_atoms_K{K}.png here")
    args = parser.parse_args(argv)

    source = MNIST(idx_dir=str(MNIST_TEST), split="test-only")
    datamodule = PrivatizedDataModule(
        source, "gaussian", epsilon=35.0, delta=1e-4, seed=args.seed, cache_dir=args.cache_dir
    )
    datamodule.prepare_data()
    datamodule.setup("fit")
    release = datamodule.release.reshape(len(datamodule.release), -1)
    sigma = datamodule.mechanism.noise_scale
    loss = EntropicOT(2, 2 * sigma**2, datamodule.support_diameter(2), scaling=0.95)
    splits = source.load()
    raw, labels = splits.train.reshape(len(splits.train), -1), splits.train_labels
    generator = torch.Generator().manual_seed(0)

    def value(points: Tensor) -> float:
        with torch.no_grad():
            return float(loss(points.contiguous(), release))

    results: dict = {
        "release": {"n": len(release), "sigma": sigma, "entropic_reg": 2 * sigma**2},
        "loss": {},
    }
    out = results["loss"]
    out["raw_training_digits_all"] = value(raw)
    subsets = (torch.randperm(len(raw), generator=generator)[:400] for _ in range(args.draws))
    draws = [value(raw[subset]) for subset in subsets]
    out["raw_training_digits_400"] = {"mean": sum(draws) / len(draws), "values": draws}
    out["mean_raw_digit"] = value(raw.mean(0).expand(400, -1))
    out["class_means"] = value(torch.stack([raw[labels == c].mean(0) for c in range(10)]))
    out["release_mean_clipped"] = value(release.mean(0).clamp(-1, 1).expand(400, -1))
    for k in args.atoms:
        start_time = time.perf_counter()
        start = release.mean(0) + 0.3 * torch.randn(k, release.shape[1], generator=generator)
        atoms = free_atoms(loss, release, start.clamp(-1, 1), args.iterations)
        out[f"free_atoms_{k}"] = {
            "loss": value(atoms),
            "iterations": args.iterations,
            "seconds": time.perf_counter() - start_time,
            "mean_pixel_std_across_atoms": float(atoms.std(0).mean()) if k > 1 else 0.0,
        }
        if args.grid_dir:
            from torchvision.utils import save_image

            images = atoms[:64].reshape(-1, 1, 28, 28) * 0.5 + 0.5
            save_image(images, Path(args.grid_dir) / f"free_atoms_K{k}.png", nrow=min(k, 8))
        print(f"free atoms K={k}: loss {out[f'free_atoms_{k}']['loss']:.1f}", flush=True)
    for key, val in out.items():
        print(f"{key}: {val['mean'] if isinstance(val, dict) and 'mean' in val else val}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
