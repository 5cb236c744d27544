"""Time each evaluation metric (docs/evaluation.md) for N generated MNIST-sized samples.

Stand-in for a generator's output: the shipped MNIST test split plus Gaussian noise (σ = 0.3,
clamped to [−1, 1]) with its labels, so every metric sees realistic 1×28×28 images in [−1, 1].
The reference/real set is the clean test split. Timings are wall-clock on the given device.

    python benchmarks/bench_metrics.py                       # CPU, 10,000 samples
    python benchmarks/bench_metrics.py --device cuda --full-cnn
    python benchmarks/bench_metrics.py --threads 1 --json out.json   # on a shared machine

Inception FID is timed on a small batch with *random* weights in the torch-fidelity format (the
standard weights are not available offline here; speed does not depend on the weight values)
and extrapolated to N generated images. Anything estimated rather than run is marked so.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from lightning_dpot.metrics.fid import (
    INCEPTION_WEIGHTS_FILENAME,
    ClassifierFrechetDistance,
    InceptionFID,
    load_or_train_feature_classifier,
)
from lightning_dpot.metrics.utility import FULL, QUICK, downstream_utility
from lightning_dpot.metrics.w2 import subsampled_w2

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist-test"


def read_idx_gz(path: Path) -> np.ndarray:
    data = gzip.decompress(path.read_bytes())
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def timed(results: dict, name: str, fn, note: str = ""):
    start = time.perf_counter()
    value = fn()
    seconds = time.perf_counter() - start
    results[name] = {"seconds": round(seconds, 2), "value": value, "note": note}
    print(f"{name:<42} {seconds:9.2f} s   value={value}   {note}", flush=True)
    return value


def random_inception_weights(folder: Path) -> Path:
    """torch-fidelity InceptionV3 with random init, saved in its weights format."""
    import torch_fidelity.feature_extractor_inceptionv3 as fidelity

    original = (
        fidelity.load_state_dict_from_url,
        fidelity.FeatureExtractorInceptionV3.load_state_dict,
    )
    fidelity.load_state_dict_from_url = lambda *a, **k: {}
    fidelity.FeatureExtractorInceptionV3.load_state_dict = lambda *a, **k: None
    try:
        net = fidelity.FeatureExtractorInceptionV3("inception-v3-compat", ["2048"])
    finally:
        fidelity.load_state_dict_from_url = original[0]
        fidelity.FeatureExtractorInceptionV3.load_state_dict = original[1]
    path = folder / INCEPTION_WEIGHTS_FILENAME
    torch.save(net.state_dict(), path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--num_samples", type=int, default=10_000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--w2_subsample", type=int, default=200)
    parser.add_argument("--w2_repeats", type=int, default=10)
    parser.add_argument("--classifier-epochs", type=int, default=5)
    parser.add_argument("--inception-batch", type=int, default=16)
    parser.add_argument("--full-mlp", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--full-cnn", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch + BLAS threads (default: unchanged)"
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
        threadpool_limits(limits=args.threads)
    device = torch.device(args.device)

    images = torch.from_numpy(
        read_idx_gz(args.data / "t10k-images-idx3-ubyte.gz").astype(np.float32) / 127.5 - 1.0
    ).unsqueeze(1)
    labels = torch.from_numpy(read_idx_gz(args.data / "t10k-labels-idx1-ubyte.gz").astype(np.int64))
    g = torch.Generator().manual_seed(0)
    index = torch.randint(0, images.shape[0], (args.num_samples,), generator=g)
    noise = torch.randn((args.num_samples, *images.shape[1:]), generator=g)
    generated = (images[index] + 0.3 * noise).clamp(-1.0, 1.0)
    generated_labels = labels[index]
    print(
        f"device={device}, threads={torch.get_num_threads()}, N generated={args.num_samples}, "
        f"real={images.shape[0]}",
        flush=True,
    )
    results: dict = {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "num_generated": args.num_samples,
    }

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # --- Fréchet distance on classifier features (fd_classifier) ---------------------------
        cache = tmp / "feature_classifier.pt"

        def train_feature_net() -> None:
            load_or_train_feature_classifier(
                cache, images, labels, epochs=args.classifier_epochs, device=device
            )

        timed(
            results,
            "fd_classifier: train feature net (once)",
            train_feature_net,
            f"<= {args.classifier_epochs} epochs on the 10k test split, cached to file",
        )
        metric = ClassifierFrechetDistance.from_classifier_file(cache).to(device)

        def update(batch_images: torch.Tensor, real: bool) -> None:
            for start in range(0, batch_images.shape[0], 500):
                metric.update(batch_images[start : start + 500].to(device), real=real)

        timed(results, "fd_classifier: real statistics (once)", lambda: update(images, True))

        def fd_generated() -> float:
            metric.reset()
            update(generated, False)
            return round(float(metric.compute()), 4)

        timed(results, "fd_classifier: generated + compute", fd_generated)

        # --- Inception FID (extrapolated from a small batch, random weights) ------------------
        try:
            weights = random_inception_weights(tmp)
            fid = InceptionFID(feature_extractor_weights_path=weights).to(device)
            batch = generated[: args.inception_batch].to(device)
            fid.update(batch, real=False)  # warm-up
            start = time.perf_counter()
            fid.update(batch, real=False)
            per_image = (time.perf_counter() - start) / batch.shape[0]
            estimate = per_image * (args.num_samples + images.shape[0])
            results["fid (inception): N generated + 10k real"] = {
                "seconds": round(estimate, 1),
                "value": None,
                "note": f"ESTIMATED from {batch.shape[0]} images ({per_image:.3f} s/image)",
            }
            print(f"{'fid (inception), estimated':<42} {estimate:9.1f} s   ({per_image:.3f} s/img)")
        except ModuleNotFoundError as error:
            results["fid (inception)"] = {"seconds": None, "value": None, "note": str(error)}

        # --- W2 to raw data ---------------------------------------------------------------------
        timed(
            results,
            f"w2: subsample {args.w2_subsample} x {args.w2_repeats} repeats",
            lambda: tuple(
                round(v, 4)
                for v in subsampled_w2(
                    generated,
                    images,
                    subsample=args.w2_subsample,
                    repeats=args.w2_repeats,
                    generator=torch.Generator().manual_seed(0),
                )
            ),
            "(mean, stderr) of exact W2, pixels in [-1, 1], d = 784",
        )
        large = min(1000, args.num_samples)
        timed(
            results,
            f"w2: subsample {large} x 1 repeat",
            lambda: round(
                subsampled_w2(
                    generated, images, large, 1, generator=torch.Generator().manual_seed(0)
                )[0],
                4,
            ),
        )

        # --- downstream utility -----------------------------------------------------------------
        # Train on the N generated samples, test on the real test split.
        def utility(name: str, settings) -> float:
            return round(
                downstream_utility(
                    generated,
                    generated_labels,
                    images,
                    labels,
                    (name,),
                    settings=settings,
                    device=device,
                )[name],
                4,
            )

        quick_note = (
            f"quick: {QUICK.max_train_samples} samples, <= {QUICK.max_epochs} epochs, "
            f"patience {QUICK.patience}"
        )
        for name in ("logreg", "mlp", "cnn"):
            timed(results, f"utility {name} quick", lambda n=name: utility(n, QUICK), quick_note)
        full = replace(FULL, max_train_samples=None)
        full_note = f"full: all {args.num_samples} samples, patience {FULL.patience}"
        timed(results, "utility logreg full", lambda: utility("logreg", full), full_note)
        if args.full_mlp:
            timed(results, "utility mlp full", lambda: utility("mlp", full), full_note)
        if args.full_cnn:
            timed(results, "utility cnn full", lambda: utility("cnn", full), full_note)
        else:
            one_epoch = replace(FULL, max_epochs=1)
            timed(results, "utility cnn, 1 epoch on all samples", lambda: utility("cnn", one_epoch))
            per_epoch = results["utility cnn, 1 epoch on all samples"]["seconds"]
            minimum = per_epoch * (FULL.patience + 1)
            results["utility cnn full"] = {
                "seconds": None,
                "value": None,
                "note": f"SKIPPED: early stopping needs >= {FULL.patience + 1} epochs x "
                f"~{per_epoch:.0f} s = >= ~{minimum / 60:.0f} min (use --full-cnn)",
            }
            print(f"{'utility cnn full':<42}   {results['utility cnn full']['note']}")

    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    if not math.isfinite(results["fd_classifier: generated + compute"]["value"]):
        raise SystemExit("fd_classifier is not finite")


if __name__ == "__main__":
    main()
