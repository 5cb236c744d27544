"""Random and adversarial DP-Sinkhorn solves for the fixed-budget ``newton`` backend, judged by
the final column violation ‖π^T 1 − b‖₁ (rows are exact), against the contract's 10⁻³.

Each problem is one semi-debiased loss at the MNIST settings — 70 generated rows and m real rows,
m ∈ {1, 10, 35, 50, 65, 80}, 784 pixels in [−1, 1] plus α_c = 15 one-hot class features, cost
‖·‖₂² + ‖·‖₁ — so two solves: the cross term (50 × m) and the debias term (50 × 50, 30 rows
shared). Clouds are drawn from clusters (σ from 0 to 0.5), box corners, uniform pixels, smooth
images or a few repeated points; 30% get a far outlier; in 30% of problems the real rows are
copies or near-copies of generated ones; labels are random, one class, two classes, or disjoint
between the sides. Each solve runs as the backend runs it (potential of the smaller side) at
λ/D² ∈ {10⁻³, 10⁻⁴, 10⁻⁵, 10⁻⁶}, D = the declared bound.

    python benchmarks/stress_newton.py --problems 520 --seed 7
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch
import torch.nn.functional as F

from lightning_dpot.ot import MixedL2L1Cost
from lightning_dpot.ot.dp_sinkhorn import mixed_cost_diameter
from lightning_dpot.ot.newton import column_violation, semi_dual_potential

DIM, CLASSES, ALPHA, ROWS, CROSS, DEBIAS = 784, 10, 15.0, 70, 50, 20
RATIOS = (1e-3, 1e-4, 1e-5, 1e-6)


def _smooth(k: int, gen: torch.Generator) -> torch.Tensor:
    z = torch.randn(k, 1, 28, 28, generator=gen, dtype=torch.float64)
    r = torch.arange(-6, 7, dtype=torch.float64)
    kernel = torch.exp(-(r**2) / 8)
    kernel = kernel / kernel.sum()
    z = F.conv2d(z, kernel.view(1, 1, 1, -1), padding=(0, 6))
    z = F.conv2d(z, kernel.view(1, 1, -1, 1), padding=(6, 0))
    return z.reshape(k, -1) / z.std()


def _cloud(k: int, gen: torch.Generator, rng: random.Random) -> tuple[torch.Tensor, str]:
    kind = rng.choice(["clusters", "corners", "uniform", "smooth", "repeats"])
    if kind == "uniform":
        x = torch.rand(k, DIM, generator=gen, dtype=torch.float64) * 2 - 1
    elif kind == "corners":
        x = torch.randint(2, (k, DIM), generator=gen).double() * 2 - 1
    elif kind == "smooth":
        x = torch.tanh(rng.choice([0.3, 1.0, 4.0]) * _smooth(k, gen))
    else:
        count = rng.choice([1, 2, 5, 20]) if kind == "clusters" else rng.choice([1, 2, 3])
        centres = torch.rand(count, DIM, generator=gen, dtype=torch.float64) * 2 - 1
        spread = rng.choice([0.0, 1e-3, 1e-2, 0.1, 0.5]) if kind == "clusters" else 0.0
        pick = torch.randint(count, (k,), generator=gen)
        noise = torch.randn(k, DIM, generator=gen, dtype=torch.float64)
        x = (centres[pick] + spread * noise).clamp(-1, 1)
    if rng.random() < 0.3:
        x[rng.randrange(k)] = torch.randint(2, (DIM,), generator=gen).double() * 2 - 1
    return x, kind


def _labels(k: int, gen: torch.Generator, mode: str) -> torch.Tensor:
    if mode == "random":
        return torch.randint(CLASSES, (k,), generator=gen)
    if mode == "single":
        return torch.zeros(k, dtype=torch.long)
    if mode == "two":
        return torch.randint(2, (k,), generator=gen)
    return 1 + torch.randint(CLASSES - 1, (k,), generator=gen)  # disjoint from class 0


def _features(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.cat([x, ALPHA * F.one_hot(labels, CLASSES).double()], 1)


def problems(count: int, seed: int):
    """(description, generated features (70, 794), real features (m, 794)) for each problem."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for i in range(count):
        x, kind_x = _cloud(ROWS, gen, rng)
        m = rng.choice([1, 10, 35, 50, 50, 65, 80])
        if rng.random() < 0.3:
            noise = rng.choice([0.0, 1e-3, 1e-2])
            pick = torch.randint(ROWS, (m,), generator=gen)
            y = x[pick] + noise * torch.randn(m, DIM, generator=gen, dtype=torch.float64)
            y, kind_y = y.clamp(-1, 1), "copies"
        else:
            y, kind_y = _cloud(m, gen, rng)
        mode = rng.choice(["random", "single", "two", "disjoint"])
        x_labels = _labels(ROWS, gen, "single" if mode == "disjoint" else mode)
        yield (
            f"{i}:{kind_x}/{kind_y}/m{m}/{mode}",
            _features(x, x_labels),
            _features(y, _labels(m, gen, mode)),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=100)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cost_fn = MixedL2L1Cost(1.0)
    bound = mixed_cost_diameter(DIM, 2.0, 1.0, ALPHA) ** 2
    worst = {r: (0.0, "") for r in RATIOS}
    residuals, seconds = [], []
    for desc, fx, fy in problems(args.problems, args.seed):
        for tag, a, b in (("cross", fx[:CROSS], fy), ("debias", fx[:CROSS], fx[DEBIAS:])):
            cost = cost_fn(a, b)
            if cost.shape[1] > cost.shape[0]:
                cost = cost.T
            for ratio in RATIOS:
                start = time.perf_counter()
                g = semi_dual_potential(cost, bound, ratio * bound)
                seconds.append(time.perf_counter() - start)
                residual = float(column_violation(cost, g, ratio * bound))
                residuals.append(residual)
                if residual > worst[ratio][0]:
                    worst[ratio] = (residual, f"{desc}/{tag}")
    residuals.sort()
    print(
        json.dumps(
            {
                "solves": len(residuals),
                "above_1e-3": sum(r > 1e-3 for r in residuals),
                "residual_median": residuals[len(residuals) // 2],
                "residual_p99": residuals[int(0.99 * len(residuals))],
                "worst_by_ratio": {f"{r:g}": worst[r] for r in RATIOS},
                "ms_per_solve_median": 1e3 * statistics.median(seconds),
                "ms_per_solve_max": 1e3 * max(seconds),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
