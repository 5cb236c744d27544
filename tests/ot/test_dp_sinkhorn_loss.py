"""The DP-Sinkhorn cost c_m and the semi-debiased Sinkhorn loss (Cao et al. 2021, Def. 4.3)
against a direct log-domain computation on small inputs."""

from __future__ import annotations

import pytest
import torch

from lightning_dpot.ot.dp_sinkhorn import (
    MixedL2L1Cost,
    SemiDebiasedSinkhorn,
    class_conditional_features,
    debias_rows,
    mixed_cost_diameter,
)


@pytest.fixture(autouse=True)
def _single_thread():
    """Tiny tensors: extra torch threads only spin on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reference_entropic_ot(x: torch.Tensor, y: torch.Tensor, cost, reg: float, iters: int = 1500):
    """Algorithm 3 of Cao et al. 2021 (log domain, uniform weights) on an explicit cost matrix."""
    c = cost(x, y)
    log_a = torch.full((x.shape[0],), -float(torch.log(torch.tensor(float(x.shape[0])))))
    log_b = torch.full((y.shape[0],), -float(torch.log(torch.tensor(float(y.shape[0])))))
    f = torch.zeros_like(log_a, dtype=x.dtype)
    g = torch.zeros_like(log_b, dtype=x.dtype)
    log_a, log_b = log_a.to(x.dtype), log_b.to(x.dtype)
    for _ in range(iters):
        f = -reg * torch.logsumexp(log_b[None, :] + (g[None, :] - c) / reg, dim=1)
        g = -reg * torch.logsumexp(log_a[:, None] + (f[:, None] - c) / reg, dim=0)
    return (log_a.exp() * f).sum() + (log_b.exp() * g).sum()


def test_mixed_cost_equals_squared_l2_plus_m_l1_without_a_big_intermediate():
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(7, 5, generator=gen), torch.randn(4, 5, generator=gen)
    diff = x[:, None, :] - y[None, :, :]
    expected = (diff**2).sum(-1) + 3.0 * diff.abs().sum(-1)
    torch.testing.assert_close(MixedL2L1Cost(3.0)(x, y), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(MixedL2L1Cost(0.0)(x, y), (diff**2).sum(-1), rtol=1e-5, atol=1e-5)


def test_class_features_add_the_onehot_penalty_between_different_classes():
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(5, 3, generator=gen), torch.randn(6, 3, generator=gen)
    lx, ly = torch.tensor([0, 1, 2, 0, 1]), torch.tensor([0, 0, 1, 2, 2, 1])
    m, alpha = 2.0, 15.0
    cost = MixedL2L1Cost(m)
    fx = class_conditional_features(x, lx, 3, alpha)
    fy = class_conditional_features(y, ly, 3, alpha)
    penalty = (2 * alpha**2 + 2 * m * alpha) * (lx[:, None] != ly[None, :]).float()
    torch.testing.assert_close(cost(fx, fy), cost(x, y) + penalty, rtol=1e-5, atol=1e-3)


def test_diameter_bounds_the_largest_cost_over_the_declared_box():
    dim, m, alpha = 6, 3.0, 15.0
    x, y = -torch.ones(1, dim), torch.ones(1, dim)
    fx = class_conditional_features(x, torch.tensor([0]), 2, alpha)
    fy = class_conditional_features(y, torch.tensor([1]), 2, alpha)
    largest = MixedL2L1Cost(m)(fx, fy).item()
    assert mixed_cost_diameter(dim, 2.0, m, alpha) ** 2 == pytest.approx(largest, rel=1e-6)


@pytest.mark.parametrize("p", [0.0, 0.4, 1.0])
def test_semi_debiased_loss_matches_definition_4_3(p: float):
    gen = torch.Generator().manual_seed(2)
    n = 5
    n_prime = debias_rows(n, p)
    x = torch.randn(n + n_prime, 3, dtype=torch.float64, generator=gen)
    y = torch.randn(4, 3, dtype=torch.float64, generator=gen)
    reg, m = 0.5, 1.0
    loss = SemiDebiasedSinkhorn(
        entropic_reg=reg, l1_weight=m, debias_fraction=p, diameter=30.0, scaling=0.99
    )
    cost = MixedL2L1Cost(m)
    expected = 2 * reference_entropic_ot(x[:n], y, cost, reg) - reference_entropic_ot(
        x[:n], x[n_prime : n + n_prime], cost, reg
    )
    assert loss(x, y, n).item() == pytest.approx(expected.item(), rel=2e-3, abs=2e-3)


def test_debias_rows_is_floor_n_p():
    assert debias_rows(50, 0.4) == 20
    assert debias_rows(10, 0.3) == 3
    assert debias_rows(7, 0.0) == 0
    assert debias_rows(7, 1.0) == 7
    with pytest.raises(ValueError, match="debias_fraction"):
        debias_rows(7, 1.5)


def test_gradient_of_debias_rows_does_not_depend_on_real_data():
    """Rows X[n:n+n'] enter only Ŵ(X[0:n], X[n':n+n']) (Cao et al. 2021, §4.3, B.1 (ii))."""
    gen = torch.Generator().manual_seed(3)
    n, p = 6, 0.5
    x = torch.randn(n + debias_rows(n, p), 4, generator=gen, requires_grad=True)
    y = torch.randn(5, 4, generator=gen)
    y2 = y.clone()
    y2[2] = torch.randn(4, generator=gen) * 3
    loss = SemiDebiasedSinkhorn(entropic_reg=0.1, debias_fraction=p, diameter=20.0)
    (g1,) = torch.autograd.grad(loss(x, y, n), x)
    (g2,) = torch.autograd.grad(loss(x, y2, n), x)
    torch.testing.assert_close(g1[n:], g2[n:], rtol=0, atol=0)
    assert not torch.allclose(g1[:n], g2[:n])


def test_an_empty_real_batch_leaves_the_debias_term_and_wrong_row_counts_are_refused():
    """With no real record the loss is −Ŵ(X[0:n], X[n':n+n']), whose
    gradient needs no data; the debias rows then get the same gradient as with data."""
    loss = SemiDebiasedSinkhorn(debias_fraction=0.4, diameter=20.0)
    x = torch.randn(7, 2, generator=torch.Generator().manual_seed(0)).requires_grad_()
    empty = loss(x, torch.zeros(0, 2), 5)
    debias = loss.entropic_ot(x[:5], x[2:7])
    assert empty.item() == pytest.approx(-debias.item())
    (grad_empty,) = torch.autograd.grad(empty, x)
    (grad_full,) = torch.autograd.grad(loss(x, torch.randn(4, 2), 5), x)
    torch.testing.assert_close(grad_empty[5:], grad_full[5:])  # debias rows: data-free
    assert torch.count_nonzero(grad_empty[5:]) == grad_empty[5:].numel()
    with pytest.raises(ValueError, match="rows"):
        loss(torch.zeros(6, 2), torch.zeros(3, 2), 5)
