"""Empirical privacy audits (reduced CI variant of ``benchmarks/audit_privacy.py``).

Each audit draws the product's own mechanism on a worst-case neighbouring pair at a fixed seed
and checks that the ε lower bound (95 % Clopper–Pearson) stays at or below the claimed ε; the
same audit on the mechanism with its noise halved must exceed the claim, which shows that the
audit has the power to catch a mis-calibration of that size.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

from lightning_dpot.audit import (
    audit_threshold_test,
    clopper_pearson_upper,
    dp_sinkhorn_canary_gradients,
    epsilon_lower_bound,
    farthest_embedding_pair,
    ldp_scores,
    mean_embedding_scores,
    sanitizer_scores,
    sliced_release_scores,
)
from lightning_dpot.methods.dp_merf import (
    SENSITIVITY,
    MeanEmbeddingRelease,
    fourier_features,
    random_frequencies,
)
from lightning_dpot.methods.dpsw.sensitivity import sliced_sensitivity
from lightning_dpot.ot.dp_sinkhorn import SemiDebiasedSinkhorn
from lightning_dpot.ot.sliced import random_directions
from lightning_dpot.privacy.mechanisms.gaussian import gaussian_epsilon, gaussian_sigma
from lightning_dpot.privacy.mechanisms.gradient_sanitizer import GradientSanitizer, clip_frobenius
from lightning_dpot.privacy.mechanisms.ldp import LocalRandomizer
from lightning_dpot.privacy.mechanisms.transforms import make_transform

DRAWS = 100_000


@pytest.mark.parametrize("k, n", [(0, 10), (3, 10), (50, 1000), (999, 1000)])
def test_clopper_pearson_upper_matches_scipy_exact_interval(k, n):
    # scipy's exact one-sided interval is the Clopper–Pearson bound.
    expected = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    two_sided_upper = clopper_pearson_upper(k, n, 0.025)
    assert two_sided_upper == pytest.approx(expected.high, rel=1e-9)


def test_clopper_pearson_known_values():
    assert clopper_pearson_upper(0, 10, 0.05) == pytest.approx(1 - 0.05 ** (1 / 10), rel=1e-12)
    assert clopper_pearson_upper(10, 10, 0.05) == 1.0
    with pytest.raises(ValueError, match="successes <= trials"):
        clopper_pearson_upper(11, 10, 0.05)


def test_epsilon_lower_bound_is_the_hypothesis_testing_bound():
    # With error rates far from 0 and many trials the bound approaches log((1-δ-β)/α).
    n = 10**9
    eps = epsilon_lower_bound(int(0.1 * n), n, int(0.2 * n), n, delta=1e-6)
    assert eps == pytest.approx(math.log((1 - 1e-6 - 0.2) / 0.1), abs=1e-3)
    assert epsilon_lower_bound(50, 100, 50, 100, delta=1e-6) == 0.0  # chance: no evidence


def test_audit_of_a_known_randomized_response_is_tight_and_valid():
    # Randomized response with ε = 1: P(say 1 | x=1) = e/(1+e). The exact ε-lower bound of the
    # threshold test is ε itself; the audit must be below it and close with 10^6 draws.
    rng = np.random.default_rng(0)
    p = math.e / (1 + math.e)
    out = (rng.random(10**6) > p).astype(float)  # x = 0 says 1 with probability 1 - p
    inn = (rng.random(10**6) < p).astype(float)
    result = audit_threshold_test(out, inn, delta=0.0)
    assert 0.97 < result.epsilon_lower_bound <= 1.0


def _randomizer(mechanism: str, *, halve: bool) -> tuple[LocalRandomizer, float, float]:
    """Records in [-1, 1]^4 projected onto the ℓ1 (Laplace) or ℓ2 (Gaussian) ball of radius 0.5:
    Δ = 1 from the projection. Claimed ε = 1 (δ = 1e-5 for the Gaussian)."""
    transform = make_transform("identity", (4,))
    delta = 1e-5 if mechanism == "gaussian" else None
    radius = {"l1_radius": 0.5} if mechanism == "laplace" else {"l2_radius": 0.5}
    claimed = LocalRandomizer.build(
        mechanism, transform, -1.0, 1.0, 8.0, 4.0, epsilon=1.0, delta=delta, **radius
    )
    if not halve:
        return claimed, 1.0, delta or 0.0
    halved = LocalRandomizer.build(
        mechanism,
        transform,
        -1.0,
        1.0,
        8.0,
        4.0,
        noise_scale=claimed.mechanism.noise_scale / 2,
        delta=delta,
        **radius,
    )
    return halved, 1.0, delta or 0.0


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_ldp_mechanism_audit_stays_below_claim_and_catches_halved_noise(mechanism):
    x = torch.tensor([0.5, 0.0, 0.0, 0.0])  # on both balls: ‖x − (−x)‖ = Δ = 1
    results = {}
    for halve in (False, True):
        randomizer, claimed, delta = _randomizer(mechanism, halve=halve)
        generator = torch.Generator().manual_seed(0)
        scores = ldp_scores(randomizer, x, -x, DRAWS, generator)
        results[halve] = audit_threshold_test(*scores, delta=delta).epsilon_lower_bound
    assert results[False] <= claimed
    assert results[True] > claimed
    if mechanism == "laplace":
        assert results[False] > 0.9  # pure DP: the tails attain ε, the audit is nearly tight


def test_dp_sinkhorn_sanitized_step_audit_stays_below_claim_and_catches_halved_noise():
    """One sanitized release (clip the cross block to Δ, add N(0, (2Δσ)²)) of a canary pair of
    opposite gradients with norm ≥ Δ: after clipping they are 2Δ apart, the sensitivity, so no
    canary pair is worse. Claimed: the Gaussian mechanism's ε at multiplier σ = 1 (one step, the
    canary included with certainty: no amplification is claimed)."""
    clip, sigma, delta, draws = 0.5, 1.0, 1e-5, 20_000
    claimed = gaussian_epsilon(2 * clip * sigma, delta, 2 * clip)
    grad = torch.zeros(1, 3)
    grad[0, 0] = 10 * clip
    results = {}
    for halve in (False, True):
        sanitizer = GradientSanitizer(
            clip, sigma / 2 if halve else sigma, noise_seed=1, sample_rate=1.0
        )
        scores = sanitizer_scores(sanitizer, grad, -grad, draws)
        results[halve] = audit_threshold_test(*scores, delta=delta).epsilon_lower_bound
    assert results[False] <= claimed
    assert results[True] > claimed


def test_dp_sinkhorn_canary_through_the_real_loss_stays_below_claim():
    """Neighbouring real batches, a far canary absent / present, through the real semi-debiased
    Sinkhorn loss and the sanitizer. After clipping this canary moves the cross block by 0.75 of
    the sensitivity 2Δ. The bound must stay below the ε of that distance; 2·10⁴ draws are too
    few to push the halved-noise run past it (the full benchmark does, see docs/privacy_audit.md),
    so here the halved run must only be clearly more distinguishable. Power against the claim
    itself is the worst-case pair's test above."""
    clip, sigma, delta, draws = 0.5, 1.0, 1e-5, 20_000
    loss = SemiDebiasedSinkhorn(entropic_reg=0.05, debias_fraction=0.5, diameter=20.0)
    generated = torch.tensor([[0.0, 0.0], [0.2, 0.0], [0.1, 0.1]])  # 2 cross rows + 1 debias
    real = torch.tensor([[1.0, 0.0], [1.0, 0.2]])
    grad, grad_canary = dp_sinkhorn_canary_gradients(
        loss, generated, real, torch.tensor([[-3.0, 0.0]]), num_cross=2
    )
    distance = float(
        torch.linalg.vector_norm(clip_frobenius(grad_canary, clip) - clip_frobenius(grad, clip))
    )
    claimed = gaussian_epsilon(2 * clip * sigma, delta, 2 * clip)
    realized = gaussian_epsilon(2 * clip * sigma, delta, distance)
    assert 0.7 < distance / (2 * clip) <= 1.0 and realized < claimed
    results = {}
    for halve in (False, True):
        sanitizer = GradientSanitizer(
            clip, sigma / 2 if halve else sigma, noise_seed=2, sample_rate=1.0
        )
        scores = sanitizer_scores(sanitizer, grad, grad_canary, draws)
        results[halve] = audit_threshold_test(*scores, delta=delta).epsilon_lower_bound
    assert results[False] <= realized
    assert results[True] > results[False] + 1.0


