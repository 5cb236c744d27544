"""OT losses: the p = 1 and p = 2 conventions against a direct log-domain Sinkhorn,
geomloss' own convention, and exact minibatch OT against brute force."""

import itertools

import pytest
import torch
from geomloss import SamplesLoss

from lightning_dpot.ot import EntropicOT, ExactOT, l1_cost, sinkhorn_log_domain, sinkhorn_log_plan


@pytest.fixture
def clouds():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(25, 4, generator=gen, dtype=torch.float64)
    y = torch.randn(30, 4, generator=gen, dtype=torch.float64) + 0.7
    return x, y


@pytest.mark.parametrize(("p", "reg"), [(1, 0.8), (2, 1.5), (2, 0.3)])
def test_entropic_ot_is_w_p_lambda_with_lp_cost(clouds, p, reg):
    x, y = clouds
    ours = EntropicOT(p, reg, diameter=20.0, scaling=0.99)(x, y)
    reference = sinkhorn_log_domain(x, y, p, reg, iterations=3000)
    # ε-scaling stops at the target ε; its residual error is well below 0.1%.
    assert ours.item() == pytest.approx(reference.item(), rel=1e-3)


def test_geomloss_builtin_p2_is_half_of_w_2_2sigma2(clouds):
    # SPEC §4: SamplesLoss("sinkhorn", p=2, blur=σ) = ½ W_{2, 2σ²}.
    x, y = clouds
    sigma = 0.9
    builtin = SamplesLoss("sinkhorn", p=2, blur=sigma, scaling=0.99, debias=False)(x, y)
    ours = EntropicOT(2, 2 * sigma**2, diameter=20.0, scaling=0.99)(x, y)
    assert builtin.item() == pytest.approx(0.5 * ours.item(), rel=1e-4)


def test_l1_cost_is_cityblock(clouds):
    x, y = clouds
    brute = (x[:, None, :] - y[None, :, :]).abs().sum(-1)
    assert torch.allclose(l1_cost(x, y), brute)


def test_entropic_gradient_flows_to_generated_points(clouds):
    x, y = clouds
    x = x.clone().requires_grad_(True)
    EntropicOT(1, 0.5, diameter=20.0)(x, y).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_p2_gradient_moves_each_point_to_its_barycentric_projection(clouds):
    # For C = ‖x − y‖² and weights a_i = 1/N: ∂W/∂x_i = 2 a_i (x_i − ŷ_i), ŷ_i = Σ_j π_ij y_j / a_i
    # (envelope theorem). The plan π comes from an independent log-domain Sinkhorn, with
    # unequal batch sizes (25 generated points, 30 records) as in the CPU demo (400 vs 8,000).
    # geomloss' gradient is exact only as the ε-scaling ratio → 1: max error 0.034 at 0.95,
    # 0.009 at 0.99, 0.001 at 0.999 here (barycentres of size ≈ 2).
    x, y = clouds
    reg = 1.5
    x = x.clone().requires_grad_(True)
    EntropicOT(2, reg, diameter=20.0, scaling=0.999)(x, y).backward()
    plan = sinkhorn_log_plan(x.detach(), y, 2, reg, iterations=3000)
    barycentric = len(x) * plan @ y
    assert torch.allclose(x.detach() - 0.5 * len(x) * x.grad, barycentric, atol=2e-3)


def test_divergence_of_identical_clouds_is_zero(clouds):
    x, _ = clouds
    assert EntropicOT(2, 0.5, 20.0, debias=True)(x, x).abs().item() < 1e-6


@pytest.mark.parametrize("p", [1, 2])
def test_exact_ot_matches_brute_force_permutations(p):
    gen = torch.Generator().manual_seed(p)
    x = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(6, 3, generator=gen, dtype=torch.float64)
    cost = (x[:, None] - y[None]).abs().sum(-1) if p == 1 else ((x[:, None] - y[None]) ** 2).sum(-1)
    brute = min(sum(cost[i, s[i]] for i in range(6)) for s in itertools.permutations(range(6))) / 6
    assert ExactOT(p, diameter=10.0)(x, y).item() == pytest.approx(brute.item())


def test_exact_ot_falls_back_with_a_warning_for_large_batches():
    x, y = torch.randn(12, 2), torch.randn(12, 2)
    loss = ExactOT(2, diameter=10.0, max_exact_batch=8)
    with pytest.warns(UserWarning, match="max_exact_batch"):
        loss(x, y)


def test_refusals():
    with pytest.raises(ValueError, match="scaling must lie in"):
        EntropicOT(2, 1.0, 1.0, scaling=0.5)
    with pytest.raises(ValueError, match="entropic_reg must be a finite number > 0"):
        EntropicOT(2, 0.0, 1.0)
    with pytest.raises(ValueError, match="p must be 1 or 2"):
        EntropicOT(3, 1.0, 1.0)
