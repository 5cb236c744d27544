r"""The multiscale backend's Taylor kernel (``lightning_dpot.ot.expansion``) at benchmark
scale: its error against the exact softmin next to the bound it certifies, and its time.

At the OT benchmark's 20,000 × 20,000 p = 2 case (``bench_ot_backends.py``: [−1, 1]² against
the half-circle plus Gaussian noise σ = 1.59, ε = 2σ²), for each target ρ (the solver uses
tol/10 = 1e-4), one f-update

    f_i = −ε LSE_j(h_j − ‖x_i − y_j‖²/ε),   h = a realistic potential (one Sinkhorn sweep),

is computed exactly (dense, in row chunks; and with ``--keops`` by the solver's KeOps pass) and
through the expansion, without and with its gradient 2(x_i − Ê[y | x_i]). Errors are measured in
float64, so that float32 rounding (about 1e-6 here) does not hide them; times in ``--dtype``
(default float32, the training dtype), on one thread.

    python benchmarks/cluster_expansion_check.py [--n 20000] [--dtype float32] [--keops]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from torch import Tensor

from lightning_dpot.ot.expansion import Grid, expanded_softmin, expansion_side, remainder


def exact_softmin(x: Tensor, y: Tensor, h: Tensor, eps: float, chunk: int = 1000) -> Tensor:
    """−ε LSE_j(h_j − ‖x_i − y_j‖²/ε), dense in row chunks."""
    return torch.cat(
        [
            -eps * torch.logsumexp(h - torch.cdist(x[s : s + chunk], y).square() / eps, 1)
            for s in range(0, len(x), chunk)
        ]
    )


def exact_mean(x: Tensor, y: Tensor, h: Tensor, eps: float, chunk: int = 1000) -> Tensor:
    """E_π[y | x_i] = Σ_j softmax_j(h_j − ‖x_i − y_j‖²/ε) y_j, dense in row chunks."""
    return torch.cat(
        [
            torch.softmax(h - torch.cdist(x[s : s + chunk], y).square() / eps, 1) @ y
            for s in range(0, len(x), chunk)
        ]
    )


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--sigma", type=float, default=1.59)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float32")
    parser.add_argument("--rhos", type=float, nargs="*", default=[1e-3, 1e-4, 1e-5, 1e-6])
    parser.add_argument("--keops", action="store_true", help="also time the exact KeOps pass")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    n, sigma = args.n, args.sigma
    eps = 2 * sigma**2
    x = torch.rand(n, 2) * 2 - 1
    angle = torch.rand(n) * math.pi
    y = torch.stack([angle.cos(), angle.sin()], 1) + sigma * torch.randn(n, 2)
    log_uniform = -math.log(n)
    f = exact_softmin(x, y, torch.full((n,), log_uniform), eps)
    h = log_uniform + exact_softmin(y, x, log_uniform + f / eps, eps) / eps
    fast = getattr(torch, args.dtype)
    xf, yf, hf = x.to(fast), y.to(fast), h.to(fast)
    _, exact_seconds = _timed(exact_softmin, xf, yf, hf, eps)
    rows = {"n": n, "eps": eps, "dtype": args.dtype, "exact_dense_seconds": exact_seconds}
    if args.keops:
        from lightning_dpot.ot.costs import lp_cost
        from lightning_dpot.ot.keops import keops_import_error, keops_softmin

        assert keops_import_error() is None, keops_import_error()  # its notices go to stderr
        keops_softmin(lp_cost(2), xf[:10], yf[:10], hf[:10], eps)  # compile (cached on disk)
        _, rows["exact_keops_seconds"] = _timed(keops_softmin, lp_cost(2), xf, yf, hf, eps)
    exact = exact_softmin(x, y, h, eps)
    grad = 2 * (x - exact_mean(x, y, h, eps))
    for rho in args.rhos:
        side = expansion_side(eps, 2, rho)
        gx, gy = Grid(x, side), Grid(y, side)
        query = x[gx.perm].clone().requires_grad_(True)
        approx = expanded_softmin(query, gx, gy, h[gy.perm], eps, with_grad=True)
        (approx_grad,) = torch.autograd.grad(approx.sum(), query)
        certified = remainder(2 * gx.radius * gy.radius / eps)
        gxf, gyf = Grid(xf, side), Grid(yf, side)
        qf, hs = xf[gxf.perm].requires_grad_(True), hf[gyf.perm]
        _, seconds = _timed(expanded_softmin, qf, gxf, gyf, hs, eps, with_grad=False)
        _, grad_seconds = _timed(expanded_softmin, qf, gxf, gyf, hs, eps, with_grad=True)
        rows[f"rho_{rho:g}"] = {
            "side": side,
            "cells": [len(gx), len(gy)],
            "kernel_evaluations": len(gx) * n + n * len(gy),
            "certified_rho": certified,
            "max_error_over_eps": float(((approx.detach() - exact[gx.perm]).abs() / eps).max()),
            "bound_over_eps": -math.log1p(-certified),
            "max_gradient_error": float((approx_grad - grad[gx.perm]).norm(dim=1).max()),
            "max_gradient": float(grad.norm(dim=1).max()),
            "seconds": seconds,
            "seconds_with_gradient": grad_seconds,
        }
    rows["exact_evaluations"] = n * n
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
