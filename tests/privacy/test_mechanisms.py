"""Mechanisms: noise scales, empirical noise statistics, refusals."""

import math

import pytest
import torch

from lightning_dpot.privacy.mechanisms.additive import (
    GaussianMechanism,
    LaplaceMechanism,
    make_mechanism,
)
from lightning_dpot.privacy.mechanisms.sensitivity import declared_sensitivity


def test_laplace_scale_is_sensitivity_over_epsilon():
    # Reshetova et al. 2024, Fig. 3: Δ1 = 1568, ε = 196 → b = 8.
    assert LaplaceMechanism(196.0, 1568.0).noise_scale == pytest.approx(8.0)


def test_laplace_from_scale_reports_epsilon_from_declared_sensitivity():
    # "σ = 3 → ε = 97" in Reshetova et al. 2024 does not fit Δ1 = 1568; the correct value is
    # 522.7 (docs/design.md#entropic-p-wgan).
    assert LaplaceMechanism.from_scale(3.0, 1568.0).epsilon == pytest.approx(522.67, abs=0.01)


def test_laplace_noise_has_declared_scale():
    mech = LaplaceMechanism(2.0, 3.0)
    z = mech.sample_noise((400_000,), torch.Generator().manual_seed(0)).double()
    b = mech.noise_scale
    assert z.abs().mean().item() == pytest.approx(b, rel=0.01)  # E|Z| = b
    assert z.var().item() == pytest.approx(2 * b * b, rel=0.02)  # Var Z = 2b²
    assert abs(z.mean().item()) < 0.01 * b


def test_gaussian_noise_has_declared_std():
    mech = GaussianMechanism(5.0, 1e-4, 2.0)
    z = mech.sample_noise((400_000,), torch.Generator().manual_seed(0)).double()
    assert z.std().item() == pytest.approx(mech.noise_scale, rel=0.01)
    assert abs(z.mean().item()) < 0.01 * mech.noise_scale


def test_gaussian_from_scale_keeps_the_stated_sigma():
    mech = GaussianMechanism.from_scale(9.17, 1e-4, 40.0)
    assert mech.noise_scale == 9.17
    assert mech.epsilon == pytest.approx(25.0, abs=0.05)


def test_noise_is_reproducible_from_generator_only():
    mech = LaplaceMechanism(1.0, 1.0)
    a = mech.sample_noise((10,), torch.Generator().manual_seed(3))
    b = mech.sample_noise((10,), torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_make_mechanism_needs_exactly_one_of_epsilon_or_scale():
    with pytest.raises(ValueError, match="exactly one of epsilon or noise_scale"):
        make_mechanism("laplace", 1.0)
    with pytest.raises(ValueError, match="exactly one of epsilon or noise_scale"):
        make_mechanism("laplace", 1.0, epsilon=1.0, noise_scale=1.0)


def test_make_mechanism_refusals():
    with pytest.raises(ValueError, match="delta is required"):
        make_mechanism("gaussian", 1.0, epsilon=1.0)
    with pytest.raises(ValueError, match="delta must be unset"):
        make_mechanism("laplace", 1.0, epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="mechanism must be"):
        make_mechanism("exponential", 1.0, epsilon=1.0)
    with pytest.raises(ValueError, match="sensitivity_l1 must be a finite number > 0"):
        LaplaceMechanism(1.0, 0.0)
    with pytest.raises(ValueError, match="epsilon must be a finite number > 0"):
        LaplaceMechanism(math.inf, 1.0)


def test_declared_sensitivities_reproduce_paper_values():
    d = 784
    assert declared_sensitivity(1, 2.0 * d, 2.0 * math.sqrt(d), d) == pytest.approx(1568)
    assert declared_sensitivity(2, 2.0 * d, 2.0 * math.sqrt(d), d) == pytest.approx(56)
    assert declared_sensitivity(1, 1568, 56, d, l1_radius=350) == pytest.approx(700)
    assert declared_sensitivity(1, 1568, 56, d, l1_radius=275) == pytest.approx(550)
    assert declared_sensitivity(2, 1568, 56, d, l2_radius=20) == pytest.approx(40)
    # An ℓ1 ball of radius R also bounds the ℓ2 norm by R.
    assert declared_sensitivity(2, 1568, 56, d, l1_radius=10) == pytest.approx(20)


def test_unbounded_declarations_without_projection_are_refused():
    with pytest.raises(ValueError, match="sensitivity_l2 is unbounded"):
        declared_sensitivity(2, math.inf, math.inf, 4)
    assert declared_sensitivity(2, math.inf, math.inf, 4, l2_radius=1.5) == 3.0


@pytest.mark.parametrize("name", ["laplace", "gaussian"])
def test_in_place_noise_is_bit_identical_to_the_textbook_formula(name):
    """The noise is computed in place for speed; the output must be exactly what the
    out-of-place formula gives from the same generator."""
    mech = make_mechanism(name, 2.0, epsilon=1.0, delta=None if name == "laplace" else 1e-5)
    shape = (500, 37)
    ours = mech.sample_noise(shape, torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(4)
    if name == "laplace":
        u = torch.rand(shape, generator=g, dtype=torch.float64) - 0.5
        expected = -mech.noise_scale * torch.sign(u) * torch.log1p(-2.0 * u.abs())
    else:
        expected = torch.randn(shape, generator=g, dtype=torch.float64) * mech.noise_scale
    assert torch.equal(ours, expected.to(torch.float32))


def test_local_release_is_float32_and_unchanged_inside_a_bf16_autocast_region():
    """The DCT, the ℓ1 projection and the noise of the local randomizer run in float32 with
    autocast off: a bfloat16 transform could leave a record outside the radius that the
    sensitivity assumes."""
    from lightning_dpot.privacy.mechanisms.ldp import LocalRandomizer
    from lightning_dpot.privacy.mechanisms.transforms import DCT2D

    transform = DCT2D((1, 8, 8), keep=4)
    randomizer = LocalRandomizer.build(
        "laplace", transform, -1.0, 1.0, 2.0 * 64, 2.0 * 8, epsilon=5.0, l1_radius=10.0
    )
    x = torch.rand(6, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1
    expected = randomizer(x, torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        released = randomizer(x, torch.Generator().manual_seed(1))
    assert released.dtype == torch.float32
    torch.testing.assert_close(released, expected, rtol=0, atol=0)
