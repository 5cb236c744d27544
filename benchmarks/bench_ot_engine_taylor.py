"""The p = 2 Taylor kernel of the multiscale backend against the same backend at an earlier git
revision (``--old-rev``) and geomloss' multiscale backend, in one process on one thread, the
sides run in turn every round.

Rows (x = generated points uniform in [-1, 1]^d, y = the release: in 2-D the half-circle plus
Gaussian noise, in 3-D the unit sphere plus Gaussian noise, σ = 1.59; λ = 2σ² unless given as
λ/D², diameter D = 2√d + 8σ√d, as in ``bench_ot_backends.py``):

1. 20,000 × 20,000, 3-D: new, old, geomloss multiscale at scaling 0.9;
2. 2,000 × 2,000, 2-D: new (``auto``), new ``tensorized``, old, geomloss multiscale 0.5;
3. 2,000 × 2,000, 2-D, λ/D² = 1e-3: new, old, geomloss multiscale 0.5;
4. 20,000 × 20,000, 2-D: new, old, geomloss multiscale 0.9;
5–6. 100,000² and 400,000², 2-D, the same sides, timed only: with row 4 they give the log-log
   slope of time against n (no all-pairs reference at these sizes).

``new`` is ``EntropicOT(2, λ, D, backend="auto")`` (tol 1e-3) of the working tree, ``old`` the
same at ``--old-rev`` (``revision.load_revision``), geomloss 0.3.1
``SamplesLoss("sinkhorn", p=2, blur=√(λ/2), debias=False)`` with its value doubled (its cost is
½‖·‖²). Each side's time is one value and gradient w.r.t. x (forward + backward), after a
warm-up call. Errors are against a float64 log-domain Sinkhorn on all pairs (halving ε from D²
to λ, then sweeps at λ until ‖π1 − a‖₁ ≤ 1e-9): value |W − W*|/|W*|, gradient
‖∇ − ∇*‖_F/‖∇*‖_F.

    python benchmarks/bench_ot_engine_taylor.py --repeats 5 > bench_ot_engine_taylor.json
    python benchmarks/bench_ot_engine_taylor.py --rows 2 3 --repeats 9
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from revision import load_revision  # noqa: E402

OLD_REV = "b8dc265"
SIGMA = 1.59
ROWS = {  # n = m, dim, λ/D² (None: λ = 2σ²), sides
    1: (20_000, 3, None, ["new", "old", "geomloss-multiscale-0.9"]),
    2: (2_000, 2, None, ["new", "new-tensorized", "old", "geomloss-multiscale-0.5"]),
    3: (2_000, 2, 1e-3, ["new", "old", "geomloss-multiscale-0.5"]),
    4: (20_000, 2, None, ["new", "old", "geomloss-multiscale-0.9"]),
    5: (100_000, 2, None, ["new", "old", "geomloss-multiscale-0.9"]),
    6: (400_000, 2, None, ["new", "old", "geomloss-multiscale-0.9"]),
}
REFERENCE_MAX_POINTS = 20_000  # above: no all-pairs float64 reference (rows 5–6 time only)


def _clouds(n: int, dim: int):
    import torch

    gen = torch.Generator().manual_seed(0)
    if dim == 2:
        from lightning_dpot.data import HalfCircle

        y = HalfCircle(n=n).load().train + SIGMA * torch.randn(n, 2, generator=gen)
    else:
        sphere = torch.randn(n, dim, generator=gen)
        y = sphere / sphere.norm(dim=1, keepdim=True) + SIGMA * torch.randn(n, dim, generator=gen)
    x = torch.rand(n, dim, generator=gen) * 2 - 1
    return x, y


def _softmin(z, w, h, eps: float, chunk: int = 2**22):
    """−ε LSE_j(h_j − ‖z_i − w_j‖²/ε), on all pairs in row chunks (float64)."""
    import torch

    rows = max(1, chunk // len(w))
    norms = (w * w).sum(1)
    out = []
    for part in z.split(rows):
        cost = torch.addmm(norms[None, :] + (part * part).sum(1)[:, None], part, w.T, alpha=-2)
        out.append(-eps * torch.logsumexp(h - cost / eps, 1))
    return torch.cat(out)


def _reference(x, y, reg: float, diameter: float, tol: float = 1e-9):
    """W_{2,λ}(x, y) and its gradient in x by float64 log-domain Sinkhorn on all pairs."""
    import torch

    x, y = x.double(), y.double()
    log_a, log_b = -math.log(len(x)), -math.log(len(y))
    schedule = [diameter**2 / 2**k for k in range(64) if diameter**2 / 2**k > reg] + [reg]
    f = torch.zeros(len(x), dtype=torch.float64)
    g = _softmin(y, x, log_a + f / schedule[0], schedule[0])
    for eps in schedule[1:]:
        f = _softmin(x, y, log_b + g / eps, eps)
        g = _softmin(y, x, log_a + f / eps, eps)
    sweeps, error = 0, math.inf
    while error > tol:
        f_next = _softmin(x, y, log_b + g / reg, reg)
        error = float((math.exp(log_a) * torch.expm1((f - f_next) / reg).abs()).sum())
        f, sweeps = f_next, sweeps + 1
        g = _softmin(y, x, log_a + f / reg, reg)
    xr = x.clone().requires_grad_(True)
    f = _softmin(xr, y, log_b + g / reg, reg)  # rows of the plan sum exactly to a
    value = f.mean() + g.mean()
    (grad,) = torch.autograd.grad(value, xr)
    return value.item(), grad, {"sweeps_at_reg": sweeps, "marginal_error": error}


def _sides(names: list[str], old, reg: float, diameter: float) -> dict:
    """name → callable x, y → (value, SinkhornInfo dict or None)."""
    from geomloss import SamplesLoss

    import lightning_dpot.ot.entropic

    def ours(module, backend: str):
        loss = module.ot.entropic.EntropicOT(2, reg, diameter, backend=backend)

        def call(x, y):
            value = loss(x, y)
            return value, loss.last_info.as_dict()

        return call

    def geomloss(scaling: float):
        loss = SamplesLoss(
            "sinkhorn", p=2, blur=(reg / 2) ** 0.5, diameter=diameter, scaling=scaling,
            debias=False, backend="multiscale",
        )  # fmt: skip
        return lambda x, y: (2 * loss(x, y), None)

    new = lightning_dpot
    table = {
        "new": lambda: ours(new, "auto"),
        "new-tensorized": lambda: ours(new, "tensorized"),
        "old": lambda: ours(old, "auto"),
        "geomloss-multiscale-0.9": lambda: geomloss(0.9),
        "geomloss-multiscale-0.5": lambda: geomloss(0.5),
    }
    return {name: table[name]() for name in names}


def _run(call, x, y):
    import torch

    xr = x.clone().requires_grad_(True)
    start = time.perf_counter()
    value, info = call(xr, y)
    (grad,) = torch.autograd.grad(value, xr)
    return time.perf_counter() - start, value.item(), grad.double(), info


def _row(number: int, repeats: int, old) -> dict:
    n, dim, ratio, names = ROWS[number]
    x, y = _clouds(n, dim)
    diameter = 2 * dim**0.5 + 8 * SIGMA * dim**0.5
    reg = 2 * SIGMA**2 if ratio is None else ratio * diameter**2
    start = time.perf_counter()
    reference = None
    if n <= REFERENCE_MAX_POINTS:
        ref_value, ref_grad, ref_info = _reference(x, y, reg, diameter)
        reference = {"value": ref_value, "seconds": time.perf_counter() - start, **ref_info}
    report = {
        "row": number,
        "workload": {"n": n, "m": n, "dim": dim, "p": 2, "reg": reg, "diameter": diameter},
        "reference": reference,
        "load_average_start": os.getloadavg(),
        "sides": {},
    }
    sides = _sides(names, old, reg, diameter)
    for r in range(repeats + 1):  # round 0 warms up (KeOps compiles geomloss' formulas)
        for name, call in sides.items():
            seconds, value, grad, info = _run(call, x, y)
            if r == 0:
                continue
            side = report["sides"].setdefault(name, {"seconds": []})
            side["seconds"].append(seconds)
            side.update(value=value, sinkhorn=info)
            if reference is not None:
                side.update(
                    value_rel_error=abs(value - ref_value) / abs(ref_value),
                    grad_rel_error=float((grad - ref_grad).norm() / ref_grad.norm()),
                )
    for side in report["sides"].values():
        side["min"], side["median"] = min(side["seconds"]), statistics.median(side["seconds"])
    report["load_average_end"] = os.getloadavg()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="*", choices=sorted(ROWS), default=sorted(ROWS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--old-rev", default=OLD_REV)
    args = parser.parse_args()
    with contextlib.redirect_stdout(sys.stderr):  # KeOps' notices: stdout is the JSON only
        old = load_revision(args.old_rev, Path(__file__).resolve().parents[1])
        import torch

        torch.set_num_threads(1)
        rows = [_row(number, args.repeats, old) for number in args.rows]
    print(json.dumps({"threads": 1, "old_rev": args.old_rev, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
