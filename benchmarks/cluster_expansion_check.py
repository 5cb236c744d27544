r"""Certified cluster expansion of the p = 2 softmin: a measured next step for CPU multiscale.

Not used by the solver yet (issue 12's open item: 20,000 × 20,000 at p = 2 within 1.5× of
geomloss' multiscale). For x = c_K + u in cluster K and y = c_L + v in cluster L, d = c_K − c_L,

    |x − y|² = |d|² + |u|² + 2⟨d, u⟩  +  |v|² − 2⟨d, v⟩  −  2⟨u, v⟩,

so e^{(g_j − |x − y_j|²)/ε} factors into a term of (x, L), a term of (K, j) and e^{2⟨u, v⟩/ε},
the only coupling of a point of x with a point of y. Its Taylor polynomial of order k (the Fast
Gauss Transform's idea) has the certified relative remainder ρ = T^{k+1}/(k+1)! · e^T with
T = 2 r_K r_L / ε (cluster radii r). The softmin f(x) = −ε LSE_j(log b_j + (g_j − |x − y_j|²)/ε)
then costs K·M + N·L kernel evaluations (clusters K of x, L of y) instead of N·M. Each cluster
pair's sum is within the relative remainder ρ, hence so is the whole sum, and
|f̂ − f|/ε ≤ −log(1 − ρ).

This script measures that error against the exact dense softmin at the benchmark's sizes and
scales (``bench_ot_backends.py``: [−1, 1]² against the half-circle plus Gaussian noise σ = 1.59,
ε = 2σ², geomloss' cluster side diameter / (√2 · √2000)), on one thread, by default in float64 so
that the truncation error is not hidden under float32 rounding (≈ 1e-6 here). With ``--keops``
it also times the solver's exact KeOps pass (:func:`lightning_dpot.ot.keops.keops_softmin`).

    python benchmarks/cluster_expansion_check.py [--n 20000] [--dtype float32] [--side-factor 2]
        [--keops]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from torch import Tensor


def grid_clusters(z: Tensor, side: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Labels, centroids (cluster means), offsets z − centroid and radii max |offset|."""
    cell = torch.floor(z / side).long()
    _, labels = torch.unique(cell, dim=0, return_inverse=True)
    k = int(labels.max()) + 1
    count = torch.zeros(k).index_add_(0, labels, torch.ones(len(z)))
    centroids = torch.zeros(k, z.shape[1]).index_add_(0, labels, z) / count[:, None]
    offsets = z - centroids[labels]
    radii = torch.zeros(k).scatter_reduce_(0, labels, offsets.norm(dim=1), "amax")
    return labels, centroids, offsets, radii


def exact_softmin(x: Tensor, y: Tensor, h: Tensor, eps: float, chunk: int = 1000) -> Tensor:
    """−ε LSE_j(h_j − |x_i − y_j|²/ε), dense in row chunks."""
    return torch.cat(
        [
            -eps * torch.logsumexp(h - torch.cdist(x[s : s + chunk], y).square() / eps, 1)
            for s in range(0, len(x), chunk)
        ]
    )


