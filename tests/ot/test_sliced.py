"""Sliced / Gaussian-smoothed sliced Wasserstein and the DP sliced-Wasserstein flow (Sebag et al.
2023)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from lightning_dpot.ot.sliced import (
    dp_sliced_wasserstein_loss,
    empirical_cdf,
    empirical_quantile,
    gaussian_smoothed_sliced_wasserstein,
    noisy_projections,
    project,
    random_directions,
    sliced_wasserstein,
    wasserstein_1d_cost,
)
from lightning_dpot.ot.sliced_flow import sliced_flow_drift, sliced_flow_step

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    """One torch thread: these small kernels slow down several-fold when 2 threads contend on a
    shared 2-core machine; results do not depend on the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _gen(seed: int, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _lp_wasserstein_pp(x: np.ndarray, y: np.ndarray, p: float) -> float:
    """Brute-force OT cost between uniform 1-D samples by the transport linear program."""
    n, m = len(x), len(y)
    cost = np.abs(x[:, None] - y[None, :]) ** p
    rows = np.kron(np.eye(n), np.ones((1, m)))
    cols = np.kron(np.ones((1, n)), np.eye(m))
    result = optimize.linprog(
        cost.ravel(),
        A_eq=np.vstack([rows, cols]),
        b_eq=np.concatenate([np.full(n, 1.0 / n), np.full(m, 1.0 / m)]),
        bounds=(0, None),
        method="highs",
    )
    assert result.success
    return float(result.fun)


def _five_gaussians(n: int, generator: torch.Generator) -> torch.Tensor:
    """Toy target of Sebag et al. 2023, §5.4: 5 isotropic Gaussians, centres on a circle of radius
    0.6."""
    angle = 2 * math.pi * torch.arange(5, dtype=torch.float32) / 5
    centres = 0.6 * torch.stack([angle.cos(), angle.sin()], dim=1)
    component = torch.randint(5, (n,), generator=generator)
    return centres[component] + 0.08 * torch.randn(n, 2, generator=generator)


# ----------------------------------------------------------------------------- directions


@pytest.mark.parametrize("device", DEVICES)
def test_random_directions_are_unit_rows_reproducible_from_the_generator(device: str) -> None:
    theta = random_directions(50, 8, _gen(0, device), dtype=torch.float64)
    again = random_directions(50, 8, _gen(0, device), dtype=torch.float64)
    assert theta.shape == (50, 8) and theta.dtype == torch.float64
    assert theta.device.type == device
    torch.testing.assert_close(
        torch.linalg.vector_norm(theta, dim=1), torch.ones(50, **_like(theta))
    )
    torch.testing.assert_close(theta, again)


def _like(t: torch.Tensor) -> dict:
    return {"dtype": t.dtype, "device": t.device}


def test_random_directions_are_uniform_on_the_sphere_in_mean_and_second_moment() -> None:
    theta = random_directions(20_000, 3, _gen(1), dtype=torch.float64)
    assert theta.mean(0).abs().max() < 0.02
    torch.testing.assert_close(
        theta.T @ theta / 20_000, torch.eye(3, dtype=torch.float64) / 3, atol=0.01, rtol=0
    )


@pytest.mark.parametrize(("num", "dim"), [(0, 2), (3, 0), (-1, 2)])
def test_random_directions_refuse_nonpositive_sizes(num: int, dim: int) -> None:
    with pytest.raises(ValueError, match="integer >= 1"):
        random_directions(num, dim)


def test_project_is_the_matrix_of_dot_products_and_refuses_mismatched_dimensions() -> None:
    x = torch.randn(5, 3, generator=_gen(2))
    theta = random_directions(4, 3, _gen(3))
    expected = torch.stack([torch.stack([x[i] @ theta[j] for j in range(4)]) for i in range(5)])
    torch.testing.assert_close(project(x, theta), expected)
    with pytest.raises(ValueError, match="dimension 3 but theta has dimension 2"):
        project(x, theta[:, :2])
    with pytest.raises(ValueError, match="2-D"):
        project(x[0], theta)


def test_noisy_projections_add_gaussian_noise_of_std_sigma_and_sigma_zero_draws_nothing() -> None:
    x = torch.randn(4000, 2, generator=_gen(4), dtype=torch.float64)
    theta = random_directions(50, 2, _gen(5), dtype=torch.float64)
    noise = noisy_projections(x, theta, 0.7, _gen(6)) - project(x, theta)
    assert abs(noise.std().item() - 0.7) < 0.01 and abs(noise.mean().item()) < 0.01
    generator = _gen(7)
    state = generator.get_state()
    torch.testing.assert_close(noisy_projections(x, theta, 0.0, generator), project(x, theta))
    assert torch.equal(generator.get_state(), state)
    with pytest.raises(ValueError, match=r"noise_scale must be a finite number >= 0, got -0.1"):
        noisy_projections(x, theta, -0.1)


# ----------------------------------------------------------------------------- quantiles / CDF


def test_empirical_quantile_known_answers_with_linear_interpolation() -> None:
    values = torch.tensor([[0.0, 1.0, 2.0, 4.0]])
    levels = torch.tensor([[0.0, 1 / 6, 0.5, 5 / 6, 1.0, -0.2, 1.3]])
    expected = torch.tensor([[0.0, 0.5, 1.5, 3.0, 4.0, 0.0, 4.0]])
    torch.testing.assert_close(empirical_quantile(values, levels), expected)


def test_empirical_quantile_matches_torch_quantile_linear_row_by_row() -> None:
    values = torch.sort(torch.randn(6, 37, generator=_gen(8), dtype=torch.float64), dim=1).values
    levels = torch.rand(6, 11, generator=_gen(9), dtype=torch.float64)
    ours = empirical_quantile(values, levels)
    for row in range(6):
        reference = torch.quantile(values[row], levels[row], interpolation="linear")
        torch.testing.assert_close(ours[row], reference)


def test_empirical_quantile_of_a_single_value_is_constant() -> None:
    torch.testing.assert_close(
        empirical_quantile(torch.tensor([[3.0]]), torch.tensor([[0.0, 0.4, 1.0]])),
        torch.full((1, 3), 3.0),
    )


def test_empirical_cdf_known_answers_and_clamping_outside_the_sample() -> None:
    values = torch.tensor([[0.0, 1.0, 2.0, 4.0]])
    points = torch.tensor([[-1.0, 0.0, 0.5, 1.0, 3.0, 4.0, 5.0]])
    expected = torch.tensor([[0.0, 0.0, 1 / 6, 1 / 3, 5 / 6, 1.0, 1.0]])
    torch.testing.assert_close(empirical_cdf(values, points), expected)


def test_empirical_cdf_and_quantile_are_inverse_on_the_range_of_the_sample() -> None:
    values = torch.sort(torch.randn(5, 200, generator=_gen(10), dtype=torch.float64), dim=1).values
    levels = torch.rand(5, 300, generator=_gen(11), dtype=torch.float64)
    torch.testing.assert_close(empirical_cdf(values, empirical_quantile(values, levels)), levels)
    low, high = values[:, :1], values[:, -1:]
    points = low + (high - low) * torch.rand(5, 300, generator=_gen(12), dtype=torch.float64)
    torch.testing.assert_close(empirical_quantile(values, empirical_cdf(values, points)), points)


def test_empirical_cdf_refuses_fewer_than_two_values_and_mismatched_rows() -> None:
    with pytest.raises(ValueError, match="at least 2 values"):
        empirical_cdf(torch.tensor([[1.0]]), torch.tensor([[0.0]]))
    with pytest.raises(ValueError, match="same number of rows"):
        empirical_cdf(torch.zeros(2, 3), torch.zeros(3, 3))


# ----------------------------------------------------------------------------- 1-D OT and SW


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0])
def test_wasserstein_1d_cost_equal_sizes_matches_the_optimal_assignment(p: float) -> None:
    x = torch.randn(9, 3, generator=_gen(13), dtype=torch.float64)
    y = torch.randn(9, 3, generator=_gen(14), dtype=torch.float64) * 2 + 1
    ours = wasserstein_1d_cost(x, y, p=p)
    for j in range(3):
        cost = np.abs(x[:, j].numpy()[:, None] - y[:, j].numpy()[None, :]) ** p
        rows, cols = optimize.linear_sum_assignment(cost)
        assert ours[j].item() == pytest.approx(cost[rows, cols].mean(), rel=1e-12)


