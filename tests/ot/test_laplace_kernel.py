"""The exact ℓ1 softmin of :mod:`lightning_dpot.ot.laplace` against the dense ℓ1 cost and
logsumexp: values and gradients in 1-D and 2-D, with duplicate points, ties in one coordinate,
extreme potentials and ε down to 10⁻³ of the spread (both the linear and the log-domain
tables); and the multiscale p = 1 solve against the dense one, without KeOps."""

import pytest
import torch

import lightning_dpot.ot.sinkhorn as sinkhorn
from lightning_dpot.ot import EntropicSolver, LpCost, l1_cost
from lightning_dpot.ot.laplace import LINEAR_RANGE, LaplaceKernel, near_pair_count


def _clouds(dim: int, n: int = 300, m: int = 500):
    """Two clouds with duplicates, shared points and ties in the first coordinate."""
    gen = torch.Generator().manual_seed(dim)
    x = torch.rand(n, dim, generator=gen, dtype=torch.float64) * 2 - 1
    y = torch.randn(m, dim, generator=gen, dtype=torch.float64) * 1.5
    y[:40] = y[40:80]  # duplicate sources
    x[:20] = y[:20]  # shared points: ties in every coordinate
    x[20:50, 0] = y[100:130, 0]  # ties in the first coordinate only
    x[50:60] = x[60:70]  # duplicate queries
    return x, y


def _dense_softmin(q, s, h, eps):
    return -eps * torch.logsumexp(h[None, :] - l1_cost(q, s) / eps, 1)


def _spread(x, y):
    both = torch.cat([x, y])
    return float((both.amax(0) - both.amin(0)).sum())


@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("ratio", [1e-3, 3e-2, 1.0])
@pytest.mark.parametrize("scale", [1.0, 300.0])
def test_softmin_and_its_gradient_match_the_dense_l1_cost(dim, ratio, scale):
    # scale: the spread of the potentials h/ε; at ratio 1e-3 (and with scale 300) the
    # tables leave the linear range and run in the log domain.
    x, y = _clouds(dim)
    eps = ratio * _spread(x, y)
    gen = torch.Generator().manual_seed(7)
    h_y = torch.randn(len(y), generator=gen, dtype=torch.float64) * scale
    h_x = torch.randn(len(x), generator=gen, dtype=torch.float64) * scale
    kernel = LaplaceKernel(x.clone().requires_grad_(True), y.clone().requires_grad_(True))
    assert kernel.name == f"laplace-{dim}" and kernel.relative_error(eps) == 0.0
    for q, s, h, softmin, softmin_grad in (
        (x, y, h_y, kernel.softmin_x, kernel.softmin_x_grad),
        (y, x, h_x, kernel.softmin_y, kernel.softmin_y_grad),
    ):
        expected = _dense_softmin(q, s, h, eps)
        torch.testing.assert_close(softmin(eps, h), expected, rtol=1e-12, atol=1e-12 * eps)
        points = kernel.x if q is x else kernel.y
        value = softmin_grad(eps, h)
        torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-12 * eps)
        weights = torch.linspace(0.5, 1.5, len(q), dtype=torch.float64)
        (grad,) = torch.autograd.grad((weights * value).sum(), points)
        q_ = q.clone().requires_grad_(True)
        (grad_dense,) = torch.autograd.grad((weights * _dense_softmin(q_, s, h, eps)).sum(), q_)
        torch.testing.assert_close(grad, grad_dense, rtol=1e-10, atol=1e-10)


def test_both_table_paths_run_and_agree():
    # The same sums through the linear tables (R = range of h + diameter/ε within the linear
    # range) and through the log-domain ones (R pushed past it by one huge potential, whose
    # source the others' sums must still see exactly).
    x, y = _clouds(2)
    eps = 0.5
    kernel = LaplaceKernel(x, y)
    h = torch.zeros(len(y), dtype=torch.float64)
    assert kernel.plan_x.diameter / eps < LINEAR_RANGE
    far, near, total, shift = kernel.plan_x.weights(eps, h)
    assert bool((shift == 0).all())  # linear: one shift, max h
    h[3] = LINEAR_RANGE
    for values in (h, h.flip(0)):
        torch.testing.assert_close(
            kernel.softmin_x(eps, values), _dense_softmin(x, y, values, eps), rtol=1e-12, atol=0
        )


def test_float32_in_float32_out_and_no_overflow_at_tiny_eps():
    x, y = _clouds(2)
    kernel = LaplaceKernel(x.float(), y.float())
    eps = 1e-4 * _spread(x, y)
    h = torch.zeros(len(y))
    f = kernel.softmin_x(eps, h)
    assert f.dtype == torch.float32 and bool(torch.isfinite(f).all())
    torch.testing.assert_close(
        f, _dense_softmin(x.float().double(), y.float().double(), h.double(), eps).float()
    )


def test_rejects_other_dimensions():
    with pytest.raises(ValueError, match="d = 1 or 2"):
        LaplaceKernel(torch.zeros(3, 3), torch.zeros(4, 3))


@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("ratio", [1e-2, 0.3])
def test_multiscale_l1_solve_matches_the_dense_solve_without_keops(monkeypatch, dim, ratio):
    # Plain torch: it runs where KeOps is missing.
    monkeypatch.setattr(sinkhorn, "keops_import_error", lambda: "ImportError: no pykeops")
    x, y = _clouds(dim)
    diameter = 8.0 * dim
    reg = ratio * diameter
    results = []
    for backend in ("tensorized", "multiscale"):
        solver = EntropicSolver(LpCost(1), 1, reg, diameter, tol=1e-8, backend=backend)
        x_ = x.clone().requires_grad_(True)
        y_ = y.clone().requires_grad_(True)
        value, info = solver(x_, y_)
        assert info.converged and info.kernel_error == 0.0
        results.append((value.item(), *torch.autograd.grad(value, (x_, y_)), info.kernel))
    (dense, dense_gx, dense_gy, _), (value, gx, gy, kernel) = results
    assert kernel == f"laplace-{dim}"
    assert value == pytest.approx(dense, rel=1e-7)
    assert ((gx - dense_gx).norm() / dense_gx.norm()).item() < 1e-6
    assert ((gy - dense_gy).norm() / dense_gy.norm()).item() < 1e-6


def test_points_on_a_line_make_every_pair_near_and_multiscale_keeps_the_truncated_kernel():
    # Blocks cannot split tied coordinates: the near pairs, and the kernel's memory, would grow
    # with N·M, so above a quarter of the pairs the solver does not take the exact kernel.
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(300, 2, generator=gen), torch.rand(400, 2, generator=gen)
    solver = EntropicSolver(LpCost(1), 1, 0.5, 4.0, backend="multiscale")
    assert near_pair_count(x, y) < 0.25 * 300 * 400
    assert solver._multiscale_kernel(x, y) == ("laplace", None)
    x[:, 0], y[:, 0] = 0.5, 0.5
    assert near_pair_count(x, y) == 300 * 400
    assert solver._multiscale_kernel(x, y) == ("truncated", None)
