"""Which backend an ``auto`` entropic solve takes: a function of the problem's sizes, dimension,
p, λ/diameter^p and device, and of what the machine offers (memory, a working KeOps).

The thresholds are measured (docs/performance.md, "Backends"):

* ``newton`` when the smaller cloud has at most ``NEWTON_MAX_POINTS`` points and
  λ ≤ ``NEWTON_MAX_RATIO``·diameter^p, where plain sweeps take thousands of iterations;
* on the CPU, ``multiscale`` for the ℓ1 cost in d ≤ 2 from ``LAPLACE_MIN_PAIRS`` pairs (the exact
  kernel of ``lightning_dpot.ot.laplace``, plain torch);
* without a working KeOps, ``tensorized``;
* on a GPU, ``tensorized`` while the dense solve fits in the memory limit (dense sweeps are fast
  there), then ``multiscale`` (d ≤ 3) or ``online``;
* on the CPU, ``multiscale`` for d ≤ 3 above ``MULTISCALE_MIN_PAIRS`` pairs, ``online`` when the
  dense solve would not fit, else ``tensorized``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Backend = Literal["auto", "tensorized", "newton", "online", "multiscale"]
BACKENDS = ("auto", "tensorized", "newton", "online", "multiscale")
MULTISCALE_MIN_PAIRS = 2**20
NEWTON_MAX_POINTS = 1024
NEWTON_MAX_RATIO = 5e-4
LAPLACE_MIN_PAIRS = 10**5
DENSE_BUFFERS = 3  # the cost, the sweep buffer and one temporary, N × M each
NEWTON_BYTES = 8  # the Newton path holds its N × M matrices in float64


@dataclass(frozen=True)
class Problem:
    """One solve's public shape: clouds of ``n`` and ``m`` points in dimension ``dim``, entries of
    ``itemsize`` bytes, on a ``device_type`` (``cpu`` or ``cuda``)."""

    n: int
    m: int
    dim: int
    itemsize: int = 4
    device_type: str = "cpu"


def auto_backend(
    problem: Problem,
    reg: float,
    cost_scale: float,
    dense_limit: float,
    l1_kernel: bool,
    keops_works: Callable[[], bool],
) -> str:
    """The backend ``auto`` takes for ``problem`` at λ = ``reg`` against the largest cost
    ``cost_scale`` = diameter^p, with
    ``dense_limit`` bytes for a dense solve. ``l1_kernel``: the cost and dimension have the exact
    ℓ1 kernel; ``keops_works`` is asked only where the choice depends on it (importing KeOps
    takes seconds)."""
    n, m = problem.n, problem.m
    fits_dense = DENSE_BUFFERS * n * m * problem.itemsize <= dense_limit
    small = min(n, m) <= NEWTON_MAX_POINTS and NEWTON_BYTES * n * m <= dense_limit
    if small and reg <= NEWTON_MAX_RATIO * cost_scale:
        return "newton"
    cpu = problem.device_type == "cpu"
    if cpu and l1_kernel and n * m >= LAPLACE_MIN_PAIRS:
        return "multiscale"
    if not keops_works():
        return "tensorized"
    if problem.device_type == "cuda" and fits_dense:
        return "tensorized"
    if problem.dim <= 3 and n * m > MULTISCALE_MIN_PAIRS:
        return "multiscale"
    return "tensorized" if fits_dense else "online"
