"""OT losses: the convergence contract of every entropic solve (value and gradient against an
independent Newton reference), the p = 1 and p = 2 conventions, geomloss' own convention, and
exact minibatch OT against brute force."""

import itertools

import pytest
import torch
from geomloss import SamplesLoss

from lightning_dpot.ot import (
    EntropicOT,
    ExactOT,
    entropic_plan_newton,
    l1_cost,
    lp_cost,
    sinkhorn_log_domain,
    sinkhorn_log_plan,
)
from lightning_dpot.ot.dp_sinkhorn import SemiDebiasedSinkhorn
from lightning_dpot.ot.reference import entropic_gradient, entropic_value


def _problem(p: int, dim: int, ratio: float):
    """20 vs 25 points in [0, 1]^d (shifted), λ = ratio·diameter^p with the exact diameter."""
    gen = torch.Generator().manual_seed(dim + p)
    x = torch.rand(20, dim, generator=gen, dtype=torch.float64)
    y = torch.rand(25, dim, generator=gen, dtype=torch.float64) + 0.2
    diameter = float(lp_cost(p)(x, y).max()) ** (1.0 / p)
    return x, y, diameter, ratio * diameter**p


def _errors(loss, x, y, p, reg):
    """Relative value and gradient errors of ``loss`` against the Newton reference."""
    plan = entropic_plan_newton(x, y, p, reg)
    ref_value = entropic_value(plan, lp_cost(p)(x, y), reg)
    ref_grad = entropic_gradient(plan, x, y, p)
    x = x.clone().requires_grad_(True)
    value = loss(x, y)
    (grad,) = torch.autograd.grad(value, x)
    return (
        abs(value.item() - ref_value.item()) / abs(ref_value.item()),
        ((grad - ref_grad).norm() / ref_grad.norm()).item(),
    )


@pytest.mark.parametrize("ratio", [1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0])
@pytest.mark.parametrize("dim", [2, 50, 784])
@pytest.mark.parametrize("p", [1, 2])
def test_default_solve_converges_in_value_and_gradient(p, dim, ratio):
    # The contract: at the defaults, value within 1e-3 and gradient within 2e-2 (relative) of
    # the converged reference for λ/diameter^p from 1e-6 to 1 (``auto``: Newton below 5e-4).
    x, y, diameter, reg = _problem(p, dim, ratio)
    loss = EntropicOT(p, reg, diameter)
    value_error, grad_error = _errors(loss, x, y, p, reg)
    assert loss.last_info.backend == ("newton" if ratio < 5e-4 else "tensorized")
    assert loss.last_info.converged and loss.last_info.marginal_error <= loss.last_info.tolerance
    assert value_error < 1e-3
    assert grad_error < 2e-2


@pytest.mark.parametrize(("p", "dim"), [(1, 50), (2, 2), (2, 50), (1, 784), (2, 784)])
def test_without_the_final_sweeps_the_gradient_is_wrong_and_reported_so(p, dim):
    # One sweep at the target λ is what plain ε-scaling gives (geomloss stops there): the
    # gradient is then off by several percent at λ = 10⁻³·diameter^p, and the solve says it
    # missed tol.
    x, y, diameter, reg = _problem(p, dim, 1e-3)
    loss = EntropicOT(p, reg, diameter, backend="tensorized", max_iter=1)
    with pytest.warns(UserWarning, match="did not reach tol"):
        _, grad_error = _errors(loss, x, y, p, reg)
    assert not loss.last_info.converged and loss.last_info.iterations == 1
    assert grad_error > 2e-2


def test_newton_reference_agrees_with_plain_sinkhorn_where_sinkhorn_converges(clouds):
    x, y = clouds
    plan = entropic_plan_newton(x, y, 2, 1.5)
    torch.testing.assert_close(plan, sinkhorn_log_plan(x, y, 2, 1.5), rtol=1e-6, atol=1e-12)


def test_semi_debiased_loss_and_exact_fallback_meet_the_same_contract():
    x, y, diameter, reg = _problem(2, 50, 1e-2)
    loss = SemiDebiasedSinkhorn(entropic_reg=reg, l1_weight=0.0, diameter=diameter)
    value_error, grad_error = _errors(loss.entropic_ot, x, y, 2, reg)
    assert loss.last_info.converged and value_error < 1e-3 and grad_error < 2e-2
    # ExactOT's fallback for unequal sizes: λ = (0.01·diameter)^p.
    x, y, diameter, _ = _problem(1, 2, 1.0)
    exact = ExactOT(1, diameter)
    with pytest.warns(UserWarning, match="unequal"):
        value_error, grad_error = _errors(exact, x, y, 1, (0.01 * diameter) ** 1)
    assert exact.last_info.converged and value_error < 1e-3 and grad_error < 2e-2


@pytest.fixture
def clouds():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(25, 4, generator=gen, dtype=torch.float64)
    y = torch.randn(30, 4, generator=gen, dtype=torch.float64) + 0.7
    return x, y


@pytest.mark.parametrize(("p", "reg"), [(1, 0.8), (2, 1.5), (2, 0.3)])
def test_entropic_ot_is_w_p_lambda_with_lp_cost(clouds, p, reg):
    x, y = clouds
    ours = EntropicOT(p, reg, diameter=20.0)(x, y)
    reference = sinkhorn_log_domain(x, y, p, reg)
    assert ours.item() == pytest.approx(reference.item(), rel=1e-4)


def test_geomloss_builtin_p2_is_half_of_w_2_2sigma2(clouds):
    # geomloss' convention (docs/design.md#entropic-p-wgan):
    # SamplesLoss("sinkhorn", p=2, blur=σ) = ½ W_{2, 2σ²}.
    x, y = clouds
    sigma = 0.9
    builtin = SamplesLoss("sinkhorn", p=2, blur=sigma, scaling=0.99, debias=False)(x, y)
    ours = EntropicOT(2, 2 * sigma**2, diameter=20.0)(x, y)
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
    # (geomloss' one-sweep ε-scaling is off by 0.034 here at scaling 0.95; the default solve
    # iterates to tol.)
    x, y = clouds
    reg = 1.5
    x = x.clone().requires_grad_(True)
    EntropicOT(2, reg, diameter=20.0)(x, y).backward()
    plan = sinkhorn_log_plan(x.detach(), y, 2, reg)
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
        EntropicOT(2, 1.0, 1.0, scaling=1.0)
    with pytest.raises(ValueError, match="tol must lie in"):
        EntropicOT(2, 1.0, 1.0, tol=0.0)
    with pytest.raises(ValueError, match="backend must be one of"):
        EntropicOT(2, 1.0, 1.0, backend="gpu")
    with pytest.raises(ValueError, match="entropic_reg must be a finite number > 0"):
        EntropicOT(2, 0.0, 1.0)
    with pytest.raises(ValueError, match="p must be 1 or 2"):
        EntropicOT(3, 1.0, 1.0)
