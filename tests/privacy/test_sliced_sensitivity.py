"""Sensitivity bound w(N_θ, δ_s) of the sliced release and the release itself (Sebag et al. 2023,
§4.3)."""

from __future__ import annotations

import math

import pytest
import torch
from scipy import stats

from lightning_dpot.methods.dpsw.sensitivity import (
    gaussian_sliced_release,
    projection_bound_w,
    sliced_noise_multiplier,
    sliced_sensitivity,
    sliced_sigma,
)
from lightning_dpot.ot.sliced import project, random_directions


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    """One torch thread: these small kernels slow down several-fold when 2 threads contend on a
    shared 2-core machine; results do not depend on the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _squared_projection_norms(
    trials: int, num_directions: int, dim: int, seed: int, chunk: int = 2500
) -> torch.Tensor:
    """Monte Carlo draws of S = Σ_j ⟨θ_j, u⟩² for a random unit u and random Θ (fresh per trial)."""
    generator = torch.Generator().manual_seed(seed)
    draws = []
    for start in range(0, trials, chunk):
        size = min(chunk, trials - start)
        g = torch.randn(size, num_directions, dim, generator=generator, dtype=torch.float64)
        theta = g / torch.linalg.vector_norm(g, dim=2, keepdim=True)
        u = torch.randn(size, dim, generator=generator, dtype=torch.float64)
        u = u / torch.linalg.vector_norm(u, dim=1, keepdim=True)
        draws.append((torch.einsum("tjd,td->tj", theta, u) ** 2).sum(dim=1))
    return torch.cat(draws)


def test_bernstein_form_is_eq_25() -> None:
    n_theta, d, delta_s = 70, 8, 1e-5
    log_term = math.log(2 / delta_s)
    expected = n_theta / d + 2 / 3 * log_term + 2 / d * math.sqrt(n_theta * 7 / 10 * log_term)
    assert projection_bound_w(n_theta, d, delta_s, "bernstein") == pytest.approx(expected)


def test_clt_form_is_eq_26() -> None:
    n_theta, d, delta_s = 70, 8, 1e-5
    z = stats.norm.ppf(1 - delta_s)
    expected = n_theta / d + z / d * math.sqrt(2 * n_theta * 7 / 10)
    assert projection_bound_w(n_theta, d, delta_s, "clt") == pytest.approx(expected, rel=1e-9)


def test_auto_uses_the_clt_form_above_30_directions_and_eq_25_otherwise() -> None:
    assert projection_bound_w(31, 8, 1e-5) == projection_bound_w(31, 8, 1e-5, "clt")
    assert projection_bound_w(30, 8, 1e-5) == projection_bound_w(30, 8, 1e-5, "bernstein")


@pytest.mark.parametrize("method", ["bernstein", "chernoff"])
@pytest.mark.parametrize(("num_directions", "dim"), [(70, 8), (31, 8), (200, 2)])
def test_rigorous_w_bounds_hold_in_monte_carlo(method: str, num_directions: int, dim: int) -> None:
    delta_s = 0.01
    squared_norms = _squared_projection_norms(10_000, num_directions, dim, seed=dim)
    w = projection_bound_w(num_directions, dim, delta_s, method)  # type: ignore[arg-type]
    assert (squared_norms > w).double().mean().item() <= delta_s


def test_sensitivity_holds_for_antipodal_unit_records_in_monte_carlo() -> None:
    # Worst replace-one pair, x' = −x: ‖(x − x')Θᵀ‖_F = 2‖xΘᵀ‖ ≤ 2 sqrt(w) w.p. ≥ 1 − δ_s.
    generator = torch.Generator().manual_seed(5)
    sensitivity = sliced_sensitivity(70, 8, 0.01, "chernoff")
    exceed = 0
    for _ in range(4):
        x = torch.randn(2500, 8, generator=generator, dtype=torch.float64)
        x = x / torch.linalg.vector_norm(x, dim=1, keepdim=True)
        g = torch.randn(2500, 70, 8, generator=generator, dtype=torch.float64)
        theta = g / torch.linalg.vector_norm(g, dim=2, keepdim=True)
        difference = torch.einsum("tjd,td->tj", theta, 2 * x)  # (x − (−x)) Θᵀ per trial
        exceed += int((torch.linalg.vector_norm(difference, dim=1) > sensitivity).sum())
    assert exceed / 10_000 <= 0.01


def test_clt_form_is_an_approximation_whose_tail_exceeds_delta_s() -> None:
    # Documented in the module: the sum of Beta(1/2, (d−1)/2) terms is right-skewed.
    squared_norms = _squared_projection_norms(20_000, 70, 8, seed=11)
    w = projection_bound_w(70, 8, 0.01, "clt")
    assert (squared_norms > w).double().mean().item() > 0.01


def test_clt_and_exact_forms_agree_for_many_directions() -> None:
    def gap(n_theta: int) -> float:
        bernstein = projection_bound_w(n_theta, 8, 1e-5, "bernstein")
        return bernstein / projection_bound_w(n_theta, 8, 1e-5, "clt") - 1

    assert gap(10**6) < 0.01
    assert gap(10**6) < gap(10**4) < gap(100)
    chernoff = projection_bound_w(10**6, 8, 1e-5, "chernoff")
    assert chernoff == pytest.approx(projection_bound_w(10**6, 8, 1e-5, "clt"), rel=0.005)


def test_w_never_exceeds_the_number_of_directions_and_is_exact_in_one_dimension() -> None:
    for method in ("bernstein", "clt", "chernoff"):
        assert projection_bound_w(3, 8, 1e-6, method) <= 3.0  # type: ignore[arg-type]
        assert projection_bound_w(7, 1, 0.1, method) == 7.0  # type: ignore[arg-type]


def test_sensitivity_is_twice_the_root_of_w_and_grows_with_directions() -> None:
    assert sliced_sensitivity(70, 8, 1e-5, "clt") == pytest.approx(
        2 * math.sqrt(projection_bound_w(70, 8, 1e-5, "clt"))
    )
    assert sliced_sensitivity(31, 8, 1e-5) < sliced_sensitivity(70, 8, 1e-5)


def test_noise_multiplier_is_sigma_over_sensitivity_and_inverts() -> None:
    sensitivity = sliced_sensitivity(70, 8, 1e-6)
    multiplier = sliced_noise_multiplier(0.68, sensitivity)
    assert multiplier == pytest.approx(0.68 / sensitivity)
    assert sliced_sigma(multiplier, sensitivity) == pytest.approx(0.68)
    assert sliced_noise_multiplier(0.0, sensitivity) == 0.0


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: projection_bound_w(70, 8, 0.0), r"delta_s must lie in the open interval \(0, 1\)"),
        (lambda: projection_bound_w(70, 8, 1.0), r"delta_s must lie in the open interval \(0, 1\)"),
        (lambda: projection_bound_w(0, 8, 1e-5), "num_directions must be an integer >= 1, got 0"),
        (lambda: projection_bound_w(70, 0, 1e-5), "dim must be an integer >= 1, got 0"),
        (lambda: projection_bound_w(70, 8, 1e-5, "exact"), "method must be one of"),  # type: ignore[arg-type]
        (lambda: sliced_noise_multiplier(-0.1, 1.0), "sigma must be a finite number >= 0"),
        (lambda: sliced_noise_multiplier(0.5, 0.0), "sensitivity must be a finite number > 0"),
    ],
)
def test_bounds_refuse_invalid_arguments(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# ----------------------------------------------------------------------------- the release


def _unit_records(n: int, dim: int, seed: int) -> torch.Tensor:
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x / torch.linalg.vector_norm(x, dim=1, keepdim=True)


def test_release_is_projections_plus_gaussian_noise_of_std_sigma() -> None:
    x = _unit_records(3000, 8, 0)
    theta = random_directions(70, 8, torch.Generator().manual_seed(1), dtype=torch.float64)
    release = gaussian_sliced_release(x, theta, 0.68, torch.Generator().manual_seed(2))
    noise = release - project(x, theta)
    assert release.shape == (3000, 70)
    assert abs(noise.std().item() - 0.68) < 0.01 and abs(noise.mean().item()) < 0.01
    again = gaussian_sliced_release(x, theta, 0.68, torch.Generator().manual_seed(2))
    torch.testing.assert_close(release, again)
    torch.testing.assert_close(gaussian_sliced_release(x, theta, 0.0), project(x, theta))


def test_release_detaches_records_and_accepts_rounding_above_unit_norm() -> None:
    x = (_unit_records(10, 4, 3) * (1 + 1e-7)).requires_grad_()
    theta = random_directions(5, 4, torch.Generator().manual_seed(4), dtype=torch.float64)
    release = gaussian_sliced_release(x, theta, 0.0)
    assert not release.requires_grad
    rescaled = x.detach() / torch.linalg.vector_norm(x.detach(), dim=1, keepdim=True)
    torch.testing.assert_close(release, project(rescaled, theta))


def test_release_refuses_records_outside_the_unit_ball() -> None:
    x = _unit_records(10, 4, 5)
    x[3] = torch.tensor([0.0, 2.0, 0.0, 0.0], dtype=torch.float64)
    theta = random_directions(5, 4, torch.Generator().manual_seed(6), dtype=torch.float64)
    with pytest.raises(ValueError, match=r"1 record\(s\) have ℓ2 norm > 1 .* first at index 3"):
        gaussian_sliced_release(x, theta, 0.5)
    x[3] = float("nan")
    with pytest.raises(ValueError, match=r"NaN or Inf values, the first at index 3"):
        gaussian_sliced_release(x, theta, 0.5)


def test_release_refuses_non_unit_directions_negative_sigma_and_bad_shapes() -> None:
    x = _unit_records(10, 4, 7)
    theta = random_directions(5, 4, torch.Generator().manual_seed(8), dtype=torch.float64)
    with pytest.raises(ValueError, match="theta rows must be unit vectors"):
        gaussian_sliced_release(x, 2 * theta, 0.5)
    with pytest.raises(ValueError, match="sigma must be a finite number >= 0, got -0.5"):
        gaussian_sliced_release(x, theta, -0.5)
    with pytest.raises(ValueError, match="4-dimensional directions"):
        gaussian_sliced_release(x, theta[:, :3], 0.5)
    with pytest.raises(ValueError, match="norm_tolerance must lie in"):
        gaussian_sliced_release(x, theta, 0.5, norm_tolerance=0.1)
