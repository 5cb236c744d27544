"""Entropic OT side by side: this package's solver (each backend), geomloss called directly and
POT, on the same clouds, λ and cost; fwd+bwd time, peak extra memory, sweeps to tolerance.

Conventions: W_{2,λ}(‖·‖²) = 2·OT_{λ/2}(½‖·‖²) in geomloss (blur = √(λ/2), value doubled);
p = 1 is geomloss with the ℓ1 cost as a dense callable (tensorized), the KeOps formula
``"Sum(Abs(X-Y))"`` (online) or both (multiscale: ``cost=(formula, routine)``).
``geomloss-lp-cost`` is geomloss tensorized with this package's ℓp cost, blur = λ^{1/p} and
scaling 0.95 (one sweep at λ). POT runs ``ot.sinkhorn2(method="sinkhorn_log")`` on the dense
cost (float64, to ``stopThr`` 1e-6); it returns the transport cost ⟨π, C⟩ without the entropy
term, so its value is not comparable, only its time.
Peak memory is the growth of the process' maximum RSS during the call (a lower bound when an
earlier case already raised the maximum, hence each case runs in a fresh process).

    python benchmarks/bench_ot_backends.py --out docs/results/bench_ot_backends_cpu.json
    python benchmarks/bench_ot_backends.py --device cuda --max-dense-pairs 1e9 \\
        --out docs/results/bench_ot_backends_h100.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CASES = {
    "400x784_p1": (400, 400, 784, 1),
    "400x784_p2": (400, 400, 784, 2),
    "2000x20000_2d_p2": (2000, 20_000, 2, 2),
    "2000x20000_2d_p1": (2000, 20_000, 2, 1),
    "20000x20000_2d_p2": (20_000, 20_000, 2, 2),
    "2000x400000_2d_p2": (2000, 400_000, 2, 2),  # Reshetova et al. 2024, Fig. 1-2, full batch
    "2000x400000_2d_p1": (2000, 400_000, 2, 1),
}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(case: str, impl: str, repeats: int, device: str) -> dict:
    import torch

    torch.set_num_threads(1)
    cuda = device.startswith("cuda")
    n, m, dim, p = CASES[case]
    gen = torch.Generator().manual_seed(0)
    if dim == 2:  # generated batch in [-1, 1]², release = half-circle + Gaussian noise σ = 1.59
        from lightning_dpot.data import HalfCircle

        y = HalfCircle(n=m).load().train + 1.59 * torch.randn(m, 2, generator=gen)
        x = torch.rand(n, 2, generator=gen) * 2 - 1
        sigma = 1.59
    else:  # images in [-1, 1]^784 and a Laplace/Gaussian release of scale 0.5
        x = torch.rand(n, dim, generator=gen) * 2 - 1
        y = torch.rand(m, dim, generator=gen) * 2 - 1 + 0.5 * torch.randn(m, dim, generator=gen)
        sigma = 0.5
    x, y = x.to(device), y.to(device)
    reg = p * sigma**p
    diameter = (2 * dim**0.5 if p == 2 else 2 * dim) + 8 * sigma * (dim**0.5 if p == 2 else dim)
    from lightning_dpot.ot import EntropicOT, lp_cost

    info = None
    if impl == "ours-truncated":  # multiscale with the truncated KeOps kernel, never Taylor
        loss = EntropicOT(p, reg, diameter, backend="multiscale")
        loss.solver.taylor = False

        def call(xr):
            return loss(xr, y)
    elif impl.startswith("ours-"):
        loss = EntropicOT(p, reg, diameter, backend=impl[5:])

        def call(xr):
            return loss(xr, y)
    elif impl == "geomloss-lp-cost":  # geomloss tensorized, our ℓp cost, scaling 0.95
        from geomloss import SamplesLoss

        gl = SamplesLoss(
            "sinkhorn", p=p, blur=reg ** (1 / p), diameter=diameter, scaling=0.95,
            debias=False, cost=lp_cost(p), backend="tensorized",
        )  # fmt: skip

        def call(xr):
            return gl(xr, y)
    elif impl.startswith("geomloss-"):  # tensorized, online or multiscale
        from geomloss import SamplesLoss

        backend = impl[9:]
        if p == 2:
            gl = SamplesLoss(
                "sinkhorn", p=2, blur=(reg / 2) ** 0.5, diameter=diameter, scaling=0.9,
                debias=False, backend=backend,
            )  # fmt: skip

            def call(xr):
                return 2 * gl(xr, y)
        else:  # the ℓ1 cost: a dense callable, a KeOps formula, or both (multiscale)
            cost = {
                "tensorized": lp_cost(1),
                "online": "Sum(Abs(X-Y))",
                "multiscale": ("Sum(Abs(X-Y))", lp_cost(1)),
            }[backend]
            gl = SamplesLoss(
                "sinkhorn", p=1, blur=reg, diameter=diameter, scaling=0.9, debias=False,
                cost=cost, backend=backend,
            )  # fmt: skip

            def call(xr):
                return gl(xr, y)
    else:  # POT
        import ot

        def call(xr):
            cost = lp_cost(p)(xr.double(), y.double())
            a = torch.full((n,), 1.0 / n, dtype=torch.float64, device=device)
            b = torch.full((m,), 1.0 / m, dtype=torch.float64, device=device)
            return ot.sinkhorn2(a, b, cost, reg, method="sinkhorn_log", numItermax=2000,
                                stopThr=1e-6)  # fmt: skip

    times = []
    base = _rss_mb()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base_gpu = torch.cuda.memory_allocated()
    for _ in range(repeats):
        xr = x.clone().requires_grad_(True)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        value = call(xr)
        value.backward()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    memory = (
        {"peak_extra_gpu_mb": (torch.cuda.max_memory_allocated() - base_gpu) / 2**20}
        if cuda
        else {"peak_extra_mb": _rss_mb() - base}
    )
    if impl.startswith("ours-"):
        info = loss.last_info.as_dict()
    return {
        "case": case,
        "impl": impl,
        "value": float(value),
        "seconds_first": times[0],
        "seconds": min(times),
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        **memory,
        "sinkhorn": info,
    }


def _skip_reason(impl: str, n: int, m: int, dim: int, p: int, args) -> str | None:
    if impl == "geomloss-multiscale" and dim > 3:
        return "geomloss multiscale: d <= 3"
    if impl in ("ours-multiscale", "ours-truncated") and dim > 3:
        return "multiscale: d <= 3"
    if impl == "pot" and n * m > args.max_pot_pairs:
        return f"POT dense float64 log-domain: more than {args.max_pot_pairs:g} pairs"
    dense = impl in ("ours-tensorized", "geomloss-tensorized", "geomloss-lp-cost")
    if dense and n * m > args.max_dense_pairs:
        return f"dense N×M: more than {args.max_dense_pairs:g} pairs"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument(
        "--impls",
        nargs="*",
        default=[
            "ours-auto",
            "ours-tensorized",
            "geomloss-lp-cost",
            "geomloss-tensorized",
            "geomloss-multiscale",
            "pot",
        ],
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-dense-pairs", type=float, default=5e7)
    parser.add_argument("--max-pot-pairs", type=float, default=1e6)
    parser.add_argument(
        "--device", default="cpu", help="cpu or cuda (memory: growth of torch's peak allocation)"
    )
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one[0], args.one[1], args.repeats, args.device)))
        return
    rows = []
    for case in args.cases:
        n, m, dim, p = CASES[case]
        for impl in args.impls:
            skip = _skip_reason(impl, n, m, dim, p, args)
            if skip:
                rows.append({"case": case, "impl": impl, "skipped": skip})
                continue
            cmd = [sys.executable, __file__, "--one", case, impl, "--repeats", str(args.repeats)]
            cmd += ["--device", args.device]
            out = subprocess.run(cmd, capture_output=True, text=True)
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            row = (
                json.loads(lines[-1])
                if lines
                else {"case": case, "impl": impl, "error": out.stderr[-500:]}
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