@pytest.mark.parametrize(("n", "m"), [(5, 7), (4, 6), (1, 3), (8, 2)])
@pytest.mark.parametrize("p", [1.0, 2.0])
def test_wasserstein_1d_cost_unequal_sizes_matches_the_transport_linear_program(
    n: int, m: int, p: float
) -> None:
    x = torch.randn(n, 2, generator=_gen(15), dtype=torch.float64)
    y = torch.rand(m, 2, generator=_gen(16), dtype=torch.float64) * 3
    ours = wasserstein_1d_cost(x, y, p=p)
    for j in range(2):
        xj, yj = x[:, j].numpy(), y[:, j].numpy()
        assert ours[j].item() == pytest.approx(_lp_wasserstein_pp(xj, yj, p), rel=1e-7, abs=1e-10)
        if p == 1.0:
            assert ours[j].item() == pytest.approx(stats.wasserstein_distance(xj, yj), rel=1e-10)


def test_wasserstein_1d_cost_refuses_p_below_one_and_mismatched_directions() -> None:
    with pytest.raises(ValueError, match="p must be a finite number >= 1, got 0.5"):
        wasserstein_1d_cost(torch.zeros(3, 2), torch.zeros(3, 2), p=0.5)
    with pytest.raises(ValueError, match="2 directions but y_proj has 3"):
        wasserstein_1d_cost(torch.zeros(3, 2), torch.zeros(3, 3))


