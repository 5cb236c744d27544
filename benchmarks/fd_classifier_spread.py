"""How much the classifier Fréchet distance depends on the feature classifier's weights.

The same sample files are scored on feature classifiers trained as the evaluators train theirs
(``train_feature_classifier``: 5 epochs on the official 10,000 Fashion-MNIST test images, 32×32)
with different seeds and torch thread counts, against the same test images:

    dpot sample --ckpt_path CELL/checkpoints/LAST.ckpt --num_samples 4000 --seed 0 \\
        --output dpswflow.pt
    python benchmarks/fd_classifier_spread.py --idx-dir /usr/share/datasets/fashion-mnist \\
        --samples dpswflow.pt dp_merf.pt ... --out docs/results/fd_classifier_spread

The first 4,000 training images are scored beside them (a generator equal to the data). Writes
``fd_classifier_spread.json`` and ``.md``: one row per classifier, one column per sample file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from lightning_dpot.data import FashionMNIST
from lightning_dpot.metrics.evaluators import FrechetEvaluator
from lightning_dpot.metrics.fid import load_or_train_feature_classifier

#: (training seed, torch threads) of each feature classifier.
CLASSIFIERS = ((0, 2), (0, 1), (1, 2), (2, 2), (3, 2))


def write_table(rows: list[dict], path: Path) -> None:
    """One row per classifier, one column per sample set."""
    names = list(rows[0]["fd"])
    lines = [
        "| classifier seed | threads | weights sha256 | " + " | ".join(names) + " |",
        "|---|---|---|" + "---|" * len(names),
    ]
    for row in rows:
        values = " | ".join(f"{row['fd'][name]:.4g}" for name in names)
        lines.append(f"| {row['seed']} | {row['threads']} | {row['features_sha256']} | {values} |")
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idx-dir", type=Path, required=True, help="Fashion-MNIST IDX .gz files")
    parser.add_argument("--samples", type=Path, nargs="+", required=True, help="dpot sample .pt")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    data = FashionMNIST(idx_dir=str(args.idx_dir), split="official", image_size=32).load()
    sets = {path.stem: torch.load(path) for path in args.samples}
    sets["training images"] = data.train[:4000]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed, threads in CLASSIFIERS:
        torch.set_num_threads(threads)
        path = args.out / f"classifier_seed{seed}_threads{threads}.pt"
        load_or_train_feature_classifier(path, data.test, data.test_labels, epochs=5, seed=seed)
        evaluator = FrechetEvaluator("classifier", classifier_path=str(path))
        evaluator.set_reference(data.test, data.test_labels)
        fd = {name: evaluator.score(x)["fd_classifier"] for name, x in sets.items()}
        rows.append({"seed": seed, "threads": threads, **evaluator.describe(), "fd": fd})
        path.unlink()  # 2 MB each; the digest names it
        print(json.dumps(rows[-1]["fd"]), flush=True)
    (args.out / "fd_classifier_spread.json").write_text(json.dumps(rows, indent=1) + "\n")
    write_table(rows, args.out / "fd_classifier_spread.md")


if __name__ == "__main__":
    main()
