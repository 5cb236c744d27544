"""Gaussian calibrations against paper values and independent evaluations of their formulas."""

import math

import pytest
from scipy.stats import norm

from lightning_dpot.privacy.mechanisms.gaussian import (
    analytic_gaussian_delta,
    classical_epsilon,
    classical_sigma,
    gaussian_epsilon,
    gaussian_sigma,
    zhao_epsilon,
    zhao_sigma,
)


@pytest.mark.parametrize(("epsilon", "sigma"), [(25.0, 9.17), (35.0, 7.24)])
def test_analytic_calibration_reproduces_reshetova_2024_fashion_sigmas(epsilon, sigma):
    # Reshetova et al. 2024, §IV-G: Δ2 = 40, δ = 1e-4 → σ = 9.17 (ε = 25) and σ = 7.24 (ε = 35).
    assert gaussian_sigma(epsilon, 1e-4, 40.0) == pytest.approx(sigma, abs=0.01)


def test_analytic_delta_matches_independent_balle_wang_formula():
    sigma, eps, sens = 1.3, 0.7, 2.0
    expected = norm.cdf(sens / (2 * sigma) - eps * sigma / sens) - math.exp(eps) * norm.cdf(
        -sens / (2 * sigma) - eps * sigma / sens
    )
    assert analytic_gaussian_delta(sigma, eps, sens) == pytest.approx(expected, rel=1e-10)


def test_analytic_sigma_is_tight():
    sigma = gaussian_sigma(2.0, 1e-5, 1.0)
    assert analytic_gaussian_delta(sigma, 2.0, 1.0) == pytest.approx(1e-5, rel=1e-6)
    assert analytic_gaussian_delta(0.99 * sigma, 2.0, 1.0) > 1e-5


@pytest.mark.parametrize("method", ["analytic", "zhao"])
def test_sigma_and_epsilon_round_trip(method):
    sigma = gaussian_sigma(3.0, 1e-5, 56.0, method)
    assert gaussian_epsilon(sigma, 1e-5, 56.0, method) == pytest.approx(3.0, rel=1e-8)


def test_zhao_matches_paper_eq_10():
    eps, delta, sens = 5.0, 1e-4, 2.0
    c = math.sqrt(math.log(2 / (math.sqrt(16 * delta + 1) - 1)))
    assert zhao_sigma(eps, delta, sens) == pytest.approx(
        (c + math.sqrt(c * c + eps)) / (eps * math.sqrt(2)) * sens
    )
    assert zhao_epsilon(zhao_sigma(eps, delta, sens), delta, sens) == pytest.approx(eps)


def test_analytic_is_never_looser_than_zhao_or_classical():
    for eps in (0.1, 0.5, 0.9):
        a = gaussian_sigma(eps, 1e-5, 1.0)
        assert a <= zhao_sigma(eps, 1e-5, 1.0)
        assert a <= classical_sigma(eps, 1e-5, 1.0)


def test_classical_formula_value():
    assert classical_sigma(0.5, 1e-5, 1.0) == pytest.approx(math.sqrt(2 * math.log(1.25e5)) / 0.5)


def test_classical_refuses_epsilon_at_least_one():
    with pytest.raises(ValueError, match="epsilon must be < 1"):
        classical_sigma(1.0, 1e-5, 1.0)
    with pytest.raises(ValueError, match="classical"):
        classical_epsilon(0.1, 1e-5, 1.0)


@pytest.mark.parametrize("eps", [0.0, -1.0, math.inf, math.nan])
def test_refuses_bad_epsilon(eps):
    with pytest.raises(ValueError, match="epsilon must be a finite number > 0"):
        gaussian_sigma(eps, 1e-5, 1.0)


@pytest.mark.parametrize("delta", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_refuses_delta_outside_unit_interval(delta):
    with pytest.raises(ValueError, match=r"delta must lie in the open interval \(0, 1\)"):
        gaussian_sigma(1.0, delta, 1.0)


@pytest.mark.parametrize("sens", [0.0, -2.0])
def test_refuses_nonpositive_sensitivity(sens):
    with pytest.raises(ValueError, match="sensitivity must be a finite number > 0"):
        gaussian_sigma(1.0, 1e-5, sens)


def test_refuses_unknown_calibration():
    with pytest.raises(ValueError, match="calibration must be one of"):
        gaussian_sigma(1.0, 1e-5, 1.0, "exact")


@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-5, 1e-4])
def test_the_calibrated_sigma_is_on_the_safe_side_of_the_round_trip(delta):
    """The accountant compares a one-shot release's ε with the module's own target, so the ε
    of the calibrated σ must never come back above the target, not even by rounding."""
    for epsilon in (0.01, 0.1, 1.0, 3.3, 10.0, 50.0):
        for sensitivity in (0.5, 2.0, 3.7):
            sigma = gaussian_sigma(epsilon, delta, sensitivity)
            assert gaussian_epsilon(sigma, delta, sensitivity) <= epsilon
            assert gaussian_epsilon(sigma, delta, sensitivity) == pytest.approx(epsilon, rel=1e-6)


@pytest.mark.parametrize("delta", [1e-9, 1e-5, 1e-4])
def test_analytic_calibration_agrees_with_dp_accountings_gaussian_mechanism(delta):
    """dp-accounting's public get_sigma_gaussian / get_epsilon_gaussian (Δ = 1) and
    GaussianPrivacyLoss; measured agreement of the roots 3e-13 (σ, ε) and of δ 2e-10 (far
    tails). The calibrated σ sits 1e-9 above its root, on the safe side."""
    import dp_accounting
    from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

    for epsilon in (0.01, 0.5, 3.3, 50.0):
        for sensitivity in (0.5, 40.0):
            sigma = gaussian_sigma(epsilon, delta, sensitivity)
            unit = dp_accounting.get_sigma_gaussian(epsilon, delta, tol=1e-14)
            assert sigma == pytest.approx(unit * sensitivity, rel=2e-9)
            spent = dp_accounting.get_epsilon_gaussian(sigma / sensitivity, delta, tol=1e-14)
            assert gaussian_epsilon(sigma, delta, sensitivity) == pytest.approx(spent, rel=1e-10)
            for at in (0.0, 0.5, 3.0):
                loss = GaussianPrivacyLoss(sigma, sensitivity=sensitivity)
                assert analytic_gaussian_delta(sigma, at, sensitivity) == pytest.approx(
                    loss.get_delta_for_epsilon(at), rel=1e-9, abs=1e-300
                )


def test_dpot_account_calibrate_starts_without_importing_dp_accounting():
    """Why the analytic calibration is computed here rather than by dp-accounting: importing it
    (scipy.stats, scipy.signal) would take ``dpot account calibrate`` past its start-up budget."""
    import subprocess
    import sys

    code = (
        "import sys; from lightning_dpot.commands.account import main; "
        "main(['calibrate', '--mechanism', 'gaussian', '--epsilon', '1', '--delta', '1e-5', "
        "'--sensitivity', '2']); assert 'dp_accounting' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
