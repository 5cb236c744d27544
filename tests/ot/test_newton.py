"""The ``newton`` backend: DP-Sinkhorn's small-λ solves meet the convergence contract (value 1e-3,
gradient 2e-2 against the float64 reference) with a fixed amount of work."""

from __future__ import annotations

import math

import pytest
import torch

import lightning_dpot.ot.newton as newton
from lightning_dpot.ot import EntropicSolver, LpCost, MixedL2L1Cost, entropic_plan_newton
from lightning_dpot.ot.dp_sinkhorn import (
    SemiDebiasedSinkhorn,
    class_conditional_features,
    mixed_cost_diameter,
)
from lightning_dpot.ot.reference import entropic_value

N_CROSS, N_DEBIAS, CLASSES, ALPHA = 50, 20, 10, 15.0
DIAMETER = mixed_cost_diameter(784, 2.0, 1.0, ALPHA)


def _smooth(k: int, gen: torch.Generator, width: float) -> torch.Tensor:
    """Random smooth 28 × 28 images (separable Gaussian blur of white noise), unit variance."""
    z = torch.randn(k, 1, 28, 28, generator=gen)
    r = torch.arange(-6, 7, dtype=torch.float32)
    kernel = torch.exp(-(r**2) / (2 * width**2))
    kernel = kernel / kernel.sum()
    z = torch.nn.functional.conv2d(z, kernel.view(1, 1, 1, -1), padding=(0, 6))
    z = torch.nn.functional.conv2d(z, kernel.view(1, 1, -1, 1), padding=(6, 0))
    return (z / z.std()).reshape(k, 1, 28, 28)


def _digits(k: int, gen: torch.Generator) -> torch.Tensor:
    """MNIST-like strokes: background at −1 (exactly, in float32), strokes near +1."""
    return torch.tanh(4 * (_smooth(k, gen, 1.5) - 1.0))


def _batch(kind: str, m: int = 50, seed: int = 0):
    """Generated rows (n + n'), their labels, real rows (m) and labels at a stage of training."""
    gen = torch.Generator().manual_seed(seed)
    rows = N_CROSS + N_DEBIAS
    labels = torch.randint(CLASSES, (rows,), generator=gen)
    real = _digits(m, gen)
    real_labels = torch.randint(CLASSES, (m,), generator=gen)
    if kind == "early":  # grey images near 0 against digits
        fake = 0.1 * torch.tanh(_smooth(rows, gen, 2.0))
    elif kind == "late":  # near-copies of real records: cost gaps of the order of λ
        pick = torch.randint(m, (rows,), generator=gen)
        fake = (real[pick] + 0.05 * torch.randn(rows, 1, 28, 28, generator=gen)).clamp(-1, 1)
        labels = real_labels[pick].clone()
    else:  # uniform pixels
        fake = torch.rand(rows, 1, 28, 28, generator=gen) * 2 - 1
    return fake, labels, real, real_labels


def _reference_loss(fake, labels, real, real_labels, reg: float):
    """Ŝ and its gradient in ``fake`` from float64 reference plans (envelope theorem)."""
    cost = MixedL2L1Cost(1.0)
    x = fake.double().requires_grad_(True)
    fx = class_conditional_features(x, labels, CLASSES, ALPHA)
    fy = class_conditional_features(real.double(), real_labels, CLASSES, ALPHA)
    total = x.new_zeros(())
    for weight, a, b in ((2.0, fx[:N_CROSS], fy), (-1.0, fx[:N_CROSS], fx[N_DEBIAS:])):
        plan = entropic_plan_newton(a.detach(), b.detach(), 2, reg, cost_fn=cost)
        value = entropic_value(plan, cost(a.detach(), b.detach()), reg)
        # ⟨π*, C(x)⟩ has the gradient Σ_j π*_ij ∇c; shift it to the value W = ⟨π*, C⟩ + λ KL.
        linear = (plan * cost(a, b)).sum()
        total = total + weight * (linear - linear.detach() + value)
    (grad,) = torch.autograd.grad(total, x)
    return float(total.detach()), grad


