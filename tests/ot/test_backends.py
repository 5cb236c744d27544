"""The Sinkhorn backends agree: dense (tensorized), KeOps online and KeOps multiscale give the
same value and gradient, and match the Newton reference; ``auto`` picks by size and dimension
and falls back to dense, loudly, without KeOps.

KeOps compiles each formula once per dimension and dtype (about 10 s on CI, then cached on
disk), so these tests use few formulas: ℓ1 and ‖·‖² in 2-D and ‖·‖² in 3-D, float64.
"""

import pytest
import torch

import lightning_dpot.ot.keops as keops
import lightning_dpot.ot.sinkhorn as sinkhorn
from lightning_dpot.ot import EntropicOT, EntropicSolver, LpCost, entropic_plan_newton, lp_cost
from lightning_dpot.ot.reference import entropic_gradient, entropic_value

pytest.importorskip("pykeops")


def _clouds(dim: int, n: int = 300, m: int = 400):
    gen = torch.Generator().manual_seed(dim)
    x = torch.rand(n, dim, generator=gen, dtype=torch.float64) * 2 - 1
    y = torch.randn(m, dim, generator=gen, dtype=torch.float64) * 0.7
    return x, y


def _value_and_grad(solver: EntropicSolver, x, y):
    x = x.clone().requires_grad_(True)
    value, info = solver(x, y)
    (grad,) = torch.autograd.grad(value, x)
    return value.item(), grad, info


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("ratio", [1e-2, 0.3])
def test_backends_agree_with_each_other_and_the_reference(p, ratio):
    x, y = _clouds(2)
    diameter = 8.0
    reg = ratio * diameter**p
    plan = entropic_plan_newton(x, y, p, reg)
    ref_value = entropic_value(plan, lp_cost(p)(x, y), reg).item()
    ref_grad = entropic_gradient(plan, x, y, p)
    for backend in ("tensorized", "online", "multiscale"):
        # A fine grid (cluster_scale 0.25) so that truncation really drops cluster pairs; the
        # Taylor kernel of p = 2 is tested in test_expansion.py.
        solver = EntropicSolver(
            LpCost(p), p, reg, diameter, tol=1e-7, backend=backend, cluster_scale=0.25,
            taylor=False,
        )  # fmt: skip
        value, grad, info = _value_and_grad(solver, x, y)
        assert info.backend == backend and info.converged
        assert info.kernel == {"tensorized": "dense", "online": "keops"}.get(
            backend, "laplace-2" if p == 1 else "keops-truncated"
        )
        assert value == pytest.approx(ref_value, rel=1e-3), backend
        assert ((grad - ref_grad).norm() / ref_grad.norm()).item() < 1e-3, backend


def test_online_backend_in_3d_with_gradients_to_both_clouds():
    x, y = _clouds(3, 200, 150)
    results = []
    for backend in ("tensorized", "online"):
        xr, yr = x.clone().requires_grad_(True), y.clone().requires_grad_(True)
        loss = EntropicOT(2, 0.5, diameter=6.0, tol=1e-7, backend=backend)
        value = loss(xr, yr)
        value.backward()
        results.append((value.item(), xr.grad, yr.grad))
    (v0, gx0, gy0), (v1, gx1, gy1) = results
    assert v1 == pytest.approx(v0, rel=1e-6)
    torch.testing.assert_close(gx1, gx0, rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(gy1, gy0, rtol=1e-5, atol=1e-9)


def test_auto_chooses_by_size_and_dimension():
    solver = EntropicSolver(LpCost(2), 2, 1.0, 10.0)
    assert solver.choose_backend(400, 400, 784) == "tensorized"
    assert solver.choose_backend(2000, 20_000, 2) == "multiscale"
    assert solver.choose_backend(20_000, 60_000, 784) == "online"
    assert solver.choose_backend(100, 100, 2) == "tensorized"
    l1 = EntropicSolver(LpCost(1), 1, 1.0, 10.0)  # the exact ℓ1 kernel from 10⁵ pairs, d ≤ 2
    assert l1.choose_backend(2000, 2000, 2) == "multiscale"
    assert l1.choose_backend(200, 200, 2) == "tensorized"
    assert l1.choose_backend(2000, 2000, 3) == "multiscale"  # above 2^20 pairs, truncated


def test_auto_stays_dense_on_a_gpu_while_the_solve_fits():
    """On a GPU the dense sweeps are fast: the paper-scale 2,000 × 400,000 solve stays dense
    when it fits in the device memory budget, and leaves it only beyond."""
    roomy = EntropicSolver(LpCost(2), 2, 1.0, 10.0, dense_memory_limit=16 * 2**30)
    assert roomy.choose_backend(2000, 400_000, 2, "cuda") == "tensorized"
    assert roomy.choose_backend(2000, 400_000, 2, "cpu") == "multiscale"
    tight = EntropicSolver(LpCost(2), 2, 1.0, 10.0, dense_memory_limit=2**30)
    assert tight.choose_backend(2000, 400_000, 2, "cuda") == "multiscale"
    assert tight.choose_backend(20_000, 60_000, 784, "cuda") == "online"
    assert tight.choose_backend(2000, 20_000, 2, "cuda", itemsize=4) == "tensorized"
    assert tight.choose_backend(2000, 60_000, 2, "cuda", itemsize=8) == "multiscale"


def test_a_keops_kernel_that_crashes_its_process_is_reported_not_fatal(monkeypatch):
    """KeOps' CUDA JIT can segfault (KeOps 2.3 under CUDA 13); the check runs it in a child, so
    the caller gets the reason, and a kernel that fails to build is reported the same way."""
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    monkeypatch.setattr(keops, "_PROBE", crash)
    keops._child_error.cache_clear()
    error = keops.keops_cuda_error(LpCost(2), 2, torch.float32, "cpu")
    assert "was killed by SIGSEGV" in error and "SqDist(X, Y)" in error
    monkeypatch.undo()
    keops._child_error.cache_clear()
    error = keops._child_error("Nonsense(X)", "{}", 2, "float32", "cpu")
    assert "failed" in error and "Nonsense" in error


def test_without_keops_auto_stays_dense_and_explicit_requests_fail_clearly(monkeypatch):
    monkeypatch.setattr(sinkhorn, "keops_import_error", lambda: "ImportError: no pykeops")
    x, y = _clouds(2, 50, 60)
    auto = EntropicSolver(LpCost(2), 2, 1.0, 8.0)
    assert auto.choose_backend(2000, 20_000, 2) == "tensorized"
    with pytest.raises(RuntimeError, match="'online' backend needs KeOps.*no pykeops"):
        EntropicSolver(LpCost(2), 2, 1.0, 8.0, backend="online")(x, y)


def test_multiscale_refuses_high_dimensions():
    x, y = _clouds(2, 20, 20)
    with pytest.raises(ValueError, match="multiscale.*d <= 3"):
        EntropicSolver(LpCost(2), 2, 1.0, 8.0, backend="multiscale")(x.repeat(1, 2), y.repeat(1, 2))
