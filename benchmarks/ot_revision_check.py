r"""The entropic solver of an earlier revision against the installed one, in one process: value,
gradients and ``SinkhornInfo`` of every backend (bit for bit), and the time of each solve
(value and gradient, median of interleaved repeats).

    python benchmarks/ot_revision_check.py --rev 98aaa0d \
        --out docs/results/ot_revision_check_cpu.json

Each case builds its cost from the package it runs, so the revision's own ``isinstance`` checks
(which backend and kernel apply) see their own classes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from revision import load_revision  # noqa: E402

# name, cost exponent p, λ, diameter, solver options, (N, M, d)
CASES = [
    ("tensorized, p = 2", 2, 0.05, 3.0, {"backend": "tensorized"}, (300, 400, 2)),
    ("tensorized, p = 1, d = 784", 1, 0.5, 60.0, {}, (100, 120, 784)),
    ("newton", 2, 1e-3, 3.0, {"backend": "newton"}, (50, 70, 3)),
    ("newton, fixed budget", 2, 1e-3, 3.0, {"fixed_budget": True}, (50, 70, 3)),
    ("multiscale, Taylor kernel", 2, 5.0, 30.0, {"backend": "multiscale"}, (3000, 4000, 2)),
    ("multiscale, Taylor kernel, 3-D", 2, 0.5, 3.0, {"backend": "multiscale"}, (3000, 3000, 3)),
    ("auto, exact ℓ1 kernel", 1, 0.05, 4.0, {}, (600, 700, 2)),
    ("online (KeOps)", 2, 0.05, 3.0, {"backend": "online"}, (300, 400, 5)),
    ("multiscale, truncated KeOps", 2, 0.01, 3.0, {"backend": "multiscale"}, (1500, 1600, 2)),
]


def _solve(pkg, p, reg, diameter, options, x0, y0):
    solver = pkg.ot.sinkhorn.EntropicSolver(pkg.ot.costs.LpCost(p), p, reg, diameter, **options)
    x, y = x0.clone().requires_grad_(), y0.clone().requires_grad_()
    start = time.perf_counter()
    value, info = solver(x, y)
    value.backward()
    seconds = time.perf_counter() - start
    return (value.detach(), x.grad, y.grad, info and info.as_dict()), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", required=True, help="the earlier git revision")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    old = load_revision(args.rev)
    new = importlib.import_module("lightning_dpot")
    importlib.import_module("lightning_dpot.ot.sinkhorn")
    rows = []
    for name, p, reg, diameter, options, (n, m, d) in CASES:
        gen = torch.Generator().manual_seed(0)
        x0, y0 = torch.rand(n, d, generator=gen), torch.rand(m, d, generator=gen)
        results, times = {}, {"old": [], "new": []}
        for _ in range(args.repeats):  # interleaved: the same load for both
            for label, pkg in (("old", old), ("new", new)):
                results[label], seconds = _solve(pkg, p, reg, diameter, options, x0, y0)
                times[label].append(seconds)
        same = all(
            torch.equal(a, b) for a, b in zip(results["old"][:3], results["new"][:3], strict=True)
        )
        row = {
            "case": name,
            "sizes": [n, m, d],
            "bitwise_equal": same,
            "info_equal": results["old"][3] == results["new"][3],
            "kernel": (results["new"][3] or {}).get("kernel", "newton (fixed budget)"),
            "old_s": statistics.median(times["old"]),
            "new_s": statistics.median(times["new"]),
        }
        rows.append(row)
        print(
            f"{name:32s} equal={same} info={row['info_equal']} "
            f"old {row['old_s']:.4f} s  new {row['new_s']:.4f} s  ({row['kernel']})",
            flush=True,
        )
    if args.out:
        meta = {"rev": args.rev, "threads": args.threads, "repeats": args.repeats}
        args.out.write_text(json.dumps({"settings": meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