@pytest.mark.parametrize("kind", ["early", "late", "uniform"])
@pytest.mark.parametrize("fixed_budget", [True, False])
def test_dp_sinkhorn_meets_the_contract_at_lambda_1e_5_of_the_cost_bound(kind, fixed_budget):
    """Paper settings (50 + 20 generated rows, 50 real, ‖·‖₂² + ‖·‖₁ + class features) at
    λ = 10⁻⁵·D²: value within 1e-3 and gradient within 2e-2 of the reference. Sinkhorn at its
    2,000-sweep cap misses both (gradient errors up to 0.9)."""
    reg = 1e-5 * DIAMETER**2
    fake, labels, real, real_labels = _batch(kind)
    loss_fn = SemiDebiasedSinkhorn(
        reg, 1.0, 0.4, CLASSES, ALPHA, DIAMETER, fixed_budget=fixed_budget
    )
    x = fake.clone().requires_grad_(True)
    loss = loss_fn(x, real, N_CROSS, labels, real_labels)
    loss.backward()
    value, grad = _reference_loss(fake, labels, real, real_labels, reg)
    assert abs(float(loss) - value) <= 1e-3 * max(abs(value), reg)
    error = float((x.grad.double() - grad).norm() / grad.norm())
    assert error <= 2e-2, error
    assert (loss_fn.last_info is None) == fixed_budget
    if not fixed_budget:
        assert loss_fn.last_info.backend == "newton" and loss_fn.last_info.converged


def test_fixed_budget_work_is_the_same_for_any_data(monkeypatch):
    """The number of factorizations depends on sizes, λ and D only, never on the records (and
    the retry of a failed one never runs on these); the cross and debias solves (50 × 50 each)
    share one batched path."""
    calls: list[str] = []
    for name in ("cholesky_ex", "cholesky"):
        real = getattr(torch.linalg, name)
        monkeypatch.setattr(
            torch.linalg, name, lambda *a, _f=real, _n=name, **k: calls.append(_n) or _f(*a, **k)
        )
    reg = 1e-5 * DIAMETER**2
    counts = []
    for kind in ("early", "late", "uniform"):
        fake, labels, real, real_labels = _batch(kind)
        loss_fn = SemiDebiasedSinkhorn(reg, 1.0, 0.4, CLASSES, ALPHA, DIAMETER, fixed_budget=True)
        calls.clear()
        loss_fn(fake, real, N_CROSS, labels, real_labels)
        counts.append(list(calls))
    stages = len(newton.halving_schedule(DIAMETER**2, reg))
    assert counts == [["cholesky_ex"] * (2 * (stages - 1) + newton.FINAL_STEPS)] * 3


def test_a_batched_path_gives_each_problem_its_own_potential():
    """``solve_many`` on pairs of equal sizes (one batched path) returns what separate solves
    return, value and gradient, for private and non-private solvers."""
    reg = 1e-5 * DIAMETER**2
    fake, labels, real, real_labels = _batch("uniform")
    fx = class_conditional_features(fake, labels, CLASSES, ALPHA)
    fy = class_conditional_features(real, real_labels, CLASSES, ALPHA)
    for fixed_budget in (True, False):
        solver = EntropicSolver(MixedL2L1Cost(1.0), 2, reg, DIAMETER, fixed_budget=fixed_budget)
        x = fx[:N_CROSS].clone().requires_grad_(True)
        pairs = [(x, fx[N_DEBIAS:]), (x, fy)]
        together = [value for value, _ in solver.solve_many(pairs)]
        (grad_together,) = torch.autograd.grad(together[0] - 2 * together[1], x)
        apart = [solver(a, b)[0] for a, b in pairs]
        (grad_apart,) = torch.autograd.grad(apart[0] - 2 * apart[1], x)
        torch.testing.assert_close(torch.stack(together), torch.stack(apart))
        torch.testing.assert_close(grad_together, grad_apart)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("ratio", [1e-3, 1e-6])
def test_newton_backend_matches_the_reference_on_lp_costs(p, ratio):
    gen = torch.Generator().manual_seed(p)
    x = torch.rand(40, 2, generator=gen, dtype=torch.float64) * 2 - 1
    y = torch.randn(30, 2, generator=gen, dtype=torch.float64) * 0.4
    diameter = 4.0 if p == 1 else 2 * math.sqrt(2) + 2
    reg = ratio * diameter**p
    solver = EntropicSolver(LpCost(p), p, reg, diameter, backend="newton", tol=1e-6)
    xr = x.clone().requires_grad_(True)
    value, info = solver(xr, y)
    value.backward()
    plan = entropic_plan_newton(x, y, p, reg)
    reference = entropic_value(plan, LpCost(p)(x, y), reg)
    diff = x[:, None, :] - y[None, :, :]
    grad = (plan[..., None] * (2 * diff if p == 2 else diff.sign())).sum(1)
    assert info.converged and info.marginal_error <= 1e-6
    assert abs(float(value) - float(reference)) <= 1e-6 * max(abs(float(reference)), reg)
    assert float((xr.grad - grad).norm() / grad.norm()) <= 1e-4