@pytest.mark.parametrize("device", DEVICES)
def test_sliced_wasserstein_is_the_mean_of_exact_1d_costs_over_directions(device: str) -> None:
    x = torch.randn(6, 3, generator=_gen(17), dtype=torch.float64).to(device)
    y = (torch.randn(8, 3, generator=_gen(18), dtype=torch.float64) + 0.5).to(device)
    theta = random_directions(5, 3, _gen(19), dtype=torch.float64).to(device)
    px, py = project(x, theta).cpu().numpy(), project(y, theta).cpu().numpy()
    brute_1 = np.mean([stats.wasserstein_distance(px[:, j], py[:, j]) for j in range(5)])
    brute_2 = np.mean([_lp_wasserstein_pp(px[:, j], py[:, j], 2.0) for j in range(5)]) ** 0.5
    assert sliced_wasserstein(x, y, theta, p=1).item() == pytest.approx(brute_1, rel=1e-10)
    assert sliced_wasserstein(x, y, theta, p=2).item() == pytest.approx(brute_2, rel=1e-7)
    assert sliced_wasserstein(x, x, theta).item() == 0.0
    assert sliced_wasserstein(y, x, theta).item() == pytest.approx(
        sliced_wasserstein(x, y, theta).item()
    )


def test_gaussian_smoothed_sw_with_sigma_zero_is_sliced_wasserstein() -> None:
    x = torch.randn(10, 2, generator=_gen(20))
    y = torch.randn(12, 2, generator=_gen(21)) + 1
    theta = random_directions(7, 2, _gen(22))
    torch.testing.assert_close(
        gaussian_smoothed_sliced_wasserstein(x, y, theta, 0.0), sliced_wasserstein(x, y, theta)
    )
    smoothed = gaussian_smoothed_sliced_wasserstein(x, y, theta, 0.5, _gen(23))
    assert torch.isfinite(smoothed) and smoothed > 0


# ----------------------------------------------------------------------------- DP SW loss


def test_dp_loss_with_sigma_zero_is_squared_sliced_wasserstein_and_differentiable() -> None:
    target = torch.randn(20, 3, generator=_gen(24), dtype=torch.float64)
    generated = torch.randn(15, 3, generator=_gen(25), dtype=torch.float64).requires_grad_()
    theta = random_directions(9, 3, _gen(26), dtype=torch.float64)
    loss = dp_sliced_wasserstein_loss(generated, project(target, theta), theta, 0.0)
    expected = sliced_wasserstein(generated.detach(), target, theta) ** 2
    assert loss.item() == pytest.approx(expected.item(), rel=1e-12)
    loss.backward()
    assert generated.grad is not None and torch.isfinite(generated.grad).all()
    assert generated.grad.abs().sum() > 0


