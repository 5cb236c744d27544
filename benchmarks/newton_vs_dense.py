"""Where the ``newton`` backend's fixed work pays against converged dense sweeps: both backends
on uniform clouds in [0, 1]^d (diameter √d), p = 2, at λ/diameter² of 1e-4 and 5e-4 (the ``auto``
rule's threshold), value and gradient, one CPU thread, best of ``--repeats``.

    python benchmarks/newton_vs_dense.py --out docs/results/newton_vs_dense_cpu.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from lightning_dpot.ot import EntropicSolver, LpCost

SIZES = [(200, 200), (200, 2000), (400, 400), (400, 2000), (400, 6000), (1000, 1000), (1000, 4000)]
RATIOS = (1e-4, 5e-4)


def _time(backend: str, reg: float, diameter: float, x0, y0, repeats: int):
    solver = EntropicSolver(
        LpCost(2), 2, reg, diameter, backend=backend, max_iter=20_000, warn_not_converged=False
    )
    best, info, value = float("inf"), None, 0.0
    for _ in range(repeats):
        x = x0.clone().requires_grad_()
        start = time.perf_counter()
        loss, info = solver(x, y0)
        loss.backward()
        best = min(best, time.perf_counter() - start)
        value = float(loss.detach())
    return best, info, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    diameter = args.dim**0.5
    rows = []
    for ratio in RATIOS:
        for n, m in SIZES:
            gen = torch.Generator().manual_seed(0)
            x0, y0 = torch.rand(n, args.dim, generator=gen), torch.rand(m, args.dim, generator=gen)
            row = {"ratio": ratio, "n": n, "m": m}
            for backend in ("newton", "tensorized"):
                seconds, info, value = _time(
                    backend, ratio * diameter**2, diameter, x0, y0, args.repeats
                )
                row[backend] = {
                    "seconds": seconds,
                    "iterations": info.iterations,
                    "converged": info.converged,
                    "value": value,
                }
            rows.append(row)
            print(
                f"λ/D² {ratio:g} {n} x {m}: newton {row['newton']['seconds']:.3f} s, "
                f"tensorized {row['tensorized']['seconds']:.3f} s "
                f"({row['tensorized']['iterations']} sweeps)",
                flush=True,
            )
    if args.out:
        settings = {"dim": args.dim, "repeats": args.repeats, "threads": 1, "tol": 1e-3}
        args.out.write_text(json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
