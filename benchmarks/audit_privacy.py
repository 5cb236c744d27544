"""Full empirical privacy audit of every mechanism (the CI variant is tests/privacy/test_audit.py).

For each mechanism: the ε lower bound (95 % Clopper–Pearson, threshold chosen on a held-out 20 %
of the draws) of the worst-case neighbouring pair, for the correctly calibrated mechanism and for
the same mechanism with its noise halved, next to the claimed ε. See docs/privacy_audit.md.

    python benchmarks/audit_privacy.py --draws 1000000 --sanitizer-draws 100000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from lightning_dpot.audit import (
    audit_threshold_test,
    dp_sinkhorn_canary_gradients,
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


def _ldp(mechanism: str, epsilon: float, delta: float | None, draws: int, seed: int) -> list:
    transform = make_transform("identity", (4,))
    radius = {"l1_radius": 0.5} if mechanism == "laplace" else {"l2_radius": 0.5}
    build = dict(mechanism=mechanism, transform=transform, low=-1.0, high=1.0)
    build |= dict(diameter_l1=8.0, diameter_l2=4.0, delta=delta, **radius)
    claimed = LocalRandomizer.build(epsilon=epsilon, **build)
    halved = LocalRandomizer.build(noise_scale=claimed.mechanism.noise_scale / 2, **build)
    x = torch.tensor([0.5, 0.0, 0.0, 0.0])
    rows = []
    for label, randomizer in (("calibrated", claimed), ("noise halved", halved)):
        generator = torch.Generator().manual_seed(seed)
        start = time.perf_counter()
        result = audit_threshold_test(*ldp_scores(randomizer, x, -x, draws, generator), delta or 0)
        rows.append((f"LDP {mechanism}", label, epsilon, result, time.perf_counter() - start))
    return rows


def _sanitizer(sigma: float, delta: float, draws: int, seed: int) -> list:
    clip = 0.5
    claimed = gaussian_epsilon(2 * clip * sigma, delta, 2 * clip)
    grad = torch.zeros(1, 3)
    grad[0, 0] = 10 * clip
    rows = []
    for label, multiplier in (("calibrated", sigma), ("noise halved", sigma / 2)):
        sanitizer = GradientSanitizer(clip, multiplier, noise_seed=seed, sample_rate=1.0)
        start = time.perf_counter()
        result = audit_threshold_test(*sanitizer_scores(sanitizer, grad, -grad, draws), delta)
        name = f"DP-Sinkhorn sanitized step (σ = {sigma})"
        rows.append((name, label, claimed, result, time.perf_counter() - start))
    return rows


def _canary(sigma: float, delta: float, draws: int, seed: int) -> list:
    """A far canary through the real semi-debiased Sinkhorn loss (tests/privacy/test_audit.py)."""
    clip = 0.5
    loss = SemiDebiasedSinkhorn(entropic_reg=0.05, debias_fraction=0.5, diameter=20.0)
    generated = torch.tensor([[0.0, 0.0], [0.2, 0.0], [0.1, 0.1]])
    real = torch.tensor([[1.0, 0.0], [1.0, 0.2]])
    grads = dp_sinkhorn_canary_gradients(loss, generated, real, torch.tensor([[-3.0, 0.0]]), 2)
    distance = float(
        torch.linalg.vector_norm(clip_frobenius(grads[1], clip) - clip_frobenius(grads[0], clip))
    )
    claimed = gaussian_epsilon(2 * clip * sigma, delta, 2 * clip)
    realized = gaussian_epsilon(2 * clip * sigma, delta, distance)
    rows = []
    for label, multiplier in (("calibrated", sigma), ("noise halved", sigma / 2)):
        sanitizer = GradientSanitizer(clip, multiplier, noise_seed=seed, sample_rate=1.0)
        start = time.perf_counter()
        result = audit_threshold_test(*sanitizer_scores(sanitizer, *grads, draws), delta)
        name = f"DP-Sinkhorn canary via the loss (ε at its distance: {realized:.3f})"
        rows.append((name, label, claimed, result, time.perf_counter() - start))
    return rows


def _sliced(epsilon: float, delta: float, draws: int, seed: int) -> list:
    num_directions, dim, delta_s = 20, 4, 1e-8
    theta = random_directions(num_directions, dim, torch.Generator().manual_seed(seed + 1))
    sensitivity = sliced_sensitivity(num_directions, dim, delta_s, "chernoff")  # DPSW default
    sigma = gaussian_sigma(epsilon, delta, sensitivity)
    realized = gaussian_epsilon(sigma, delta, 2 * float(torch.linalg.matrix_norm(theta, 2)))
    rows = []
    for label, noise in (("calibrated", sigma), ("noise halved", sigma / 2)):
        generator = torch.Generator().manual_seed(seed)
        start = time.perf_counter()
        result = audit_threshold_test(*sliced_release_scores(theta, noise, draws, generator), delta)
        name = f"DPSW sliced release (ε for the drawn Θ: {realized:.3f})"
        rows.append((name, label, epsilon, result, time.perf_counter() - start))
    return rows


def _mean_embedding(epsilon: float, delta: float, draws: int, seed: int) -> list:
    omega = random_frequencies(3, 4, 0.4, seed=seed)
    pair = farthest_embedding_pair(omega)
    phi = fourier_features(torch.stack([pair[0][0], pair[1][0]]).double(), omega)
    sigma = gaussian_sigma(epsilon, delta, SENSITIVITY)
    realized = gaussian_epsilon(sigma, delta, float((phi[1] - phi[0]).norm()))
    rows = []
    for label, noise in (("calibrated", sigma), ("noise halved", sigma / 2)):
        release = MeanEmbeddingRelease(delta, noise_seed=seed)
        release.calibrate(noise)
        generator = torch.Generator().manual_seed(seed + 5)
        start = time.perf_counter()
        scores = mean_embedding_scores(release, pair, omega, 2, draws, generator)
        result = audit_threshold_test(*scores, delta)
        name = f"DP-MERF mean embedding (ε at the pair's distance: {realized:.3f})"
        rows.append((name, label, epsilon, result, time.perf_counter() - start))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=1_000_000, help="draws per side (LDP, DPSW)")
    parser.add_argument(
        "--sanitizer-draws", type=int, default=100_000,
        help="draws per side of the mechanisms called once per draw (sanitizer, DP-MERF)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the table here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    rows = _ldp("laplace", 1.0, None, args.draws, args.seed)
    rows += _ldp("gaussian", 1.0, 1e-5, args.draws, args.seed)
    rows += _sanitizer(1.0, 1e-5, args.sanitizer_draws, args.seed + 1)
    rows += _canary(1.0, 1e-5, args.sanitizer_draws, args.seed + 2)
    rows += _sliced(1.0, 1e-5, args.draws, args.seed)
    rows += _mean_embedding(1.0, 1e-5, args.sanitizer_draws, args.seed)

    print(f"{'mechanism':66s} {'noise':13s} {'claimed ε':>9s} {'ε lower bound':>13s} {'s':>6s}")
    table = []
    for name, label, claimed, result, seconds in rows:
        lb = result.epsilon_lower_bound
        print(f"{name:66s} {label:13s} {claimed:9.3f} {lb:13.3f} {seconds:6.1f}")
        table.append(
            {"mechanism": name, "noise": label, "claimed_epsilon": claimed}
            | result.as_dict()
            | {"seconds": round(seconds, 2)}
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=2)


if __name__ == "__main__":
    main()
