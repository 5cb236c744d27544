"""Entropic OT with the ℓ1 cost (p = 1) at paper scale, side by side in one process.

The workload of Reshetova et al. (2024), Fig. 1 (Laplace): x = 2,000 generated points uniform
in [-1, 1]², y = 400,000 half-circle points plus Laplace noise of scale σ = 1.59, λ = σ = 1.59,
diameter 2d + 8σd = 29.44, value W_{1,λ}(x, y) and its gradient w.r.t. x. Sides, each run in
turn every round (same thread, same load), after a warm-up call on a subsample (KeOps
compiles there):

* ``new``: ``EntropicOT(1, λ, diameter, backend="multiscale")`` of this package (the exact ℓ1
  kernel of ``lightning_dpot.ot.laplace``, tol 1e-3);
* ``old``: the same at ``--old-rev`` (truncated KeOps kernel), via ``revision.load_revision``;
* ``geomloss-multiscale-0.9`` / ``-0.99``: geomloss 0.3.1 ``SamplesLoss("sinkhorn", p=1,
  blur=λ, cost=("Sum(Abs(X-Y))", l1_cost), backend="multiscale", debias=False)`` at scaling 0.9
  and 0.99 (ε = blur^p = λ, the same objective);
* ``geomloss-online``: the same with the KeOps ℓ1 formula on all pairs (``--online-repeats``).

Errors are relative to a float64 reference (``--reference``): ``laplace``, this package's
multiscale solve in float64 to tol 1e-9 (the kernel is exact; seconds), or ``online``, its KeOps
solve in float64 to tol 1e-6 (all pairs; many minutes). Value: |W − W*|/|W*|; gradient:
‖∇ − ∇*‖_F/‖∇*‖_F.

    python benchmarks/bench_ot_engine_l1.py --repeats 3 > docs/results/bench_ot_engine_l1.json
    python benchmarks/bench_ot_engine_l1.py --repeats 5 --skip-old --online-repeats 0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from revision import load_revision  # noqa: E402

OLD_REV = "b8dc265"
N, M, SIGMA = 2000, 400_000, 1.59
REG, DIAMETER = SIGMA, 2 * 2 + 8 * SIGMA * 2


def _clouds(n: int, m: int):
    import torch

    from lightning_dpot.data import HalfCircle

    gen = torch.Generator().manual_seed(0)
    u = torch.rand(m, 2, generator=gen, dtype=torch.float64) - 0.5
    laplace = -SIGMA * u.sign() * torch.log1p(-2 * u.abs())  # inverse CDF of Laplace(0, σ)
    y = HalfCircle(n=m).load().train + laplace.float()
    x = torch.rand(n, 2, generator=gen) * 2 - 1
    return x, y


def _sides(names: list[str], old, reference: str):
    """The sides (name → callable (x, y) → (value, SinkhornInfo dict or None)) and the
    reference solver."""
    from geomloss import SamplesLoss

    from lightning_dpot.ot import EntropicSolver, LpCost
    from lightning_dpot.ot.costs import l1_cost

    def ours(module):
        loss = module.ot.entropic.EntropicOT(1, REG, DIAMETER, backend="multiscale")

        def call(x, y):
            value = loss(x, y)
            return value, loss.last_info.as_dict()

        return call

    def geomloss(scaling: float, backend: str):
        cost = "Sum(Abs(X-Y))" if backend == "online" else ("Sum(Abs(X-Y))", l1_cost)
        loss = SamplesLoss(
            "sinkhorn", p=1, blur=REG, diameter=DIAMETER, scaling=scaling, debias=False,
            cost=cost, backend=backend,
        )  # fmt: skip
        return lambda x, y: (loss(x, y), None)

    solver = {
        "laplace": EntropicSolver(LpCost(1), 1, REG, DIAMETER, tol=1e-9, backend="multiscale"),
        "online": EntropicSolver(LpCost(1), 1, REG, DIAMETER, tol=1e-6, backend="online"),
    }[reference]
    table = {
        "new": lambda: ours(sys.modules["lightning_dpot"]),
        "old": lambda: ours(old),
        "geomloss-multiscale-0.9": lambda: geomloss(0.9, "multiscale"),
        "geomloss-multiscale-0.99": lambda: geomloss(0.99, "multiscale"),
        "geomloss-online": lambda: geomloss(0.9, "online"),
    }
    return {name: table[name]() for name in names}, lambda x, y: solver(x, y)


def _run(call, x, y):
    import torch

    xr = x.clone().requires_grad_(True)
    start = time.perf_counter()
    value, info = call(xr, y)
    (grad,) = torch.autograd.grad(value, xr)
    return time.perf_counter() - start, float(value), grad.double(), info


def _bench(args) -> dict:
    """The report: the reference, then every side's rounds."""
    repo = Path(__file__).resolve().parents[1]
    old = None if args.skip_old else load_revision(args.old_rev, repo)
    import torch

    torch.set_num_threads(1)
    names = ["new", "geomloss-multiscale-0.9", "geomloss-multiscale-0.99"]
    names += [] if args.skip_old else ["old"]
    names += ["geomloss-online"] if args.online_repeats > 0 else []
    sides, reference = _sides(names, old, args.reference)
    x, y = _clouds(args.n, args.m)
    seconds, ref_value, ref_grad, ref_info = _run(reference, x.double(), y.double())
    ref_info = ref_info.as_dict()
    report = {
        "workload": {"n": args.n, "m": args.m, "dim": 2, "p": 1, "reg": REG, "diameter": DIAMETER},
        "threads": 1,
        "load_average_start": os.getloadavg(),
        "reference": {"kind": args.reference, "value": ref_value, "seconds": seconds, **ref_info},
        "sides": {},
    }
    for call in sides.values():  # warm-up: KeOps compiles its formulas here
        _run(call, x[:200], y[:2000])
    for r in range(args.repeats):
        for name, call in sides.items():
            if name == "geomloss-online" and r >= args.online_repeats:
                continue
            t, value, grad, info = _run(call, x, y)
            row = report["sides"].setdefault(name, {"seconds": []})
            row["seconds"].append(round(t, 4))
            row["value"] = value
            row["value_rel_error"] = abs(value - ref_value) / abs(ref_value)
            row["grad_rel_error"] = float((grad - ref_grad).norm() / ref_grad.norm())
            row["solver"] = info
            print(json.dumps({"round": r, "side": name, "seconds": round(t, 4)}), file=sys.stderr)
    for row in report["sides"].values():
        row["seconds_min"] = min(row["seconds"])
    base = report["sides"].get("geomloss-multiscale-0.9")
    if base:
        for row in report["sides"].values():
            row["vs_geomloss_multiscale_0.9"] = row["seconds_min"] / base["seconds_min"]
    report["load_average_end"] = os.getloadavg()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-old", action="store_true")
    parser.add_argument("--online-repeats", type=int, default=1)
    parser.add_argument("--old-rev", default=OLD_REV)
    parser.add_argument("--reference", choices=["laplace", "online"], default="laplace")
    parser.add_argument("--n", type=int, default=N)
    parser.add_argument("--m", type=int, default=M)
    args = parser.parse_args()
    with contextlib.redirect_stdout(sys.stderr):  # pykeops prints notices on stdout
        report = _bench(args)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
