"""Time of the local-DP release (``LocalRandomizer``) against plain torch noise of the same dtype.

On ``n × 784`` records in [−1, 1] (float32), one thread: the whole release (record checks,
transform, noise, sum) for the Laplace and Gaussian mechanisms, beside drawing the same noise
with stock torch in float64 (``torch.distributions.Laplace(...).sample``, ``torch.randn``), and
beside the same noise drawn by the reference formulas out of place (float64, then cast), whose
output must be bit-identical to the release's in-place noise.

    python benchmarks/bench_ldp_release.py --n 60000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from lightning_dpot.privacy.mechanisms.ldp import LocalRandomizer
from lightning_dpot.privacy.mechanisms.transforms import make_transform


def _best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _out_of_place_noise(name: str, scale: float, shape: tuple[int, ...], g: torch.Generator):
    if name == "laplace":
        u = torch.rand(shape, generator=g, dtype=torch.float64) - 0.5
        return (-scale * torch.sign(u) * torch.log1p(-2.0 * u.abs())).to(torch.float32)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(torch.float32)


def measure(name: str, kwargs: dict, x: torch.Tensor, repeats: int) -> dict:
    """One mechanism: the release, its parts, stock torch noise, and the identity check."""
    shape = tuple(x.shape[1:])
    randomizer = LocalRandomizer.build(
        name, make_transform("identity", shape, None), -1.0, 1.0, 2 * 784, 2 * 28, **kwargs
    )
    scale = randomizer.mechanism.noise_scale
    m = (x.shape[0], 784)
    ours = randomizer.mechanism.sample_noise(m, torch.Generator().manual_seed(1))
    out_of_place = _out_of_place_noise(name, scale, m, torch.Generator().manual_seed(1))
    if name == "laplace":
        zero, b = (torch.tensor(v, dtype=torch.float64) for v in (0.0, scale))
        laplace = torch.distributions.Laplace(zero, b)

        def plain():
            return laplace.sample(m)
    else:

        def plain():
            return torch.randn(m, dtype=torch.float64) * scale

    g = torch.Generator().manual_seed(2)
    row = {
        "mechanism": name,
        "n": x.shape[0],
        "release_seconds": _best(lambda: randomizer(x, g), repeats),
        "check_records_seconds": _best(lambda: randomizer.check_records(x), repeats),
        "noise_seconds": _best(lambda: randomizer.mechanism.sample_noise(m, g), repeats),
        "out_of_place_noise_seconds": _best(
            lambda: _out_of_place_noise(name, scale, m, g), repeats
        ),
        "plain_torch_noise_seconds": _best(plain, repeats),
        "noise_identical_to_out_of_place": bool(torch.equal(ours, out_of_place)),
    }
    row["release_over_plain"] = row["release_seconds"] / row["plain_torch_noise_seconds"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.rand(args.n, 28, 28, generator=torch.Generator().manual_seed(0)) * 2 - 1
    rows = []
    for name, kwargs in (
        ("laplace", {"epsilon": 100.0}),
        ("gaussian", {"epsilon": 10.0, "delta": 1e-5}),
    ):
        rows.append(measure(name, kwargs, x, args.repeats))
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
