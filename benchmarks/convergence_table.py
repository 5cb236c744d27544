"""The convergence table of docs/performance.md: worst value and gradient errors of the default
solve against the float64 Newton reference, by λ/diameter^p, for this package, the package at
``--old-rev`` and one Sinkhorn sweep at λ (what geomloss' ε-scaling does).

Problems, per λ/D^p ∈ {1e-6, …, 1}:

* ``lp``: 20 vs 25 points in [0, 1]^d (the second cloud shifted by 0.2), p ∈ {1, 2},
  d ∈ {2, 50, 784}, the exact diameter (the grid of
  ``tests/ot/test_entropic.py::test_default_solve_converges_in_value_and_gradient``);
* ``mixed``: DP-Sinkhorn's cost ‖·‖₂² + ‖·‖₁ on [image, 15·onehot(label)] at its sizes (50 × 50
  generated rows against 50 real ones, and the debias pair), D from the declared pixel range,
  images uniform in [−1, 1], smooth grey images near 0 against digit-like strokes, and
  near-copies (noise 0.05) of the real images.

Errors: |W − W_ref|/max(|W_ref|, λ) and ‖∇ₓW − ∇ₓW_ref‖_F/‖∇ₓW_ref‖_F; work: the backend and
sweeps (Newton steps) at λ; time: the median solve, forward and backward, one thread.

    python benchmarks/convergence_table.py --out docs/results/convergence_table.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from revision import load_revision  # noqa: E402

RATIOS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
OLD_REV = "b8dc265"


def _lp_problems(ratio: float):
    import torch

    from lightning_dpot.ot import LpCost

    for p in (1, 2):
        for dim in (2, 50, 784):
            gen = torch.Generator().manual_seed(dim + p)
            x = torch.rand(20, dim, generator=gen, dtype=torch.float64)
            y = torch.rand(25, dim, generator=gen, dtype=torch.float64) + 0.2
            cost = LpCost(p)
            diameter = float(cost(x, y).max()) ** (1.0 / p)
            yield f"p{p}/d{dim}", x, y, cost, p, diameter, ratio * diameter**p


def _mixed_problems(ratio: float):
    import torch
    import torch.nn.functional as F

    from lightning_dpot.ot import MixedL2L1Cost
    from lightning_dpot.ot.dp_sinkhorn import mixed_cost_diameter

    diameter = mixed_cost_diameter(784, 2.0, 1.0, 15.0)
    gen = torch.Generator().manual_seed(0)

    def smooth(k, width):
        z = torch.randn(k, 1, 28, 28, generator=gen, dtype=torch.float64)
        r = torch.arange(-6, 7, dtype=torch.float64)
        kernel = torch.exp(-(r**2) / (2 * width**2))
        kernel = kernel / kernel.sum()
        z = F.conv2d(z, kernel.view(1, 1, 1, -1), padding=(0, 6))
        z = F.conv2d(z, kernel.view(1, 1, -1, 1), padding=(6, 0))
        return (z / z.std()).reshape(k, -1)

    def features(x, labels):
        return torch.cat([x, 15.0 * F.one_hot(labels, 10).double()], 1)

    real = torch.tanh(4 * (smooth(50, 1.5) - 1.0))
    real_labels = torch.randint(10, (50,), generator=gen)
    pick = torch.randint(50, (70,), generator=gen)
    clouds = {
        "uniform": (torch.rand(70, 784, generator=gen, dtype=torch.float64) * 2 - 1, None),
        "early": (0.1 * torch.tanh(smooth(70, 2.0)), None),
        "late": ((real[pick] + 0.05 * torch.randn(70, 784, generator=gen)).clamp(-1, 1), pick),
    }
    for name, (x, copies) in clouds.items():
        labels = real_labels[copies] if copies is not None else torch.randint(10, (70,))
        fx, fy = features(x, labels), features(real, real_labels)
        cost = MixedL2L1Cost(1.0)
        reg = ratio * diameter**2
        yield f"mixed/{name}/cross", fx[:50], fy, cost, 2, diameter, reg
        yield f"mixed/{name}/debias", fx[:50], fx[20:], cost, 2, diameter, reg


def _reference(x, y, cost, reg):
    import torch

    from lightning_dpot.ot import entropic_plan_newton
    from lightning_dpot.ot.reference import entropic_value

    plan = entropic_plan_newton(x, y, 2, reg, cost_fn=cost)
    value = float(entropic_value(plan, cost(x, y), reg))
    xr = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad((plan * cost(xr, y)).sum(), xr)
    return value, grad


def _solver(side: str, pkg, cost, p: int, reg: float, diameter: float):
    kwargs = {"warn_not_converged": False}
    if side == "one sweep":
        kwargs.update(max_iter=1, backend="tensorized")
    return pkg.ot.sinkhorn.EntropicSolver(cost, p, reg, diameter, 0.9, **kwargs)


def measure(sides: dict, ratio: float) -> list[dict]:
    import torch

    rows = []
    problems = list(_lp_problems(ratio)) + list(_mixed_problems(ratio))
    for name, x, y, cost, p, diameter, reg in problems:
        ref_value, ref_grad = _reference(x, y, cost, reg)
        for side, pkg in sides.items():
            solver = _solver(side, pkg, cost, p, reg, diameter)
            seconds = []
            for _ in range(3):
                xr = x.clone().requires_grad_(True)
                start = time.perf_counter()
                value, info = solver(xr, y)
                (grad,) = torch.autograd.grad(value, xr)
                seconds.append(time.perf_counter() - start)
            rows.append(
                {
                    "ratio": ratio,
                    "problem": name,
                    "side": side,
                    "value_error": abs(float(value.detach()) - ref_value)
                    / max(abs(ref_value), reg),
                    "gradient_error": float((grad - ref_grad).norm() / ref_grad.norm()),
                    "backend": info.backend,
                    "iterations": info.iterations,
                    "converged": info.converged,
                    "seconds": statistics.median(seconds),
                }
            )
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for ratio in RATIOS:
        for family in ("lp", "mixed"):
            for side in dict.fromkeys(r["side"] for r in rows):
                sel = [
                    r
                    for r in rows
                    if r["ratio"] == ratio
                    and r["side"] == side
                    and r["problem"].startswith("mixed") == (family == "mixed")
                ]
                if not sel:
                    continue
                worst = max(sel, key=lambda r: r["gradient_error"])
                out.append(
                    {
                        "ratio": ratio,
                        "problems": family,
                        "side": side,
                        "worst_value_error": max(r["value_error"] for r in sel),
                        "worst_gradient_error": worst["gradient_error"],
                        "worst_at": worst["problem"],
                        "converged": f"{sum(r['converged'] for r in sel)}/{len(sel)}",
                        "backends": sorted({r["backend"] for r in sel}),
                        "iterations_at_lambda": [min(r["iterations"] for r in sel),
                                                 max(r["iterations"] for r in sel)],
                        "median_seconds": statistics.median(r["seconds"] for r in sel),
                        "max_seconds": max(r["seconds"] for r in sel),
                    }
                )  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ratios", nargs="*", type=float, default=list(RATIOS))
    parser.add_argument("--sides", nargs="*", default=["auto", "old", "one sweep"])
    parser.add_argument("--old-rev", default=OLD_REV)
    parser.add_argument("--out")
    args = parser.parse_args()
    old = load_revision(args.old_rev) if "old" in args.sides else None
    import torch

    import lightning_dpot.ot.sinkhorn  # noqa: F401

    torch.set_num_threads(1)
    new = sys.modules["lightning_dpot"]
    sides = {s: (old if s == "old" else new) for s in args.sides}
    rows = [row for ratio in args.ratios for row in measure(sides, ratio)]
    result = {
        "torch_threads": 1,
        "load_average": os.getloadavg(),
        "old_rev": args.old_rev,
        "summary": summarize(rows),
        "rows": rows,
    }
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
