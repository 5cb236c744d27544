"""The certified Taylor cluster expansion of the p = 2 softmin (multiscale backend): each
softmin and its gradient stay within the bound ρ it reports, against dense exact computation,
and a solve through it meets the convergence contract against the Newton reference, with ρ
counted in the marginal error it reports."""

import math

import pytest
import torch

import lightning_dpot.ot.sinkhorn as sinkhorn
from lightning_dpot.ot import EntropicSolver, LpCost, entropic_plan_newton, lp_cost
from lightning_dpot.ot.expansion import (
    Grid,
    expanded_softmin,
    expansion_side,
    multi_indices,
    remainder,
)
from lightning_dpot.ot.reference import entropic_gradient, entropic_value


def _clouds(dim: int, n: int = 300, m: int = 400):
    gen = torch.Generator().manual_seed(dim)
    x = torch.rand(n, dim, generator=gen, dtype=torch.float64) * 2 - 1
    y = torch.randn(m, dim, generator=gen, dtype=torch.float64) * 0.7 + 0.3
    return x, y


def test_remainder_bounds_the_taylor_polynomial_of_exp():
    # |e^t − P_k(t)| ≤ ρ(T)·e^t for |t| ≤ T: checked on a fine grid of t, k = 0..3.
    t = torch.linspace(-0.5, 0.5, 2001, dtype=torch.float64)
    for order in range(4):
        poly = sum(t**n / math.factorial(n) for n in range(order + 1))
        relative = ((t.exp() - poly).abs() / t.exp()).max().item()
        assert relative <= remainder(0.5, order)
        assert relative >= 0.5 * remainder(0.5, order) * math.exp(-1.0)  # and is not loose


def test_expansion_side_meets_the_target_and_no_more():
    for eps, dim, rho in [(5.06, 2, 1e-4), (0.3, 1, 1e-6), (50.0, 3, 1e-3)]:
        side = expansion_side(eps, dim, rho)
        t = side**2 * dim / (2 * eps)  # T for two cells' worst radii side·√d/2
        assert remainder(t) == pytest.approx(rho, rel=1e-9)


def test_multi_indices_count_and_order():
    # C(d + k, d) indices, by degree, the constant first.
    for dim, order in [(1, 3), (2, 2), (2, 3), (3, 3)]:
        alphas = multi_indices(dim, order)
        assert len(alphas) == math.comb(dim + order, dim)
        assert alphas[0].sum() == 0 and (alphas.sum(1).diff() >= 0).all()


