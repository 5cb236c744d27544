"""Time of one DP sliced-Wasserstein flow step (Sebag et al. 2023).

    python benchmarks/bench_dpsw_step.py [--threads 1]

Setting: 10,000 particles in d = 8, N_θ = 70 directions, a released target of
m = 250 noisy projections (one DPSWflow-r minibatch), σ = 0.68, λ = 0.001. Reports the median
over repeats of

* ``flow_step``: ``lightning_dpot.ot.sliced_flow.sliced_flow_step`` alone (projection, particle
  noise, ranks, target quantiles, drift, Euler–Maruyama update);
* ``dpswflow_r_step``: a full DPSWflow-r step (fresh Θ, Gaussian release of the minibatch, sort,
  flow step) as ``lightning_dpot.methods.DPSWFlowR`` does it.

On CPU, and on CUDA when a GPU is present. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from lightning_dpot.methods.dpsw.sensitivity import gaussian_sliced_release
from lightning_dpot.ot.sliced import random_directions
from lightning_dpot.ot.sliced_flow import sliced_flow_step


def _time(fn, device: str, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(device: str, n: int = 10_000, dim: int = 8, num_directions: int = 70, m: int = 250,
          repeats: int = 20) -> dict:  # fmt: skip
    g = torch.Generator(device=device).manual_seed(0)
    particles = torch.randn(n, dim, device=device, generator=g) / dim**0.5
    batch = torch.randn(m, dim, device=device, generator=g)
    batch = batch / batch.norm(dim=1, keepdim=True)
    theta = random_directions(num_directions, dim, g)
    target = torch.sort(gaussian_sliced_release(batch, theta, 0.68, g), dim=0).values

    def flow_step() -> None:
        sliced_flow_step(particles, target, theta, 1.0, 0.68, 1e-3, g, target_sorted=True)

    def full_step() -> None:
        th = random_directions(num_directions, dim, g)
        released = gaussian_sliced_release(batch, th, 0.68, g)
        sorted_target = torch.sort(released, dim=0).values
        sliced_flow_step(particles, sorted_target, th, 1.0, 0.68, 1e-3, g, target_sorted=True)

    return {
        "flow_step_ms": 1e3 * _time(flow_step, device, repeats),
        "dpswflow_r_step_ms": 1e3 * _time(full_step, device, repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = {
        "setting": {"particles": 10_000, "dim": 8, "num_directions": 70, "target_rows": 250},
        "torch_threads": torch.get_num_threads(),
        "cpu": bench("cpu"),
    }
    if torch.cuda.is_available():
        result["cuda"] = bench("cuda")
        result["cuda_device"] = torch.cuda.get_device_name()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