def test_dp_loss_refuses_release_with_wrong_number_of_directions() -> None:
    theta = random_directions(4, 2, _gen(27))
    with pytest.raises(ValueError, match="3 columns but theta has 4 directions"):
        dp_sliced_wasserstein_loss(torch.zeros(5, 2), torch.zeros(5, 3), theta, 0.1)


# ----------------------------------------------------------------------------- flow drift / step


def test_drift_with_sigma_zero_and_equal_sizes_is_the_assignment_displacement() -> None:
    particles = torch.randn(7, 3, generator=_gen(28), dtype=torch.float64)
    target = torch.randn(7, 3, generator=_gen(29), dtype=torch.float64) + 1
    theta = random_directions(5, 3, _gen(30), dtype=torch.float64)
    z, y = project(particles, theta).numpy(), project(target, theta).numpy()
    expected = np.zeros((7, 3))
    for j in range(5):  # brute force: optimal matching of the 1-D samples along θ_j
        rows, cols = optimize.linear_sum_assignment((z[:, j, None] - y[None, :, j]) ** 2)
        transported = np.empty(7)
        transported[rows] = y[cols, j]
        expected -= np.outer(z[:, j] - transported, theta[j].numpy()) / 5
    for mode in ("noisy", "projection"):
        drift = sliced_flow_drift(particles, project(target, theta), theta, 0.0, evaluate_at=mode)
        np.testing.assert_allclose(drift.numpy(), expected, rtol=1e-10, atol=1e-12)


def test_drift_with_unequal_sizes_maps_particle_ranks_to_interpolated_target_quantiles() -> None:
    theta = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    particles = torch.tensor([[2.0, 5.0], [0.0, 1.0], [1.0, -3.0]], dtype=torch.float64)
    target = torch.tensor([[10.0], [0.0], [30.0], [20.0], [40.0]], dtype=torch.float64)
    # Particle levels 1, 0, 0.5 → target quantiles 40, 0, 20 (positions 4, 0, 2 of 0..40).
    expected = -torch.tensor(
        [[2.0 - 40.0, 0.0], [0.0, 0.0], [1.0 - 20.0, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(sliced_flow_drift(particles, target, theta, 0.0), expected)


def test_noisy_drift_is_minus_half_n_times_the_dp_loss_gradient_for_equal_sizes() -> None:
    # ½ G_σSW_2² has first variation −v̂ (eq. 12–14): same noise draws, equal sizes, p = 2.
    particles = torch.randn(12, 4, generator=_gen(31), dtype=torch.float64).requires_grad_()
    release = noisy_projections(
        torch.randn(12, 4, generator=_gen(32), dtype=torch.float64),
        random_directions(6, 4, _gen(33), dtype=torch.float64),
        0.3,
        _gen(34),
    )
    theta = random_directions(6, 4, _gen(33), dtype=torch.float64)
    dp_sliced_wasserstein_loss(particles, release, theta, 0.3, _gen(35)).backward()
    drift = sliced_flow_drift(particles.detach(), release, theta, 0.3, _gen(35))
    torch.testing.assert_close(drift, -0.5 * 12 * particles.grad)


def test_drift_modes_differ_only_when_the_particles_projections_are_noisy() -> None:
    particles = torch.randn(30, 2, generator=_gen(36))
    theta = random_directions(8, 2, _gen(37))
    release = noisy_projections(torch.randn(40, 2, generator=_gen(38)), theta, 0.5, _gen(39))
    noisy = sliced_flow_drift(particles, release, theta, 0.5, _gen(40), evaluate_at="noisy")
    clean = sliced_flow_drift(particles, release, theta, 0.5, _gen(40), evaluate_at="projection")
    assert not torch.allclose(noisy, clean)
    with pytest.raises(ValueError, match="evaluate_at must be 'noisy' or 'projection'"):
        sliced_flow_drift(particles, release, theta, 0.5, evaluate_at="clean")  # type: ignore[arg-type]


def test_flow_step_leaves_particles_on_the_target_in_place_without_noise_or_diffusion() -> None:
    points = torch.randn(25, 3, generator=_gen(41), dtype=torch.float64)
    theta = random_directions(10, 3, _gen(42), dtype=torch.float64)
    moved = sliced_flow_step(points, project(points, theta), theta, 1.0, 0.0, 0.0)
    torch.testing.assert_close(moved, points)


def test_flow_step_accepts_a_release_sorted_once_and_is_reproducible() -> None:
    particles = torch.randn(50, 2, generator=_gen(43))
    theta = random_directions(16, 2, _gen(44))
    release = noisy_projections(torch.randn(60, 2, generator=_gen(45)), theta, 0.5, _gen(46))
    args = (particles, release, theta, 0.5, 0.5, 0.01)
    first = sliced_flow_step(*args, _gen(47))
    args_sorted = (particles, torch.sort(release, dim=0).values, theta, 0.5, 0.5, 0.01)
    torch.testing.assert_close(sliced_flow_step(*args_sorted, _gen(47), target_sorted=True), first)
    torch.testing.assert_close(sliced_flow_step(*args, _gen(47)), first)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step_size": 0.0}, "step_size must be a finite number > 0"),
        ({"noise_scale": -1.0}, "noise_scale must be a finite number >= 0"),
        ({"diffusion": -0.1}, "diffusion must be a finite number >= 0"),
        ({"particles": torch.zeros(1, 2)}, "at least 2 particles"),
        ({"target_projections_noisy": torch.zeros(5, 3)}, "one column per direction"),
    ],
)
def test_flow_step_refuses_invalid_arguments(kwargs: dict, message: str) -> None:
    arguments = {
        "particles": torch.zeros(4, 2),
        "target_projections_noisy": torch.zeros(5, 2),
        "theta": torch.eye(2),
        "step_size": 1.0,
        "noise_scale": 0.1,
        "diffusion": 0.001,
    }
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=message):
        sliced_flow_step(**arguments)


