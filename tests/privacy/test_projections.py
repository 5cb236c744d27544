"""ℓ1/ℓ2 ball projections against an independent solver."""

import pytest
import torch

from lightning_dpot.privacy.mechanisms.projections import project_l1_ball, project_l2_ball


def _l1_projection_by_bisection(v: torch.Tensor, radius: float) -> torch.Tensor:
    """Independent solver: bisection on the threshold θ of Σ max(|v| − θ, 0) = R."""
    if v.abs().sum() <= radius:
        return v.clone()
    lo, hi = 0.0, v.abs().max().item()
    for _ in range(200):
        mid = (lo + hi) / 2
        if (v.abs() - mid).clamp_min(0).sum() > radius:
            lo = mid
        else:
            hi = mid
    return torch.sign(v) * (v.abs() - hi).clamp_min(0)


def test_l1_projection_matches_bisection_solver():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 17, generator=gen, dtype=torch.float64) * 3
    radius = 5.0
    out = project_l1_ball(x, radius)
    for row_in, row_out in zip(x, out, strict=True):
        assert torch.allclose(row_out, _l1_projection_by_bisection(row_in, radius), atol=1e-9)


def test_l1_projection_is_the_closest_feasible_point():
    gen = torch.Generator().manual_seed(1)
    v = torch.randn(1, 6, generator=gen, dtype=torch.float64) * 4
    proj = project_l1_ball(v, 2.0)
    assert proj.abs().sum().item() == pytest.approx(2.0)
    # Random feasible points are never closer to v than the projection.
    cand = torch.randn(20_000, 6, generator=gen, dtype=torch.float64)
    cand = cand / cand.abs().sum(dim=1, keepdim=True) * 2.0 * torch.rand(20_000, 1, generator=gen)
    assert ((cand - v).norm(dim=1) >= (proj - v).norm() - 1e-12).all()


def test_points_inside_the_balls_are_unchanged():
    x = torch.tensor([[0.1, -0.2, 0.3]])
    assert torch.equal(project_l1_ball(x, 1.0), x)
    assert torch.equal(project_l2_ball(x, 1.0), x)


def test_l2_projection_scales_to_the_sphere():
    x = torch.tensor([[3.0, 4.0]])
    assert torch.allclose(project_l2_ball(x, 1.0), torch.tensor([[0.6, 0.8]]))


def test_refuses_nonpositive_radius():
    with pytest.raises(ValueError, match="l1_radius must be a finite number > 0"):
        project_l1_ball(torch.ones(1, 2), 0.0)
    with pytest.raises(ValueError, match="l2_radius must be a finite number > 0"):
        project_l2_ball(torch.ones(1, 2), -1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("radius", [1e-3, 1.0, 7.3, 1e4])
def test_projected_rows_lie_inside_the_ball_as_stored(dtype, radius):
    """Adversarial rows: d = 784, magnitudes up to 1e3, some dominated by a few large entries.
    The rounded output's norm, computed in float64, must not exceed R (the sensitivity is 2R
    for the stored values), while rows inside the ball come back bit-identical."""
    gen = torch.Generator().manual_seed(2)
    x = (torch.rand(400, 784, generator=gen, dtype=torch.float64) * 2 - 1) * 1e3
    x[::2] *= torch.rand(200, 784, generator=gen, dtype=torch.float64) ** 8
    x[1::4] *= radius / 1e3 / 784 * 0.999  # inside both balls
    x = x.to(dtype)
    for project, norms in (
        (project_l1_ball, lambda v: v.double().abs().sum(1)),
        (project_l2_ball, lambda v: v.double().norm(dim=1)),
    ):
        out = project(x, radius)
        assert out.dtype == dtype
        assert bool((norms(out) <= radius).all()), (project.__name__, norms(out).max() / radius)
        inside = norms(x) <= radius
        assert inside.sum() >= 100 and torch.equal(out[inside], x[inside])
