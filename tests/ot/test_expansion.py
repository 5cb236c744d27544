"""The certified Taylor cluster expansion of the p = 2 softmin (multiscale backend): each
softmin and its gradient stay within the bound ρ it reports, against dense exact computation,
and a solve through it meets the convergence contract against the Newton reference, with ρ
counted in the marginal error it reports. The batched evaluation (cells of uneven sizes padded
into groups, chunked temporaries) equals the expansion's formula summed pair by pair."""

import math

import pytest
import torch

import lightning_dpot.ot.expansion as expansion
import lightning_dpot.ot.sinkhorn as sinkhorn
from lightning_dpot.ot import EntropicSolver, LpCost, entropic_plan_newton, lp_cost
from lightning_dpot.ot.expansion import (
    Grid,
    cell_ratio,
    centroid_softmin,
    expanded_softmin,
    expansion_side,
    multi_indices,
    order_for,
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
    assert info.kernel == f"taylor-{order_for(dim)}" and info.converged
    assert 0 < info.kernel_error <= info.tolerance / 10
    assert info.marginal_error >= info.kernel_error  # the bound is part of the reported error
    assert value.item() == pytest.approx(ref_value, rel=2e-4)  # measured ≤ 5e-5
    assert ((grad - ref_grad).norm() / ref_grad.norm()).item() < 1e-4  # measured ≤ 1e-5


def test_taylor_needs_p2_and_can_be_turned_off():
    # p = 1 takes the exact ℓ1 kernel in d ≤ 2 and the truncated KeOps kernel above.
    x, y = _clouds(2)
    _, info = EntropicSolver(LpCost(1), 1, 2.0, 8.0, backend="multiscale")(x, y)
    assert info.kernel == "laplace-2" and info.kernel_error == 0.0
    x3, y3 = _clouds(3)
    for solver, a, b in (
        (EntropicSolver(LpCost(1), 1, 2.0, 8.0, backend="multiscale"), x3, y3),
        (EntropicSolver(LpCost(2), 2, 20.0, 8.0, backend="multiscale", taylor=False), x, y),
    ):
        _, info = solver(a, b)
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
    assert info.converged and info.kernel in ("dense", f"taylor-{order_for(2)}")
    assert value.item() == pytest.approx(exact.item(), rel=2e-5)


def test_the_taylor_kernel_needs_no_keops(monkeypatch):
    # Plain torch, like the exact ℓ1 kernel: they run where KeOps is missing (or, on a GPU,
    # crashes its compiler); the truncated kernel still needs KeOps and says so.
    monkeypatch.setattr(sinkhorn, "keops_import_error", lambda: "ImportError: no pykeops")
    x, y = _clouds(2)
    _, info = EntropicSolver(LpCost(2), 2, 20.0, 8.0, backend="multiscale")(x, y)
    assert info.kernel == f"taylor-{order_for(2)}" and info.converged
    _, info = EntropicSolver(LpCost(1), 1, 2.0, 8.0, backend="multiscale")(x, y)
    assert info.kernel == "laplace-2" and info.converged
    with pytest.raises(RuntimeError, match="'multiscale' backend needs KeOps.*no pykeops"):
        EntropicSolver(LpCost(2), 2, 20.0, 8.0, backend="multiscale", taylor=False)(x, y)


@pytest.mark.parametrize("backend", ["tensorized", "multiscale"])
def test_the_value_does_not_depend_on_which_cloud_needs_gradients(backend):
    # The returned pair is (T(g), g) with g = T(f) at λ in every case: a gradient to y only adds
    # a graph, never another potential, so only the summation order differs. (A solve that
    # converged on its first sweep must not pair f̃ with a g of the last annealing ε: that would
    # let a y-gradient change the value by 3e-3.)
    x, y = _clouds(1)
    solver = EntropicSolver(LpCost(2), 2, 19.2, 8.0, backend=backend)
    values = [
        solver(x.clone().requires_grad_(True), y.clone().requires_grad_(grad_y))[0].item()
        for grad_y in (False, True)
    ]
    assert values[0] == pytest.approx(values[1], rel=1e-12)


def _uneven_cloud(dim: int, side: float, sizes: list[int], seed: int) -> torch.Tensor:
    """Cells of ``sizes`` points (one with a single point) at scattered cubes of the grid of
    ``side``, with empty cubes between them."""
    gen = torch.Generator().manual_seed(seed)
    cells = torch.randperm(10**dim, generator=gen)[: len(sizes)]
    coords = torch.stack([cells // 10**r % 10 for r in range(dim)], 1).double() - 5
    return torch.cat(
        [
            (coords[k] + 0.02 + 0.96 * torch.rand(size, dim, generator=gen, dtype=torch.float64))
            * side
            for k, size in enumerate(sizes)
        ]
    )


def _pairwise_expansion(q: torch.Tensor, qgrid: Grid, s: torch.Tensor, sgrid: Grid, h, eps, k):
    """The expansion's f̂ and Ê[s | q] summed pair by pair: the exact weights times
    e^{−t} P_k(t), t_ij = 2⟨u_i, v_j⟩/ε (Σ_{|α|≤k} (2/ε)^{|α|} u^α v^α/α! = P_k(t))."""
    t = 2 * qgrid.offsets @ sgrid.offsets.T / eps
    poly = sum(t**n / math.factorial(n) for n in range(k + 1))
    logits = h - torch.cdist(q, s).square() / eps - t + poly.log()
    weights = torch.softmax(logits, 1)
    return -eps * torch.logsumexp(logits, 1), weights @ s


@pytest.mark.parametrize("dim", [1, 2, 3])
@pytest.mark.parametrize("chunk, group_cost", [(2**20, 2**14), (64, 0), (300, 2**40)])
def test_batched_expansion_equals_the_pairwise_formula(monkeypatch, dim, chunk, group_cost):
    # Cells of 1 to 300 points among empty cubes; small chunks split a cell's rows, the query
    # cells into blocks and the source groups; group costs of 0 / 2^40 give one group per size
    # class / one group for all cells. A misplaced moment or padded point breaks the equality.
    monkeypatch.setattr(expansion, "CHUNK_ELEMENTS", chunk)
    monkeypatch.setattr(expansion, "GROUP_COST", group_cost)
    eps, order = 0.7, order_for(dim)
    side = expansion_side(eps, dim, 1e-2, order)
    x = _uneven_cloud(dim, side, [1, 3, 40, 9, 300, 2, 17], seed=dim)
    y = _uneven_cloud(dim, side, [250, 1, 5, 64, 1, 30], seed=10 + dim)
    gx, gy = Grid(x, side), Grid(y, side)
    xs, ys = x[gx.perm], y[gy.perm]
    assert min(gx.sizes) == min(gy.sizes) == 1 and len(gx) == 7 and len(gy) == 6
    h = torch.randn(len(y), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    query = xs.clone().requires_grad_(True)
    f = expanded_softmin(query, gx, gy, h, eps, with_grad=True, order=order)
    (grad,) = torch.autograd.grad(f.sum(), query)
    f_pairs, mean = _pairwise_expansion(xs, gx, ys, gy, h, eps, order)
    torch.testing.assert_close(f.detach(), f_pairs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad, 2 * (xs - mean), rtol=1e-10, atol=1e-10)
    g = expanded_softmin(ys, gy, gx, xs[:, 0], eps, with_grad=False, order=order)
    torch.testing.assert_close(
        g, _pairwise_expansion(ys, gy, xs, gx, xs[:, 0], eps, order)[0], rtol=1e-10, atol=1e-10
    )
    # And within the certified bound of the exact softmin, not equal to it.
    rho = remainder(2 * gx.radius * gy.radius / eps, order)
    exact = -eps * torch.logsumexp(h - torch.cdist(xs, ys).square() / eps, 1)
    error = ((f.detach() - exact).abs() / eps).max()
    assert 1e-3 * rho < error <= -math.log1p(-rho)


def test_grid_groups_pad_each_point_once():
    x = _uneven_cloud(3, 0.5, [1, 3, 40, 9, 300, 2, 17, 18, 1], seed=0)
    grid = Grid(x, 0.5)
    assert grid.sizes == sorted(grid.sizes)
    torch.testing.assert_close(grid.offsets + grid.centres[grid.labels], x[grid.perm])
    for other in (1, 10**6):
        groups = grid.groups(other)
        index = torch.cat([i.flatten() for _, _, i in groups])
        assert [c for c0, c1, _ in groups for c in range(c0, c1)] == list(range(len(grid)))
        assert sorted(index[index < len(x)].tolist()) == list(range(len(x)))
        assert all(i.shape[1] == grid.sizes[c1 - 1] for _, c1, i in groups)
    assert len(grid.groups(10**6)) > len(grid.groups(1)) == 1  # padding only where it is cheap


def test_cell_ratio_widens_the_cells_of_the_spread_cloud():
    assert cell_ratio(1e6, 1e6, 3) == 1
    assert cell_ratio(1e6, 50e6, 3) == 4  # 50 = 4^{2.8}: r^3 ≈ 50
    assert cell_ratio(50e6, 1e6, 3) == 1 / 4
    assert cell_ratio(1.0, 1e12, 2) == 16  # at most sides × 4


def test_centroid_softmin_is_exact():
    x, y = _clouds(3)
    grid = Grid(x, 0.4)
    h = torch.randn(len(y), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    exact = -2.0 * torch.logsumexp(h - torch.cdist(x[grid.perm], y).square() / 2.0, 1)
    torch.testing.assert_close(centroid_softmin(grid, y, h, 2.0), exact, rtol=1e-12, atol=1e-12)


def test_a_compact_cloud_against_a_spread_one_takes_unequal_cells():
    # x in [-0.2, 0.2]³ against y of spread 1.5: y's cells wider (cell_ratio), the start
    # extrapolated from x's finer centroids; the contract holds as with equal cells.
    gen = torch.Generator().manual_seed(5)
    x = (torch.rand(300, 3, generator=gen, dtype=torch.float64) - 0.5) * 0.4
    y = torch.randn(600, 3, generator=gen, dtype=torch.float64) * 1.5
    reg, diameter = 4.0, 12.0
    solver = EntropicSolver(LpCost(2), 2, reg, diameter, backend="multiscale")
    grid_x, grid_y = solver._taylor_grids(x, y)
    assert grid_y.side == 4 * grid_x.side
    plan = entropic_plan_newton(x, y, 2, reg)
    xr = x.clone().requires_grad_(True)
    value, info = solver(xr, y)
    (grad,) = torch.autograd.grad(value, xr)
    ref_grad = entropic_gradient(plan, x, y, 2)
    assert info.kernel == f"taylor-{order_for(3)}" and info.converged
    assert value.item() == pytest.approx(
        entropic_value(plan, lp_cost(2)(x, y), reg).item(), rel=2e-4
    )
    assert ((grad - ref_grad).norm() / ref_grad.norm()).item() < 1e-4


def test_no_taylor_kernel_where_its_coefficients_would_overflow_the_dtype():
    # (2/λ)^{k+1} overflows float32 for λ ≲ 1e-9 at order 4: NaN values before this rule.
    x, y = _clouds(2)
    tiny = EntropicSolver(LpCost(2), 2, 1e-9, 8.0, backend="multiscale")
    assert tiny._taylor_grids(x.float() * 1e-4, y.float() * 1e-4) is None
    wide = EntropicSolver(LpCost(2), 2, 20.0, 8.0, backend="multiscale")
    assert wide._taylor_grids(x.float(), y.float()) is not None
