"""CPU benchmarks of the foundation: privatization, the entropic loss and the ℓ1 cost.

    python benchmarks/bench_foundation.py

1. privatization throughput (records/s) for 60,000 × 784 records, per mechanism;
2. entropic loss forward + backward time at batch 400 × 784 for p = 1 and p = 2;
3. peak memory of the ℓ1 cost (forward + backward) at batch 2000 × 784, against the size of the
   2000 × 2000 cost matrix itself (a B×N×M×D intermediate would need 12.5 GB).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import torch

from lightning_dpot.ot import EntropicOT
from lightning_dpot.privacy.mechanisms.ldp import LocalRandomizer
from lightning_dpot.privacy.mechanisms.transforms import RecordTransform


def privatization_throughput() -> dict:
    x = torch.rand(60_000, 1, 28, 28) * 2 - 1
    out = {}
    for name, kw in {
        "gaussian": dict(mechanism="gaussian", epsilon=35.0, delta=1e-4),
        "laplace": dict(mechanism="laplace", epsilon=196.0),
        "laplace_l1_projection": dict(mechanism="laplace", epsilon=196.0, l1_radius=350.0),
    }.items():
        rand = LocalRandomizer.build(
            transform=RecordTransform((1, 28, 28)),
            low=-1.0,
            high=1.0,
            diameter_l1=1568.0,
            diameter_l2=56.0,
            **kw,
        )
        start = time.perf_counter()
        rand(x, torch.Generator().manual_seed(0))
        out[name] = round(len(x) / (time.perf_counter() - start))
    return out


def entropic_step_time(repeats: int = 5) -> dict:
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(400, 784, generator=gen)
    out = {}
    for p, sigma in [(1, 8.0), (2, 7.25)]:
        loss = EntropicOT(
            p,
            p * sigma**p,
            diameter=(1568 if p == 1 else 56) + 8 * sigma * (784 if p == 1 else 28),
            scaling=0.95,
        )
        times = []
        for _ in range(repeats):
            x = torch.randn(400, 784, generator=gen).requires_grad_(True)
            start = time.perf_counter()
            loss(x, y).backward()
            times.append(time.perf_counter() - start)
        out[f"p{p}_seconds"] = round(min(times), 4)
    return out


_L1_CHILD = """
import torch
from lightning_dpot.ot import l1_cost

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

x = torch.randn(2000, 784).requires_grad_(True)
y = torch.randn(2000, 784)
open("/proc/self/clear_refs", "w").write("5")  # reset the peak-RSS counter (VmHWM)
before = status("VmRSS")
l1_cost(x, y).sum().backward()
print(status("VmHWM") - before)
"""


def l1_cost_peak_memory() -> dict:
    """Peak resident-memory increase of ℓ1 cost forward + backward, in a fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", _L1_CHILD], capture_output=True, text=True, check=True
    )
    delta = int(out.stdout.strip())
    return {
        "peak_rss_increase_mb": round(delta / 2**20, 1),
        "cost_matrix_mb": round(2000 * 2000 * 4 / 2**20, 1),
    }


if __name__ == "__main__":
    results = {
        "torch_threads": torch.get_num_threads(),
        "privatization_records_per_s": privatization_throughput(),
        "entropic_forward_backward_400x784": entropic_step_time(),
        "l1_cost_2000x784": l1_cost_peak_memory(),
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }
    print(json.dumps(results, indent=2))