def expanded_softmin(
    x: Tensor, y: Tensor, h: Tensor, eps: float, side: float, order: int, chunk: int = 1000
) -> tuple[Tensor, float]:
    """The softmin with e^{2⟨u, v⟩/ε} replaced by its Taylor polynomial of ``order`` ≤ 2, and the
    certified bound −log(1 − ρ) on |f̂ − f|/ε, ρ = T^{order+1}/(order+1)! · e^T."""
    kx, cx, u, rx = grid_clusters(x, side)
    ky, cy, v, ry = grid_clusters(y, side)
    nk, nl, m = len(cx), len(cy), len(y)
    # y side, per cluster pair (K, L): moments of w_Kj = e^{h_j + (2⟨d, v_j⟩ − |v_j|²)/ε}.
    logw = (h - (v.square().sum(1) + 2 * (cy[ky] * v).sum(1)) / eps)[None] + 2 * (cx @ v.T) / eps
    top = torch.full((nk, nl), -torch.inf).scatter_reduce_(1, ky.expand(nk, m), logw, "amax")
    w = (logw - top.gather(1, ky.expand(nk, m))).exp_()
    monomials = [torch.ones(m)]
    if order >= 1:
        monomials += [v[:, 0], v[:, 1]]
    if order >= 2:
        monomials += [v[:, 0] ** 2, 2 * v[:, 0] * v[:, 1], v[:, 1] ** 2]
    moments = [torch.zeros(nk, nl).index_add_(1, ky, w * mono) for mono in monomials]
    log_mass = top + moments[0].log()
    ratios = [q / moments[0] for q in moments[1:]]  # Σ w v^α / Σ w, per (K, L)
    out = torch.empty(len(x))
    for s in range(0, len(x), chunk):
        k, ui = kx[s : s + chunk], u[s : s + chunk]
        # |d|² + |u|² + 2⟨d, u⟩ = |x − c_L|²: one distance matrix to y's centroids.
        expo = log_mass[k] - torch.cdist(x[s : s + chunk], cy).square() / eps
        if order >= 1:  # log Σ_j w_j e^{2⟨u, v_j⟩/ε} − log Σ_j w_j, to the order
            terms = 2 * (ui[:, :1] * ratios[0][k] + ui[:, 1:] * ratios[1][k]) / eps
            if order >= 2:
                uu = [ui[:, :1] ** 2, ui[:, :1] * ui[:, 1:], ui[:, 1:] ** 2]
                terms += 2 * sum(a * q[k] for a, q in zip(uu, ratios[2:], strict=True)) / eps**2
            expo += torch.log1p(terms)
        out[s : s + chunk] = -eps * torch.logsumexp(expo, 1)
    t = 2 * float(rx.max()) * float(ry.max()) / eps
    rho = t ** (order + 1) / math.factorial(order + 1) * math.exp(t)
    return out, -math.log1p(-rho)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--sigma", type=float, default=1.59)
    parser.add_argument(
        "--dtype",
        choices=("float64", "float32"),
        default="float64",
        help="float64 measures the truncation error; float32 the solver's speed (its rounding, "
        "about 1e-6 here, hides the order-2 error)",
    )
    parser.add_argument(
        "--side-factor",
        type=float,
        default=1.0,
        help="cluster side as a multiple of geomloss' default (coarser: faster, larger bound)",
    )
    parser.add_argument("--keops", action="store_true", help="also time the exact KeOps pass")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.set_default_dtype(getattr(torch, args.dtype))
    n, sigma = args.n, args.sigma
    eps = 2 * sigma**2
    diameter = 2 * 2**0.5 + 8 * sigma * 2**0.5
    side = args.side_factor * diameter / (2**0.5 * 2000**0.5)
    x = torch.rand(n, 2) * 2 - 1
    angle = torch.rand(n) * math.pi
    y = torch.stack([angle.cos(), angle.sin()], 1) + sigma * torch.randn(n, 2)
    # A realistic dual potential: one Sinkhorn sweep from zero.
    log_uniform = -math.log(n)
    f = exact_softmin(x, y, torch.full((n,), log_uniform), eps)
    g = exact_softmin(y, x, log_uniform + f / eps, eps)
    h = log_uniform + g / eps
    start = time.perf_counter()
    exact = exact_softmin(x, y, h, eps)
    rows = {"n": n, "eps": eps, "cluster_side": side, "exact_seconds": time.perf_counter() - start}
    if args.keops:
        from lightning_dpot.ot.costs import lp_cost
        from lightning_dpot.ot.keops import keops_softmin

        keops_softmin(lp_cost(2), x[:10], y[:10], h[:10], eps)  # compile (cached on disk)
        start = time.perf_counter()
        keops = keops_softmin(lp_cost(2), x, y, h, eps)
        rows["keops_exact_seconds"] = time.perf_counter() - start
        rows["keops_max_error_over_eps"] = float(((keops - exact).abs() / eps).max())
    (_, cx, _, rx), (_, cy, _, ry) = grid_clusters(x, side), grid_clusters(y, side)
    rows["clusters"] = [len(cx), len(cy)]
    rows["max_radii"] = [float(rx.max()), float(ry.max())]
    rows["T"] = 2 * rows["max_radii"][0] * rows["max_radii"][1] / eps
    rows["kernel_evaluations"] = {"exact": n * n, "expanded": len(cx) * n + n * len(cy)}
    for order in (0, 1, 2):
        start = time.perf_counter()
        approx, bound = expanded_softmin(x, y, h, eps, side, order)
        rows[f"order_{order}"] = {
            "seconds": time.perf_counter() - start,
            "max_error_over_eps": float(((approx - exact).abs() / eps).max()),
            "certified_bound": bound,
        }
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
