"""What converged solves do to DP-Sinkhorn training: a short MNIST run with this package's loss
against the loss of ``--old-rev`` (Sinkhorn sweeps capped at 2,000, unconverged at λ = 0.05),
same seeds, same batches, same noise.

Data: the official MNIST test split (10,000 images, ``--idx-dir``), split 9,000 / 1,000 by the
source's seeded ``test-only`` mode; the run trains on the 9,000 and scores on the 1,000.
Settings (Cao et al. 2021, App. D.3): conditional DCGAN, Adam 1e-4, weight decay 2e-5, Poisson
batches of expected size 50, n = 50 + 20 generated rows, λ = 0.05, m = 1, α_c = 15; with
``--private`` the gradient is clipped to Δ = 0.5 and noised with σ = 1.5 (the sanitizer of the
package, one seed for both sides). Every ``--every`` steps: the exact W₂ between 200 generated and
200 held-out images (mean of 5 draws, pixel units) and the relative error of that step's loss
gradient w.r.t. the generated images against a float64 reference plan.

    python benchmarks/dp_sinkhorn_training_effect.py --idx-dir ../shared/data/mnist-test \\
        --steps 400 --every 100 [--private]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from revision import load_revision  # noqa: E402

OLD_REV = "b8dc265"


def _reference_gradient(fake, labels, real, real_labels, n: int, n_prime: int, reg: float):
    import torch

    from lightning_dpot.ot import MixedL2L1Cost, entropic_plan_newton
    from lightning_dpot.ot.dp_sinkhorn import class_conditional_features

    cost = MixedL2L1Cost(1.0)
    x = fake.double().requires_grad_(True)
    fx = class_conditional_features(x, labels, 10, 15.0)
    fy = class_conditional_features(real.double(), real_labels, 10, 15.0)
    total = x.new_zeros(())
    pairs = [(-1.0, fx[:n], fx[n_prime:])] + ([(2.0, fx[:n], fy)] if len(fy) else [])
    for weight, a, b in pairs:
        plan = entropic_plan_newton(a.detach(), b.detach(), 2, reg, cost_fn=cost)
        total = total + weight * (plan * cost(a, b)).sum()
    return torch.autograd.grad(total, x)[0]


def train(name: str, loss_fn, splits, args) -> dict:
    import torch

    from lightning_dpot.metrics.evaluators import W2Evaluator
    from lightning_dpot.nn.dcgan import ConditionalDCGANGenerator
    from lightning_dpot.privacy.mechanisms.gradient_sanitizer import GradientSanitizer

    torch.manual_seed(0)
    gen = ConditionalDCGANGenerator(10)
    opt = torch.optim.Adam(gen.parameters(), lr=1e-4, weight_decay=2e-5)
    records, labels_all = splits.train, splits.train_labels
    q = 50 / len(records)
    sanitizer = GradientSanitizer(0.5, 1.5, noise_seed=1, sample_rate=q) if args.private else None
    sampling = torch.Generator().manual_seed(2)
    n, n_prime = 50, 20
    w2 = W2Evaluator(200, 5, seed=0)
    curve, seconds = [], 0.0
    for step in range(args.steps + 1):
        take = torch.rand(len(records), generator=sampling) < q
        real, real_labels = records[take], labels_all[take]
        z = torch.rand(n + n_prime, 12, generator=sampling)
        labels = torch.randint(10, (n + n_prime,), generator=sampling)
        start = time.perf_counter()
        fake = gen(z, labels)
        seen: list = []
        fake.register_hook(lambda g, seen=seen: seen.append(g.detach().clone()))
        if sanitizer is not None:
            fake.register_hook(lambda g: sanitizer(g, n))
        loss = loss_fn(fake, real, n, labels, real_labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        seconds += time.perf_counter() - start
        if step % args.every == 0:
            ref = _reference_gradient(fake.detach(), labels, real, real_labels, n, n_prime, 0.05)
            error = float((seen[0].double() - ref).norm() / ref.norm())
            with torch.no_grad():
                gen.eval()
                sample = gen(torch.rand(1000, 12), torch.randint(10, (1000,)))
                gen.train()
            score = w2.score(sample.reshape(1000, -1), splits.test.reshape(len(splits.test), -1))
            curve.append(
                {"step": step, "w2": round(score["w2"], 3), "gradient_error": round(error, 4)}
            )
            print(name, curve[-1], file=sys.stderr, flush=True)
    return {"side": name, "curve": curve, "train_seconds": round(seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idx-dir", required=True)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--private", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--old-rev", default=OLD_REV)
    args = parser.parse_args()
    old = load_revision(args.old_rev)
    import torch

    from lightning_dpot.data import MNIST
    from lightning_dpot.ot.dp_sinkhorn import SemiDebiasedSinkhorn, mixed_cost_diameter

    torch.set_num_threads(args.threads)
    splits = MNIST(idx_dir=args.idx_dir, split="test-only").load()
    diameter = mixed_cost_diameter(784, 2.0, 1.0, 15.0)
    new_loss = SemiDebiasedSinkhorn(0.05, 1.0, 0.4, 10, 15.0, diameter, fixed_budget=True)
    old_loss = old.ot.dp_sinkhorn.SemiDebiasedSinkhorn(
        0.05, 1.0, 0.4, 10, 15.0, diameter, warn_not_converged=False
    )
    results = [train("new", new_loss, splits, args), train("old", old_loss, splits, args)]
    print(
        json.dumps(
            {
                "private": args.private,
                "steps": args.steps,
                "torch_threads": args.threads,
                "load_average": os.getloadavg(),
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
