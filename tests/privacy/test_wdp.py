"""Wasserstein DP of Yang et al. 2024: closed forms, conversions, Wasserstein accountant, labels."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
from scipy.stats import norm

from lightning_dpot.commands.account import build_parser
from lightning_dpot.privacy.accounting.wdp import (
    WDPGuarantee,
    wdp_from_dp,
    wdp_from_rdp,
    wdp_gaussian,
    wdp_laplace,
)
from lightning_dpot.privacy.accounting.wdp_accountant import (
    gaussian_absolute_moment,
    subsampled_gaussian_wdp_loss,
    wasserstein_accountant,
    wdp_compose,
)

FIG1_SCALES = (1.0, 2.0, 3.0, 5.0)  # Yang et al. 2024, Fig. 1: λ, σ ∈ {1,2,3,5}, Δ = 1, μ ∈ 1..10
FIG1_ORDERS = tuple(float(mu) for mu in range(1, 11))


def test_gaussian_closed_form_exact_values():
    # Proposition 8: ½ (Δ/σ)^(1/μ)
    assert wdp_gaussian(scale=2.0, sensitivity=1.0, order=2.0).epsilon == pytest.approx(
        0.5 * math.sqrt(0.5), rel=1e-14
    )
    assert wdp_gaussian(scale=1.0, sensitivity=4.0, order=2.0).epsilon == pytest.approx(1.0)
    for order in FIG1_ORDERS:
        assert wdp_gaussian(scale=1.0, sensitivity=1.0, order=order).epsilon == 0.5


def test_laplace_closed_form_exact_values():
    # Proposition 7 with λ = 1: KL = 1 + e^-1 - 1 = e^-1, so ε = ½ Δ (2/e)^(1/(2μ))
    assert wdp_laplace(scale=1.0, sensitivity=1.0, order=1.0).epsilon == pytest.approx(
        0.4288819424803534, rel=1e-12
    )
    assert wdp_laplace(scale=1.0, sensitivity=2.0, order=2.0).epsilon == pytest.approx(
        (2.0 / math.e) ** 0.25, rel=1e-12
    )
    # λ = 2: KL = 0.5 + e^-0.5 - 1
    kl = 0.5 + math.exp(-0.5) - 1.0
    assert wdp_laplace(scale=2.0, sensitivity=3.0, order=3.0).epsilon == pytest.approx(
        1.5 * (2.0 * kl) ** (1.0 / 6.0), rel=1e-12
    )


@pytest.mark.parametrize("mechanism", [wdp_gaussian, wdp_laplace])
@pytest.mark.parametrize("scale", FIG1_SCALES)
def test_fig1_curves_do_not_decrease_with_the_order(mechanism, scale):
    values = [mechanism(scale, 1.0, order).epsilon for order in FIG1_ORDERS]
    assert all(a <= b for a, b in zip(values, values[1:], strict=False))
    if not (mechanism is wdp_gaussian and scale == 1.0):  # ½·1^(1/μ) is flat
        assert all(a < b for a, b in zip(values, values[1:], strict=False))


@pytest.mark.parametrize("mechanism", [wdp_gaussian, wdp_laplace])
@pytest.mark.parametrize("order", FIG1_ORDERS)
def test_fig1_curves_decrease_with_the_noise_scale(mechanism, order):
    values = [mechanism(scale, 1.0, order).epsilon for scale in FIG1_SCALES]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))


def test_conversions_from_dp_and_rdp_exact_values():
    # Proposition 9: ½ Δ (2 ε (e^ε − 1))^(1/(2μ))
    assert wdp_from_dp(1.0, 1.0, 1.0).epsilon == pytest.approx(
        0.5 * math.sqrt(2.0 * (math.e - 1.0)), rel=1e-12
    )
    assert wdp_from_dp(0.5, 2.0, 2.0).epsilon == pytest.approx(
        (math.exp(0.5) - 1.0) ** 0.25, rel=1e-12
    )
    # Proposition 10: ½ Δ (2 ε)^(1/(2μ)), independent of the RDP order α ≥ 1
    assert wdp_from_rdp(0.5, 1.0, 1.0).epsilon == pytest.approx(0.5)
    assert wdp_from_rdp(2.0, 2.0, 2.0, rdp_order=8.0).epsilon == pytest.approx(math.sqrt(2.0))


@pytest.mark.parametrize(
    ("mean", "std", "order"), [(0.3, 1.2, 1.0), (0.3, 1.2, 2.5), (2.0, 0.7, 3.0), (-1.0, 2.0, 1.5)]
)
def test_absolute_moment_matches_monte_carlo(mean, std, order):
    rng = np.random.default_rng(20240607)
    samples = np.abs(rng.normal(mean, std, size=400_000)) ** order
    standard_error = samples.std() / math.sqrt(samples.size)
    assert abs(gaussian_absolute_moment(mean, std, order) - samples.mean()) < 5 * standard_error


def test_absolute_moment_exact_for_integer_orders():
    mean, std = 0.7, 1.3
    folded_normal_mean = std * math.sqrt(2 / math.pi) * math.exp(-(mean**2) / (2 * std**2)) + (
        mean * (1 - 2 * norm.cdf(-mean / std))
    )
    assert gaussian_absolute_moment(mean, std, 1.0) == pytest.approx(folded_normal_mean, rel=1e-12)
    assert gaussian_absolute_moment(mean, std, 2.0) == pytest.approx(mean**2 + std**2, rel=1e-12)
    fourth = mean**4 + 6 * mean**2 * std**2 + 3 * std**4
    assert gaussian_absolute_moment(mean, std, 4.0) == pytest.approx(fourth, rel=1e-12)


def test_accountant_matches_corollary_1_for_order_two():
    # μ = 2: E|Z|² = (qΔ)² + (2 − 2q + 2q²)(zΔ)², loss = sqrt of it, ε = T·loss − log(δ)/β
    z, q, steps, sensitivity, beta, delta = 1.1, 0.02, 250, 0.5, 2.0, 1e-5
    loss = math.sqrt((q * sensitivity) ** 2 + (2 - 2 * q + 2 * q * q) * (z * sensitivity) ** 2)
    expected = steps * loss - math.log(delta) / beta
    result = wasserstein_accountant(z, q, steps, sensitivity, 2.0, beta, delta)
    assert result.epsilon == pytest.approx(expected, rel=1e-12)
    assert result.failure_probability == delta
    assert result.worst_case


def test_compose_is_sum_of_step_losses_plus_tail_term():
    assert wdp_compose([0.1, 0.2, 0.3], beta=4.0, delta=math.exp(-8.0)) == pytest.approx(2.6)


def test_worst_case_accountant_dominates_observed_distances_within_sensitivity():
    kwargs = dict(noise_multiplier=0.8, sample_rate=0.05, steps=4, sensitivity=1.0, order=1.5)
    worst = wasserstein_accountant(**kwargs, beta=1.0, delta=1e-6)
    observed = wasserstein_accountant(
        **kwargs, beta=1.0, delta=1e-6, observed_distances=[0.1, 0.5, 1.0, 0.9], empirical=True
    )
    assert observed.epsilon <= worst.epsilon
    assert not observed.worst_case
    assert "no worst-case guarantee" in observed.guarantee


def test_per_step_loss_increases_with_the_gradient_distance():
    losses = [subsampled_gaussian_wdp_loss(1.0, 0.1, d, 1.0) for d in (0.0, 0.5, 1.0, 2.0)]
    assert all(a < b for a, b in zip(losses, losses[1:], strict=False))


def test_accountant_epsilon_grows_with_the_noise_multiplier_as_corollary_1_states():
    # Documented property of the paper's formula (E|Z|^μ grows with Var(Z)), pinned so that it
    # is not "fixed" silently; see the module docstring.
    values = [
        wasserstein_accountant(z, 0.01, 100, 1.0, 1.0, 1.0, 1e-5).epsilon for z in (0.5, 1, 2, 4)
    ]
    assert all(a < b for a, b in zip(values, values[1:], strict=False))


def test_empirical_mode_requires_the_explicit_flag():
    args = (1.0, 0.01, 2, 1.0, 1.0, 1.0, 1e-5)
    with pytest.raises(ValueError, match="no worst-case guarantee"):
        wasserstein_accountant(*args, observed_distances=[0.5, 0.5])
    with pytest.raises(ValueError, match="observed_distances"):
        wasserstein_accountant(*args, empirical=True)
    with pytest.raises(ValueError, match="one distance per step"):
        wasserstein_accountant(*args, observed_distances=[0.5], empirical=True)


def _results() -> list[WDPGuarantee]:
    return [
        wdp_gaussian(2.0, 1.0, 2.0),
        wdp_laplace(2.0, 1.0, 2.0),
        wdp_from_dp(1.0, 1.0, 1.0),
        wdp_from_rdp(1.0, 1.0, 1.0),
        wasserstein_accountant(1.0, 0.01, 10, 1.0, 1.0, 1.0, 1e-5),
    ]


@pytest.mark.parametrize("result", _results(), ids=lambda r: r.reference)
def test_results_are_labelled_wdp_and_never_as_dp(result):
    assert result.guarantee.startswith(("WDP (μ, ε)", "generalized WDP (μ, ε)"))
    assert "(ε, δ)-DP" not in result.guarantee.replace("not an (ε, δ)-DP statement", "")
    payload = result.to_dict()
    assert payload["notion"] == "WDP"
    assert payload["guarantee"] == result.guarantee
    assert "delta" not in payload and "dp_delta" not in payload
    with pytest.raises(AttributeError):
        result.epsilon = 0.0  # frozen


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: wdp_gaussian(0.0, 1.0, 1.0), "scale"),
        (lambda: wdp_laplace(-1.0, 1.0, 1.0), "scale"),
        (lambda: wdp_gaussian(1.0, 0.0, 1.0), "sensitivity"),
        (lambda: wdp_laplace(1.0, math.nan, 1.0), "sensitivity"),
        (lambda: wdp_gaussian(1.0, 1.0, 0.5), "order"),
        (lambda: wdp_laplace(1.0, 1.0, math.inf), "order"),
        (lambda: wdp_from_dp(0.0, 1.0, 1.0), "epsilon"),
        (lambda: wdp_from_rdp(1.0, 1.0, 1.0, rdp_order=0.5), "rdp_order"),
        (lambda: wdp_from_rdp(-1.0, 1.0, 1.0), "rdp_epsilon"),
        (lambda: gaussian_absolute_moment(0.0, 0.0, 1.0), "std"),
        (lambda: gaussian_absolute_moment(math.nan, 1.0, 1.0), "mean"),
        (lambda: wasserstein_accountant(0.0, 0.1, 10, 1.0, 1.0, 1.0, 1e-5), "noise_multiplier"),
        (lambda: wasserstein_accountant(1.0, 0.0, 10, 1.0, 1.0, 1.0, 1e-5), "sample_rate"),
        (lambda: wasserstein_accountant(1.0, 1.5, 10, 1.0, 1.0, 1.0, 1e-5), "sample_rate"),
        (lambda: wasserstein_accountant(1.0, 0.1, 0, 1.0, 1.0, 1.0, 1e-5), "steps"),
        (lambda: wasserstein_accountant(1.0, 0.1, 10, -1.0, 1.0, 1.0, 1e-5), "sensitivity"),
        (lambda: wasserstein_accountant(1.0, 0.1, 10, 1.0, 0.9, 1.0, 1e-5), "order"),
        (lambda: wasserstein_accountant(1.0, 0.1, 10, 1.0, 1.0, 0.0, 1e-5), "beta"),
        (lambda: wasserstein_accountant(1.0, 0.1, 10, 1.0, 1.0, 1.0, 1.0), "delta"),
        (lambda: wasserstein_accountant(1.0, 0.1, 10, 1.0, 1.0, 1.0, 0.0), "delta"),
        (lambda: wdp_compose([0.1, -0.2], 1.0, 1e-5), "step_losses"),
    ],
)
def test_invalid_parameters_are_refused_naming_the_parameter(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def _account(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    build_parser(parser)
    args = parser.parse_args(argv)
    return args.func(args)


def test_account_wdp_subcommand_reports_the_closed_form():
    argv = ["wdp", "--mechanism", "gaussian", "--scale", "2", "--sensitivity", "1", "--order", "2"]
    result = _account(argv)
    assert result["epsilon"] == pytest.approx(0.5 * math.sqrt(0.5))
    assert result["guarantee"].startswith("WDP (μ, ε)")
    argv[2] = "laplace"
    assert _account(argv)["epsilon"] == pytest.approx(wdp_laplace(2.0, 1.0, 2.0).epsilon)


def test_account_wdp_sgm_subcommand_runs_the_worst_case_accountant():
    result = _account(
        [
            "wdp-sgm",
            "--noise_multiplier",
            "1.1",
            "--sample_rate",
            "0.02",
            "--steps",
            "250",
            "--sensitivity",
            "0.5",
            "--order",
            "2",
            "--beta",
            "2",
            "--delta",
            "1e-5",
        ]
    )
    expected = wasserstein_accountant(1.1, 0.02, 250, 0.5, 2.0, 2.0, 1e-5)
    assert result == expected.to_dict()
    assert result["worst_case"] is True
