"""DP-MERF on Fashion-MNIST as the authors' own code trains it, scored by this package's evaluator.

Runs https://github.com/ParkLabML/DP-MERF (Harder et al. 2021) from the user's checkout of its
``code_balanced`` folder at ``--authors-code PATH`` (nothing of that code is kept in this
repository), once per seed, as ``mnist_sr_gen.py --data fashion`` runs with its defaults:

* generator: ``models_gen.ConvCondGen(5, "200", 10, "16,8", "5,5")`` (latent 5 ~ N(0, I), a
  one-hot label);
* release: ``rff_mmd_approx.get_rff_losses`` — 10,000 random Fourier features of a Gaussian
  kernel (``rff_sigma`` 127, their Fashion-MNIST default), the class-conditional mean
  embedding of the 60,000 training images plus Gaussian noise of std 2·noise_factor/n;
* training: ``train_single_release``, Adam lr 10⁻², 5 epochs of 600 steps of 100 codes, the
  learning rate times 0.9 after each epoch;
* synthetic data: ``synthesize_mnist_with_uniform_labels``, 60,000 images in eval mode, 6,000
  per class.

The noise factor is this package's σ for the target (ε, δ) in units of the replace-one
sensitivity 2/n (the analytic Gaussian mechanism, Balle & Wang 2018): 0.4999 at (10, 10⁻⁵). Each
run's images are scored as a ``dpot compare`` cell of the quick protocol scores a model: 4,000
of them (a seeded subset), mapped from [0, 1] to [−1, 1], LogReg / MLP / CNN trained on them
(``downstream_utility``, ``QUICK``, seed 0) and tested on the official 10,000 test images.

Loading: ``models_gen``, ``rff_mmd_approx`` and ``data_loading`` import as usual (their imports
need numpy, torchvision and matplotlib). ``mnist_sr_gen.py`` imports their own evaluator at the
top (xgboost and the rest of ``synth_data_benchmark``): from it only ``train_single_release``
and ``synthesize_mnist_with_uniform_labels`` are taken, compiled from their file without running
its imports. Their loader reads torchvision's ``FashionMNIST`` folder; one is built in a
temporary folder from the IDX files of ``--idx-dir``.

    python benchmarks/authors_dp_merf.py --authors-code ~/DP-MERF/code_balanced \\
        --idx-dir /usr/share/datasets/fashion-mnist --seeds 1 2 3 4 5 \\
        --out docs/results/dp_merf_authors_seeds

Writes ``results.json`` and ``results.md`` (one row per seed, then mean ± sample std).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))

from authors_dp_sinkhorn import _definitions  # noqa: E402

REPOSITORY = "https://github.com/ParkLabML/DP-MERF"
IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
N_TRAIN, BATCH, EPOCHS, SCORED = 60_000, 100, 5, 4_000
CLASSIFIERS = ("logreg", "mlp", "cnn")


def torchvision_folder(idx_dir: Path, root: Path) -> Path:
    """``root/FashionMNIST/raw`` with the four IDX files unpacked, as torchvision reads them."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name in IDX_FILES:
        packed = idx_dir / f"{name}.gz"
        if not packed.is_file():
            raise SystemExit(f"--idx-dir: no {packed.name} in {idx_dir}")
        with gzip.open(packed) as src, open(raw / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return root


def load_authors_code(root: Path) -> dict:
    """Their generator, losses, loader, training loop and synthesis, from ``root``."""
    for name in ("mnist_sr_gen.py", "models_gen.py", "rff_mmd_approx.py", "data_loading.py"):
        if not (root / name).is_file():
            raise SystemExit(
                f"--authors-code: no {name} under {root} (the code_balanced folder of {REPOSITORY})"
            )
    sys.path.insert(0, str(root))
    try:
        import numpy as np
        import torch
        from data_loading import get_mnist_dataloaders
        from models_gen import ConvCondGen
        from rff_mmd_approx import get_rff_losses
    except ModuleNotFoundError as err:
        raise SystemExit(
            f"--authors-code: their training needs the module {err.name!r}, which is not installed"
        ) from None
    loop = _definitions(
        root / "mnist_sr_gen.py",
        ("train_single_release", "synthesize_mnist_with_uniform_labels"),
        {"pt": torch, "np": np},
    )
    return {
        "ConvCondGen": ConvCondGen,
        "get_rff_losses": get_rff_losses,
        "get_mnist_dataloaders": get_mnist_dataloaders,
        **loop,
    }


def train(code: dict, data_root: Path, seed: int, noise_factor: float):
    """One run of their ``main()`` for Fashion-MNIST: the 60,000 synthetic images and labels."""
    import numpy as np
    import torch

    torch.manual_seed(seed)
    np.random.seed(seed)
    loader, _ = code["get_mnist_dataloaders"](
        BATCH, 1000, False, dataset="fashion", data_dir=str(data_root)
    )
    generator = code["ConvCondGen"](5, "200", 10, "16,8", "5,5")
    release_loss, _, _ = code["get_rff_losses"](
        loader, 784, 10_000, "127", "cpu", 10, noise_factor, "sphere"
    )
    optimizer = torch.optim.Adam(list(generator.parameters()), lr=0.01)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
    for epoch in range(1, EPOCHS + 1):
        code["train_single_release"](
            generator, "cpu", optimizer, epoch, release_loss, 10**9, BATCH, N_TRAIN
        )
        schedule.step()
    images, labels = code["synthesize_mnist_with_uniform_labels"](generator, "cpu")
    return torch.from_numpy(images), torch.from_numpy(labels).reshape(-1).long()


def score(images, labels, test) -> dict[str, float]:
    """The quick protocol on 4,000 of the images, as a compare cell is scored."""
    import torch

    from lightning_dpot.metrics.utility import QUICK, downstream_utility

    subset = torch.randperm(images.shape[0], generator=torch.Generator().manual_seed(0))[:SCORED]
    x = images[subset].float().reshape(-1, 1, 28, 28) * 2 - 1
    return downstream_utility(
        x, labels[subset], test.test, test.test_labels, CLASSIFIERS, QUICK, seed=0
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--authors-code", type=Path, required=True, help="their code_balanced/")
    parser.add_argument("--idx-dir", type=Path, required=True, help="Fashion-MNIST IDX .gz files")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--epsilon", type=float, default=10.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from lightning_dpot.data import FashionMNIST
    from lightning_dpot.privacy.mechanisms.gaussian import analytic_gaussian_sigma

    noise_factor = analytic_gaussian_sigma(args.epsilon, args.delta, 1.0)
    code = load_authors_code(args.authors_code.expanduser().resolve())
    test = FashionMNIST(idx_dir=str(args.idx_dir), split="official", image_size=28).load()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data_root = torchvision_folder(args.idx_dir, Path(tmp))
        for seed in args.seeds:
            start = time.perf_counter()
            images, labels = train(code, data_root, seed, noise_factor)
            trained = time.perf_counter() - start
            accuracies = score(images, labels, test)
            rows.append({"seed": seed, "train_seconds": round(trained, 1), **accuracies})
            print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for name in CLASSIFIERS:
        values = [r[name] for r in rows]
        summary[name] = (statistics.fmean(values), statistics.stdev(values) if rows[1:] else 0.0)
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "repository": REPOSITORY,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "noise_factor": noise_factor,
        "protocol": f"quick, {SCORED} of the 60,000 synthetic images, official test split",
        "runs": rows,
        "mean_std": summary,
    }
    (args.out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = [
        f"# The authors' DP-MERF on Fashion-MNIST at (ε, δ) = ({args.epsilon:g}, {args.delta:g})",
        "",
        f"Noise factor {noise_factor:.4f}; {record['protocol']}.",
        "",
        "| seed | train s | LogReg | MLP | CNN |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['seed']} | {r['train_seconds']:.0f} | "
        + " | ".join(f"{r[name]:.3f}" for name in CLASSIFIERS)
        + " |"
        for r in rows
    ]
    lines.append(
        "| mean ± std | | "
        + " | ".join(f"{summary[n][0]:.3f} ± {summary[n][1]:.3f}" for n in CLASSIFIERS)
        + " |"
    )
    (args.out / "results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
