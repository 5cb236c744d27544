"""Sensitivities of the released vector, from public declarations only (see
docs/design.md#local-privatization).

With declared bounds the support's diameter in ℓp gives Δp; a projection onto the ℓ1 ball of
radius R1 or the ℓ2 ball of radius R2 bounds it too, and the smallest valid bound is used:

    Δ1 = min(diam₁, 2·R1, 2·√m·R2),   Δ2 = min(diam₂, 2·R2, 2·R1),

using ‖v‖₂ ≤ ‖v‖₁ and ‖v‖₁ ≤ √m‖v‖₂ for v ∈ R^m. Values of Reshetova et al. 2024 ([-1, 1],
28×28): Δ1 = 1568, Δ2 = 56; with clipping Δ1 = 2·R1 ∈ {700, 550}, Δ2 = 2·R2 = 40.
"""

from __future__ import annotations

import math

from lightning_dpot.checks import check_positive


def declared_sensitivity(
    p: int,
    diameter_l1: float,
    diameter_l2: float,
    out_dim: int,
    l1_radius: float | None = None,
    l2_radius: float | None = None,
) -> float:
    """Δp (p ∈ {1, 2}) of the released vector in R^out_dim from its public diameters and
    the optional projection radii."""
    if p not in (1, 2):
        raise ValueError(f"p must be 1 or 2, got {p!r}")
    candidates = [diameter_l1] if p == 1 else [diameter_l2]
    if l1_radius is not None:
        r1 = check_positive("l1_radius", l1_radius)
        candidates.append(2.0 * r1)
    if l2_radius is not None:
        r2 = check_positive("l2_radius", l2_radius)
        candidates.append(2.0 * r2 * (math.sqrt(out_dim) if p == 1 else 1.0))
    sensitivity = min(candidates)
    if not math.isfinite(sensitivity):
        raise ValueError(
            f"sensitivity_l{p} is unbounded: the declared bounds are infinite and no projection "
            "radius is set; declare finite bounds [low, high] or set l1_radius / l2_radius"
        )
    return check_positive(f"sensitivity_l{p}", sensitivity)