def test_auto_takes_newton_for_small_solves_at_small_lambda_and_fixed_budget_forces_it():
    small = EntropicSolver(LpCost(2), 2, 1e-4, 1.0)
    assert small.choose_backend(50, 70, 794) == "newton"
    assert small.choose_backend(2000, 2000, 794) == "tensorized"
    assert EntropicSolver(LpCost(2), 2, 0.1, 1.0).choose_backend(50, 70, 794) == "tensorized"
    private = EntropicSolver(LpCost(2), 2, 0.1, 1.0, fixed_budget=True)
    assert private.choose_backend(2000, 2000, 794) == "newton"
    with pytest.raises(ValueError, match="fixed_budget=True .* got 'tensorized'"):
        EntropicSolver(LpCost(2), 2, 0.1, 1.0, backend="tensorized", fixed_budget=True)


def test_a_problem_solved_in_a_batch_is_solved_exactly_as_alone():
    """Bit for bit, also where the step candidates are evaluated in chunks (N·M·4 > 2¹⁸): the
    debias rows DP-Sinkhorn releases without noise must not depend on whether the cross problem
    happened to share their batch."""
    gen = torch.Generator().manual_seed(3)
    for n in (50, 200):
        costs = torch.rand(2, n, n, generator=gen, dtype=torch.float64) * 100
        together = newton.semi_dual_potential(costs, 100.0, 1e-3)
        for b in range(2):
            assert torch.equal(together[b], newton.semi_dual_potential(costs[b], 100.0, 1e-3))


def test_a_failed_factorization_takes_the_jacobi_direction_chosen_on_the_device():
    """A Hessian that is not positive definite gives rhs / diag(H) for its problem, and the
    other problems of the batch keep their exact Newton direction."""
    good = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    bad = torch.tensor([[1.0, 3.0], [3.0, 2.0]], dtype=torch.float64)  # eigenvalues of both signs
    rhs = torch.tensor([[1.0, -1.0], [1.0, -1.0]], dtype=torch.float64)
    out = newton._solve_spd(torch.stack([good, bad]), rhs)
    torch.testing.assert_close(out[0], torch.linalg.solve(good, rhs[0]), rtol=1e-12, atol=0)
    assert torch.equal(out[1], rhs[1] / bad.diagonal())


def test_the_fixed_budget_solve_reads_nothing_back_to_the_host():
    """No ``item``/``bool`` of a tensor (a device-to-host synchronization on a GPU), no
    data-dependent shape and no tensor built from host data in a solve, batched or not."""
    from torch.profiler import profile

    fake, labels, real, real_labels = _batch("uniform")
    cost = MixedL2L1Cost(1.0)(fake.reshape(len(fake), -1)[:N_CROSS], real.reshape(len(real), -1))
    newton.semi_dual_potential(cost, DIAMETER**2, 1e-5 * DIAMETER**2)  # constants made once
    with profile() as prof:
        newton.semi_dual_potential(cost.double(), DIAMETER**2, 1e-5 * DIAMETER**2)
        newton.semi_dual_potential(torch.stack([cost, cost]), DIAMETER**2, 1e-5 * DIAMETER**2)
    waits = {"aten::_local_scalar_dense", "aten::nonzero", "aten::lift_fresh"}
    assert [e.name for e in prof.events() if e.name in waits] == []


def test_captured_potentials_run_the_eager_solve_off_the_gpu_and_pickle_without_graphs():
    """On the CPU ``CapturedPotentials`` is the eager solve (same values, nothing captured); a
    copy carries no device state."""
    import pickle

    from lightning_dpot.ot.graphs import CapturedPotentials

    fake, labels, real, real_labels = _batch("late")
    cost = MixedL2L1Cost(1.0)(fake.reshape(len(fake), -1)[:N_CROSS], real.reshape(len(real), -1))
    captured = CapturedPotentials()
    eps0, reg = DIAMETER**2, 1e-5 * DIAMETER**2
    assert torch.equal(captured(cost, eps0, reg), newton.semi_dual_potential(cost, eps0, reg))
    assert len(captured) == 0
    assert len(pickle.loads(pickle.dumps(captured))) == 0