def test_sliced_release_audit_stays_below_claim_and_catches_halved_noise():
    """DPSWflow's release of unit-norm records. The claim uses Δ = 2·sqrt(w(N_θ, δ_s)), a bound
    holding with probability 1 − δ_s over Θ; for the drawn Θ the worst pair is only 2‖Θ‖₂ apart,
    so the power check is against the ε of that realized sensitivity."""
    num_directions, dim, delta, delta_s = 20, 4, 1e-5, 1e-8
    theta = random_directions(num_directions, dim, torch.Generator().manual_seed(1))
    sensitivity = sliced_sensitivity(num_directions, dim, delta_s, "chernoff")
    sigma = gaussian_sigma(1.0, delta, sensitivity)
    realized = gaussian_epsilon(sigma, delta, 2 * float(torch.linalg.matrix_norm(theta, 2)))
    assert realized < 1.0
    results = {}
    for halve in (False, True):
        generator = torch.Generator().manual_seed(0)
        scores = sliced_release_scores(theta, sigma / 2 if halve else sigma, DRAWS, generator)
        results[halve] = audit_threshold_test(*scores, delta=delta).epsilon_lower_bound
    assert results[False] <= realized <= 1.0
    assert results[True] > realized


def test_dp_merf_release_audit_stays_below_claim_and_catches_halved_noise():
    """DP-MERF's release. The claim uses Δ = 2 (two unit embeddings); the farthest same-label pair
    this search finds is closer, so the power check is against the ε of the realized distance."""
    omega = random_frequencies(3, 4, 0.4, seed=0)
    pair = farthest_embedding_pair(omega)
    phi = fourier_features(torch.stack([pair[0][0], pair[1][0]]).double(), omega)
    distance = float((phi[1] - phi[0]).norm())
    assert math.sqrt(2) < distance <= SENSITIVITY  # worse than two labels (√2 apart)
    delta, draws = 1e-5, 20_000
    sigma = gaussian_sigma(1.0, delta, SENSITIVITY)
    realized = gaussian_epsilon(sigma, delta, distance)
    results = {}
    for halve in (False, True):
        release = MeanEmbeddingRelease(delta, noise_seed=0)
        release.calibrate(sigma / 2 if halve else sigma)
        generator = torch.Generator().manual_seed(5)
        scores = mean_embedding_scores(release, pair, omega, 2, draws, generator)
        results[halve] = audit_threshold_test(*scores, delta=delta).epsilon_lower_bound
        assert release.events.total == 2 * draws
    assert results[False] <= realized <= 1.0
    assert results[True] > realized
