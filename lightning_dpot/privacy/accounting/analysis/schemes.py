r"""Sampling schemes, their adjacency relations, and the histories the analysis composes.

Poisson sampling (add/remove-one)
---------------------------------
``S_q`` keeps every record of ``D`` independently with probability ``sample_rate``
``q`` (an empty sample is possible). ``D`` and ``D'`` are adjacent if one is the
other with one record added (``dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE``). This is
the relation under which Poisson subsampling amplifies privacy as in
``lightning_dpot.privacy.accounting.analysis.rdp_poisson``; "replace one record" costs up to
twice the sensitivity and is *not* what these numbers certify.

Fixed-size sampling without replacement (replace-one)
-----------------------------------------------------
When each sampled record is released as its own noisy row (the sliced releases of
``lightning_dpot.methods.dpsw``), the batch size is visible and the add/remove analysis does
not apply. Those modules draw, at every step, a uniformly random subset of exactly ``b`` of the
``n`` records (data-independent), and the guarantee is for *replacing* one record (``n`` is
public): a replacement changes at most one released row, so one step is the Gaussian mechanism
with ℓ2 sensitivity Δ on the subsample, i.e. the subsampled Gaussian without replacement with
``\gamma = b/n`` (``sample_rate``, ``swor_sample_rate``) and multiplier σ
(``lightning_dpot.privacy.accounting.analysis.rdp_swor``).

The two adjacency relations differ, so runs of the two schemes are never composed together: a
history is a list of ``Run`` of one scheme.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from lightning_dpot.checks import (
    check_nonnegative_int,
    check_positive,
    check_positive_int,
    check_probability,
)

POISSON = "poisson"
WITHOUT_REPLACEMENT = "without_replacement"
SAMPLINGS: dict[str, tuple[str, str]] = {
    POISSON: ("poisson_subsampled_gaussian", "add_or_remove_one"),
    WITHOUT_REPLACEMENT: ("fixed_size_subsampled_gaussian_without_replacement", "replace_one"),
}
"""Sampling scheme -> (mechanism name, adjacency) of the guarantee (module docstring)."""

DEFAULT_RDP_ORDERS: tuple[float, ...] = tuple(
    [1.0 + x / 10.0 for x in range(1, 100)]  # 1.1, 1.2, ..., 10.9: large ε / small σ
    + [float(a) for a in range(11, 64)]  # 11 ... 63: α = 18 is optimal at Cao et al. 2021's MNIST
    + [64.0, 80.0, 96.0, 128.0, 160.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0]  # tiny ε
)
"""Rényi orders α over which ε is minimised: dp-accounting's default grid (1.1-10.9 by 0.1,
11-63) extended with orders up to 1024 for very small ε (large σ, few steps). The optimum must
lie strictly inside the grid for the bound to be tight; at an end point the bound is still valid,
only looser, and ``rdp_to_epsilon``
warns."""

DEFAULT_PLD_VALUE_DISCRETIZATION = 1e-4
"""Grid width of the discretised privacy loss (dp-accounting's default). With pessimistic
rounding the error is one-sided (ε over-estimated) and grows with the number of compositions:
1e-3 gives ε = 1.14 instead of 0.93 for σ = 1.5, q = 1/1200, T = 160,000, δ = 1e-5."""

Run = tuple[float, float, int]
"""``(noise_multiplier, sample_rate, num_steps)``: ``num_steps`` identical steps."""


def check_sampling(sampling: str) -> str:
    """``sampling`` must be a key of ``SAMPLINGS``."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {list(SAMPLINGS)}, got {sampling!r}")
    return sampling


def check_orders(orders: Sequence[float]) -> tuple[float, ...]:
    """Rényi orders: a non-empty sequence of finite numbers > 1."""
    orders = tuple(float(a) for a in orders)
    if not orders or any(not math.isfinite(a) or a <= 1.0 for a in orders):
        raise ValueError(f"orders must be a non-empty list of finite numbers > 1, got {orders!r}")
    return orders


def check_run(noise_multiplier: float, sample_rate: float, num_steps: int) -> Run:
    """σ > 0, q in (0, 1] and a whole number of steps >= 0."""
    return (
        check_positive("noise_multiplier", noise_multiplier),
        check_probability("sample_rate", sample_rate),
        check_nonnegative_int("num_steps", num_steps),
    )


def swor_sample_rate(dataset_size: int, batch_size: int) -> float:
    """``b / n`` after checking ``1 <= batch_size <= dataset_size``."""
    n = check_positive_int("dataset_size", dataset_size)
    b = check_positive_int("batch_size", batch_size)
    if b > n:
        raise ValueError(f"batch_size must be in [1, dataset_size={n}], got {b!r}")
    return b / n


def compress_history(runs: Iterable[Sequence[float]]) -> list[Run]:
    """Validate ``(noise_multiplier, sample_rate, num_steps)`` runs and merge neighbours.

    Consecutive runs with the same ``(σ, q)`` are merged and empty runs dropped, so a training
    history of 100,000 identical steps is one run. Composition is commutative, so merging does
    not change ε.
    """
    merged: list[Run] = []
    for item in runs:
        if len(item) != 3:
            raise ValueError(
                f"a history run must be (noise_multiplier, sample_rate, num_steps), got {item!r}"
            )
        sigma, q, count = check_run(*item)
        if count == 0:
            continue
        if merged and merged[-1][0] == sigma and merged[-1][1] == q:
            merged[-1] = (sigma, q, merged[-1][2] + count)
        else:
            merged.append((sigma, q, count))
    return merged
