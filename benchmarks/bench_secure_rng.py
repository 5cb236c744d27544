"""Cost of ``secure_rng``: noise from the OS CSPRNG vs a torch generator (docs/secure_noise.md).

python benchmarks/bench_secure_rng.py [--records 60000] [--dim 784] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from lightning_dpot.privacy.mechanisms.additive import make_mechanism
from lightning_dpot.privacy.mechanisms.gradient_sanitizer import GradientSanitizer
from lightning_dpot.rng import OSRandom


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--dim", type=int, default=784)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shape = (args.records, args.dim)
    print(f"noise for {shape[0]:,} x {shape[1]} ({shape[0] * shape[1] / 1e6:.1f} M values), "
          f"best of {args.repeats}, {args.threads} thread(s)")  # fmt: skip
    for name, delta in (("laplace", None), ("gaussian", 1e-5)):
        mechanism = make_mechanism(name, 1.0, 1.0, delta)
        generator = torch.Generator().manual_seed(0)
        t_torch = _best(lambda m=mechanism, g=generator: m.sample_noise(shape, g), args.repeats)
        t_os = _best(lambda m=mechanism: m.sample_noise(shape, OSRandom()), args.repeats)
        print(f"  {name:8s} torch generator {t_torch:6.2f} s   OS CSPRNG {t_os:6.2f} s   "
              f"x{t_os / t_torch:.1f}")  # fmt: skip
    grad = torch.randn(70, 794)
    for secure in (False, True):
        sanitizer = GradientSanitizer(0.5, 1.5, secure_rng=secure, sample_rate=1.0)
        per_call = _best(lambda s=sanitizer: [s(grad, 50) for _ in range(200)], args.repeats) / 200
        label = "OS CSPRNG" if secure else "torch generator"
        print(f"  DP-Sinkhorn sanitizer, batch 50+20 rows x 794: {label:15s} "
              f"{per_call * 1e3:.3f} ms per step")  # fmt: skip


if __name__ == "__main__":
    main()