@pytest.mark.parametrize("dim", [1, 2, 3])
@pytest.mark.parametrize("eps", [0.5, 4.0])
def test_softmin_and_its_gradient_are_within_the_certified_bound(dim, eps):
    x, y = _clouds(dim)
    side = expansion_side(eps, dim, 1e-3)
    gx, gy = Grid(x, side), Grid(y, side)
    xs, ys = x[gx.perm], y[gy.perm]
    h = torch.randn(len(y), generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    rho = remainder(2 * gx.radius * gy.radius / eps)
    assert rho <= 1e-3 and len(gx) > 1 and len(gy) > 1
    query = xs.clone().requires_grad_(True)
    approx = expanded_softmin(query, gx, gy, h, eps, with_grad=True)
    (grad,) = torch.autograd.grad(approx.sum(), query)
    exact_in = xs.clone().requires_grad_(True)
    logits = h - torch.cdist(exact_in, ys).square() / eps
    exact = -eps * torch.logsumexp(logits, 1)
    (exact_grad,) = torch.autograd.grad(exact.sum(), exact_in)
    # |f̂ − f|/ε ≤ −log(1 − ρ); |∇̂ − ∇| = 2|Ê[y|x] − E[y|x]| ≤ 2ρ/(1 − ρ)·max_j |y_j − E[y|x]|.
    assert ((approx.detach() - exact).abs() / eps).max() <= -math.log1p(-rho)
    mean = torch.softmax(logits.detach(), 1) @ ys
    spread = torch.cdist(mean, ys).amax(1)
    assert ((grad - exact_grad).norm(dim=1) <= 2 * rho / (1 - rho) * spread).all()
    # Not trivially: the expansion is not exact, and order 0 alone would break the bound.
    assert ((approx.detach() - exact).abs() / eps).max() > 1e-3 * rho
    no_grad = expanded_softmin(xs, gx, gy, h, eps, with_grad=False)
    torch.testing.assert_close(no_grad, approx.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dim", [1, 2, 3])
@pytest.mark.parametrize("ratio", [0.05, 0.3, 1.0])
def test_taylor_solve_meets_the_contract_against_the_reference(dim, ratio):
    x, y = _clouds(dim)
    diameter = 8.0
    reg = ratio * diameter**2
    plan = entropic_plan_newton(x, y, 2, reg)
    ref_value = entropic_value(plan, lp_cost(2)(x, y), reg).item()
    ref_grad = entropic_gradient(plan, x, y, 2)
    solver = EntropicSolver(LpCost(2), 2, reg, diameter, backend="multiscale")
    xr = x.clone().requires_grad_(True)
    value, info = solver(xr, y)
    (grad,) = torch.autograd.grad(value, xr)
    if (dim, ratio) == (3, 0.05):  # narrow kernel in 3-D: too many cells, truncation instead
        assert info.kernel == "keops-truncated"
        return
    assert info.kernel == "taylor-2" and info.converged
    assert 0 < info.kernel_error <= info.tolerance / 10
    assert info.marginal_error >= info.kernel_error  # the bound is part of the reported error
    assert value.item() == pytest.approx(ref_value, rel=2e-4)  # measured ≤ 5e-5
    assert ((grad - ref_grad).norm() / ref_grad.norm()).item() < 1e-4  # measured ≤ 1e-5


def test_taylor_needs_p2_and_can_be_turned_off():
    x, y = _clouds(2)
    for solver in (
        EntropicSolver(LpCost(1), 1, 2.0, 8.0, backend="multiscale"),
        EntropicSolver(LpCost(2), 2, 20.0, 8.0, backend="multiscale", taylor=False),
    ):
        _, info = solver(x, y)
        assert info.kernel == "keops-truncated" and info.kernel_error == 0.0


@pytest.mark.parametrize("backend", ["tensorized", "multiscale"])
def test_float32_clouds_far_from_the_origin_keep_the_contract(backend):
    # ‖x‖² + ‖y‖² − 2⟨x, y⟩ at 500 from the origin cancels 6 of float32's 7 digits: the solver
    # centres translation-invariant costs first (without it the dense value is off by 3e-4
    # here) and the Taylor kernel sums its distances coordinate by coordinate.
    x, y = _clouds(2)
    reg, diameter = 8.0, 8.0
    exact, _ = EntropicSolver(LpCost(2), 2, reg, diameter, tol=1e-10, backend="tensorized")(x, y)
    value, info = EntropicSolver(LpCost(2), 2, reg, diameter, backend=backend)(
        (x + 500).float(), (y + 500).float()
    )
    assert info.converged and info.kernel in ("dense", "taylor-2")
    assert value.item() == pytest.approx(exact.item(), rel=2e-5)


def test_the_taylor_kernel_needs_no_keops(monkeypatch):
    # Plain torch: it runs where KeOps is missing (or, on a GPU, crashes its compiler); the
    # truncated kernel still needs KeOps and says so.
    monkeypatch.setattr(sinkhorn, "keops_import_error", lambda: "ImportError: no pykeops")
    x, y = _clouds(2)
    _, info = EntropicSolver(LpCost(2), 2, 20.0, 8.0, backend="multiscale")(x, y)
    assert info.kernel == "taylor-2" and info.converged
    with pytest.raises(RuntimeError, match="'multiscale' backend needs KeOps.*no pykeops"):
        EntropicSolver(LpCost(1), 1, 2.0, 8.0, backend="multiscale")(x, y)


@pytest.mark.parametrize("backend", ["tensorized", "multiscale"])
def test_the_value_does_not_depend_on_which_cloud_needs_gradients(backend):
    # The returned pair is (T(g), g) with g = T(f) at λ in every case: a gradient to y only adds
    # a graph, never another potential (before stop 22 a solve that converged on its first
    # sweep paired f̃ with a g of the last annealing ε, and a y-gradient changed the value by
    # 3e-3; now only the summation order differs).
    x, y = _clouds(1)
    solver = EntropicSolver(LpCost(2), 2, 19.2, 8.0, backend=backend)
    values = [
        solver(x.clone().requires_grad_(True), y.clone().requires_grad_(grad_y))[0].item()
        for grad_y in (False, True)
    ]
    assert values[0] == pytest.approx(values[1], rel=1e-12)