@pytest.mark.parametrize("device", DEVICES)
def test_flow_step_keeps_device_and_dtype(device: str) -> None:
    generator = _gen(48, device)
    particles = torch.randn(20, 3, generator=generator, device=device, dtype=torch.float64)
    theta = random_directions(6, 3, generator, dtype=torch.float64)
    release = noisy_projections(particles.flip(0), theta, 0.2, generator)
    moved = sliced_flow_step(particles, release, theta, 1.0, 0.2, 0.01, generator)
    assert moved.device == particles.device and moved.dtype == torch.float64


def _toy_flow(noise_scale: float, steps: int = 30, n: int = 1000) -> tuple[float, float]:
    """Toy of Sebag et al. 2023, §5.4 (N_θ = 200, h = 1, λ = 0.001); SW_2 to held-out target
    samples."""
    generator = _gen(0)
    target = _five_gaussians(n, generator)
    theta = random_directions(200, 2, generator)
    release = torch.sort(noisy_projections(target, theta, noise_scale, generator), dim=0).values
    particles = torch.randn(n, 2, generator=generator)
    held_out = _five_gaussians(4000, generator)
    eval_theta = random_directions(500, 2, generator)
    start = sliced_wasserstein(particles, held_out, eval_theta).item()
    for _ in range(steps):
        particles = sliced_flow_step(
            particles, release, theta, 1.0, noise_scale, 0.001, generator, target_sorted=True
        )
    return start, sliced_wasserstein(particles, held_out, eval_theta).item()


def test_toy_flow_reaches_the_target_without_noise_and_ends_between_with_sigma_half() -> None:
    start_clean, end_clean = _toy_flow(0.0)
    start_noisy, end_noisy = _toy_flow(0.5)
    assert start_clean == pytest.approx(start_noisy, rel=0.05)  # same init, same target law
    assert end_clean < 0.15 * start_clean  # σ = 0: flow drives SW well below its start
    assert 1.5 * end_clean < end_noisy < 0.5 * start_noisy  # σ = 0.5: ends in between
