"""The OT code under ``torch.autocast``: the solves, the exact OT and the sliced projections
give the float32 result, bit for bit, whatever the autocast region around them, and bfloat16
inputs are upcast (gradients flow back in the input's dtype)."""

from __future__ import annotations

import pytest
import torch

from lightning_dpot.ot import EntropicOT, ExactOT
from lightning_dpot.ot.dp_sinkhorn import SemiDebiasedSinkhorn
from lightning_dpot.ot.precision import full_precision, upcast
from lightning_dpot.ot.sliced import project, random_directions
from lightning_dpot.rng import seeded_generator


def _clouds(n: int = 40, m: int = 30, d: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, d, generator=g), torch.rand(m, d, generator=g)


def test_upcast_lifts_half_precisions_and_keeps_the_rest():
    for dtype in (torch.bfloat16, torch.float16):
        assert upcast(torch.zeros(2, dtype=dtype)).dtype == torch.float32
    for dtype in (torch.float32, torch.float64, torch.int64):
        x = torch.zeros(2, dtype=dtype)
        assert upcast(x) is x


def test_full_precision_leaves_autocast_and_upcasts_tensor_arguments():
    @full_precision
    def product(a, b, *, scale):
        return torch.is_autocast_enabled("cpu"), (a @ b) * scale

    a, b = _clouds(4, 3, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast, out = product(a.bfloat16(), b.T, scale=2.0)
    assert not autocast and out.dtype == torch.float32
    torch.testing.assert_close(out, (a.bfloat16().float() @ b.T) * 2.0, rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["tensorized", "newton"])
@pytest.mark.parametrize("p", [1, 2])
def test_entropic_solve_under_bf16_autocast_is_the_float32_solve(backend, p):
    loss = EntropicOT(p, entropic_reg=0.05, diameter=2.0, backend=backend)
    x, y = _clouds()
    expected = loss(x, y)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(x, y)
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, expected, rtol=0, atol=0)


def test_a_bfloat16_cloud_is_solved_in_float32_and_gets_a_bfloat16_gradient():
    loss = EntropicOT(2, entropic_reg=0.05, diameter=2.0)
    x, y = _clouds()
    x16 = x.bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value = loss(x16, y)
    value.backward()
    assert value.dtype == torch.float32 and x16.grad.dtype == torch.bfloat16
    torch.testing.assert_close(value, loss(x16.detach().float(), y), rtol=0, atol=0)


def test_semi_debiased_sinkhorn_and_exact_ot_ignore_autocast():
    x, y = _clouds(n=14, m=10, d=4)
    sinkhorn = SemiDebiasedSinkhorn(entropic_reg=0.5, diameter=4.0, debias_fraction=0.4)
    exact = ExactOT(2, diameter=4.0)
    expected = (sinkhorn(x, y, 10), exact(x[:10], y))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        values = (sinkhorn(x, y, 10), exact(x[:10], y))
    for value, reference in zip(values, expected, strict=True):
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, reference, rtol=0, atol=0)


def test_sliced_projections_ignore_autocast():
    x, _ = _clouds(d=5)
    theta = random_directions(7, 5, seeded_generator(1))
    expected = project(x, theta)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        projected = project(x, theta)
    torch.testing.assert_close(projected, expected, rtol=0, atol=0)
