"""Step time of DP-Sinkhorn (paper 002) on MNIST-shaped data, split into its parts.

Settings: the paper's conditional DCGAN (D.3), p = 0.4, λ = 0.05, α_c = 15, m = 1;
batch n = 50 private (paper MNIST setting: n + n' = 70 generated rows, hook on) and n = 500
non-private (700 generated rows, no hook). Real batches are random images of the expected size.
One step = generator forward, semi-debiased loss, backward through the sanitizing hook and the
generator, Adam step. Reports the median over ``--steps`` timed steps after warm-up, and the
median time of each part (forward / loss / backward+hook / optimizer).

Run: python benchmarks/bench_dp_sinkhorn_step.py [--device cuda] [--threads 1] [--steps 20]
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from lightning_dpot.nn.dcgan import ConditionalDCGANGenerator
from lightning_dpot.ot.dp_sinkhorn import SemiDebiasedSinkhorn, debias_rows, mixed_cost_diameter
from lightning_dpot.privacy.gradient_sanitizer import GradientSanitizer


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def bench(n: int, private: bool, device: torch.device, steps: int, warmup: int) -> dict:
    gen = ConditionalDCGANGenerator(10).to(device)
    opt = torch.optim.Adam(gen.parameters(), lr=1e-4, weight_decay=2e-5)
    loss_fn = SemiDebiasedSinkhorn(
        entropic_reg=0.05,
        l1_weight=1.0,
        debias_fraction=0.4,
        num_classes=10,
        class_weight=15.0,
        diameter=mixed_cost_diameter(784, 2.0, 1.0, 15.0),
    )
    sanitizer = GradientSanitizer(0.5, 1.5, sample_rate=1 / 1200) if private else None
    n_total = n + debias_rows(n, 0.4)
    g = torch.Generator(device="cpu").manual_seed(0)
    real = (torch.rand(n, 1, 28, 28, generator=g) * 2 - 1).to(device)
    real_labels = torch.randint(10, (n,), generator=g).to(device)
    parts: dict[str, list[float]] = {"forward": [], "loss": [], "backward": [], "optimizer": []}
    totals = []
    for i in range(warmup + steps):
        _sync(device)
        t0 = time.perf_counter()
        z = torch.rand(n_total, 12, device=device)
        labels = torch.randint(10, (n_total,), device=device)
        fake = gen(z, labels)
        if sanitizer is not None:
            fake.register_hook(lambda grad: sanitizer(grad, n))
        _sync(device)
        t1 = time.perf_counter()
        loss = loss_fn(fake, real, n, labels, real_labels)
        _sync(device)
        t2 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        _sync(device)
        t3 = time.perf_counter()
        opt.step()
        _sync(device)
        t4 = time.perf_counter()
        if i >= warmup:
            for key, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                parts[key].append(dt * 1e3)
            totals.append((t4 - t0) * 1e3)
    step_ms = statistics.median(totals)
    return {
        "batch_n": n,
        "generated_rows": n_total,
        "private": private,
        "step_ms_median": round(step_ms, 3),
        "steps_per_s": round(1e3 / step_ms, 2),
        "parts_ms_median": {k: round(statistics.median(v), 3) for k, v in parts.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    results = [
        bench(50, True, device, args.steps, args.warmup),
        bench(500, False, device, args.steps, args.warmup),
    ]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        json.dumps(
            {
                "device": name,
                "torch_threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
