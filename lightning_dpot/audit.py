r"""Empirical privacy audits: a statistical lower bound on ε from a distinguishing experiment.

An (ε, δ)-DP mechanism M constrains every test that tries to tell ``M(D)`` from ``M(D')`` for
neighbouring D, D' (Kairouz, Oh, Viswanath 2015): with false-positive rate α (says D' on D) and
false-negative rate β (says D on D'),

.. math::

    α + e^{ε} β \ge 1 - δ \quad\text{and}\quad β + e^{ε} α \ge 1 - δ,

so ``ε \ge \log\frac{1 - δ - β}{α}``. An audit draws the mechanism many times on a worst-case
pair, estimates α and β of a threshold test, replaces them by Clopper–Pearson upper confidence
bounds (each at level ``alpha/2``, union bound: the result holds with probability ≥ 1 − alpha)
and reports

.. math::

    \hat ε_{lb} = \log\frac{1 - δ - \bar β}{\bar α}

(Jagielski, Ullman, Oprea 2020, "Auditing differentially private machine learning"; Nasr et al.
2021). If the implementation is correct, ``\hat ε_{lb} \le ε`` except with probability
alpha. The threshold is chosen on a separate *selection* split of the draws and evaluated on the
rest, so choosing it does not bias the bound. An audit can only show a bug (ε_lb above the claim);
passing it is evidence, not a proof. Its power is checked by auditing the same mechanism with
its noise halved, which must exceed the claim.

The ``*_scores`` functions run the product's own code paths
(``LocalRandomizer``,
``GradientSanitizer``,
``gaussian_sliced_release``,
``MeanEmbeddingRelease``) on a worst-case pair
and return one test statistic per draw, oriented so that larger means D'. See
``docs/privacy_audit.md`` and ``benchmarks/audit_privacy.py``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from scipy.stats import beta as beta_distribution
from torch import Tensor

from lightning_dpot.checks import check_probability
from lightning_dpot.methods.dp_merf import MeanEmbeddingRelease, fourier_features
from lightning_dpot.methods.dpsw.sensitivity import gaussian_sliced_release
from lightning_dpot.ot.dp_sinkhorn import SemiDebiasedSinkhorn
from lightning_dpot.privacy.mechanisms.clipped_sum import block_sum
from lightning_dpot.privacy.mechanisms.gradient_sanitizer import GradientSanitizer
from lightning_dpot.privacy.mechanisms.ldp import LocalRandomizer

__all__ = [
    "AuditResult",
    "audit_threshold_test",
    "clopper_pearson_upper",
    "dp_sinkhorn_canary_gradients",
    "epsilon_lower_bound",
    "ldp_scores",
    "farthest_embedding_pair",
    "mean_embedding_scores",
    "sanitizer_scores",
    "sliced_release_scores",
]


def clopper_pearson_upper(successes: int, trials: int, alpha: float) -> float:
    """One-sided Clopper–Pearson upper bound at level ``alpha`` on a binomial proportion:
    ``Beta⁻¹(1 − alpha; k + 1, n − k)`` (1 when ``k = n``)."""
    alpha = check_probability("alpha", alpha)
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, trials >= 1; got {successes}/{trials}")
    if successes == trials:
        return 1.0
    return float(beta_distribution.ppf(1.0 - alpha, successes + 1, trials - successes))


def epsilon_lower_bound(
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    delta: float,
    alpha: float = 0.05,
) -> float:
    """``log((1 − δ − β̄)/ᾱ)`` with ᾱ, β̄ the Clopper–Pearson upper bounds at ``alpha/2`` each
    (module docstring); 0 when the test is no better than chance at that confidence. ``delta``
    may be 0 (pure ε-DP)."""
    delta = float(delta)
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must lie in [0, 1), got {delta!r}")
    fpr = clopper_pearson_upper(false_positives, negatives, alpha / 2.0)
    fnr = clopper_pearson_upper(false_negatives, positives, alpha / 2.0)
    if 1.0 - delta - fnr <= fpr:
        return 0.0
    return math.log((1.0 - delta - fnr) / fpr)


@dataclass(frozen=True)
class AuditResult:
    """Outcome of ``audit_threshold_test``."""

    epsilon_lower_bound: float
    threshold: float
    false_positive_rate: float
    false_negative_rate: float
    draws_per_side: int
    confidence: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _counts(out: np.ndarray, inn: np.ndarray, threshold: float) -> tuple[int, int]:
    return int((out > threshold).sum()), int((inn <= threshold).sum())


def audit_threshold_test(
    scores_d: Tensor | np.ndarray,
    scores_d_prime: Tensor | np.ndarray,
    delta: float,
    alpha: float = 0.05,
    selection_fraction: float = 0.2,
    num_thresholds: int = 200,
    seed: int = 0,
) -> AuditResult:
    """ε lower bound of the test "say D' iff score > t" (module docstring).

    Args:
        scores_d, scores_d_prime: one statistic per draw of ``M(D)`` and of ``M(D')``.
        delta: the δ of the guarantee being audited.
        alpha: 1 − confidence of the bound.
        selection_fraction: share of each side's draws used only to choose t (among
            ``num_thresholds`` quantiles of the pooled selection scores).
        seed: seed of the random split into selection and evaluation draws.
    """
    out = np.asarray(scores_d, dtype=np.float64).ravel()
    inn = np.asarray(scores_d_prime, dtype=np.float64).ravel()
    selection_fraction = check_probability("selection_fraction", selection_fraction)
    if selection_fraction >= 1.0:
        raise ValueError(f"selection_fraction must be in (0, 1), got {selection_fraction!r}")
    rng = np.random.default_rng(seed)
    out, inn = rng.permutation(out), rng.permutation(inn)
    k_out, k_in = int(len(out) * selection_fraction), int(len(inn) * selection_fraction)
    if min(k_out, k_in, len(out) - k_out, len(inn) - k_in) < 1:
        raise ValueError("too few draws to split into selection and evaluation sets")
    sel_out, sel_in, ev_out, ev_in = out[:k_out], inn[:k_in], out[k_out:], inn[k_in:]

    candidates = np.quantile(np.concatenate([sel_out, sel_in]), np.linspace(0, 1, num_thresholds))
    best_t, best_eps = float(candidates[0]), -1.0
    for t in candidates:
        fp, fn = _counts(sel_out, sel_in, float(t))
        eps = epsilon_lower_bound(fp, len(sel_out), fn, len(sel_in), delta, alpha)
        if eps > best_eps:
            best_t, best_eps = float(t), eps
    fp, fn = _counts(ev_out, ev_in, best_t)
    return AuditResult(
        epsilon_lower_bound=epsilon_lower_bound(fp, len(ev_out), fn, len(ev_in), delta, alpha),
        threshold=best_t,
        false_positive_rate=fp / len(ev_out),
        false_negative_rate=fn / len(ev_in),
        draws_per_side=len(ev_out),
        confidence=1.0 - alpha,
    )


# -- worst-case experiments on the product's mechanisms ------------------------------------------


def ldp_scores(
    randomizer: LocalRandomizer, x: Tensor, x_prime: Tensor, draws: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Privatize the records ``x`` and ``x_prime`` (one record each, ``sample_shape``) ``draws``
    times with ``randomizer``; the statistic is the projection of the release onto the unit
    vector from f(x) to f(x') in the mechanism's domain. For pairs differing in one coordinate
    (as in the audits) that is the likelihood-ratio direction."""
    v, v_prime = randomizer.transform.forward(torch.stack([x, x_prime]).float())
    direction = (v_prime - v) / torch.linalg.vector_norm(v_prime - v)
    releases = [randomizer(r.expand(draws, *r.shape), generator) for r in (x, x_prime)]
    return releases[0].double() @ direction.double(), releases[1].double() @ direction.double()


def sanitizer_scores(
    sanitizer: GradientSanitizer, grad: Tensor, grad_prime: Tensor, draws: int
) -> tuple[Tensor, Tensor]:
    """Release the cross blocks ``grad`` and ``grad_prime`` (``(n, d)``, all rows cross rows)
    ``draws`` times each through ``sanitizer`` (clip to Δ + N(0, (2Δσ)²)); the statistic is the
    projection onto the unit vector from clip(grad) to clip(grad′). Opposite blocks of norm ≥ Δ
    reach the sensitivity 2Δ: the worst case."""
    rows = grad.shape[0]
    direction = grad_prime - grad
    direction = direction / torch.linalg.vector_norm(direction)
    scores = []
    for g in (grad, grad_prime):
        s = torch.empty(draws, dtype=torch.float64)
        for i in range(draws):
            s[i] = (sanitizer(g, num_cross=rows) * direction).sum()
        scores.append(s)
    return scores[0], scores[1]


def dp_sinkhorn_canary_gradients(
    loss: SemiDebiasedSinkhorn, generated: Tensor, real: Tensor, canary: Tensor, num_cross: int
) -> tuple[Tensor, Tensor]:
    """Cross-block gradients ``∇_{X[0:n]} Ŝ(X, Y)`` and ``∇_{X[0:n]} Ŝ(X, Y ∪ {canary})`` of the
    real DP-Sinkhorn loss at fixed generated rows X: what one sanitized step releases (before
    clipping and noise) on neighbouring batches, the canary absent / present."""
    grads = []
    for batch in (real, torch.cat([real, canary])):
        x = generated.detach().clone().requires_grad_(True)
        loss(x, batch, num_cross).backward()
        assert x.grad is not None
        grads.append(x.grad[:num_cross].reshape(num_cross, -1).clone())
    return grads[0], grads[1]


def sliced_release_scores(
    theta: Tensor, sigma: float, draws: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """The sliced release ``yΘᵀ + N(0, σ²)`` (Sebag et al. 2023, eq. 23) of the worst unit-norm pair
    ``y = −u, y′ = u`` with u the top right singular vector of Θ (‖Θ(y′ − y)‖ = 2‖Θ‖₂, the
    largest over the unit ball); statistic: projection onto Θu/‖Θu‖."""
    u = torch.linalg.svd(theta, full_matrices=False).Vh[0]
    direction = theta @ u
    direction = direction / torch.linalg.vector_norm(direction)
    out = []
    for y in (-u, u):
        release = gaussian_sliced_release(y.expand(draws, -1), theta, sigma, generator)
        out.append(release.double() @ direction.double())
    return out[0], out[1]


def farthest_embedding_pair(
    omega: Tensor, candidates: int = 4000, seed: int = 3
) -> tuple[tuple[Tensor, int], tuple[Tensor, int]]:
    """A same-label pair ``(0, x)`` in [−1, 1]^d with ``x`` the seeded candidate whose random
    features are farthest from those of 0 (up to 2 = Δ; two labels are only √2 apart)."""
    generator = torch.Generator().manual_seed(seed)
    x = 2 * torch.rand(candidates, omega.shape[1], generator=generator) - 1
    phi = fourier_features(torch.cat([torch.zeros(1, omega.shape[1]), x]).double(), omega.double())
    far = x[int(torch.argmax(torch.linalg.vector_norm(phi[1:] - phi[0], dim=1)))]
    return (torch.zeros(omega.shape[1]), 0), (far, 0)


def mean_embedding_scores(
    release: MeanEmbeddingRelease,
    pair: tuple[tuple[Tensor, int], tuple[Tensor, int]],
    omega: Tensor,
    num_blocks: int,
    draws: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """DP-MERF's release (Harder et al. 2021) of the one-record data sets ``{pair[0]}`` and
    ``{pair[1]}`` (each ``(record, label)``; the other records add the same sum to both),
    ``draws`` times each through ``release``; statistic: projection onto the unit vector from
    the first record's embedding to the second's."""
    embeddings = [
        block_sum(fourier_features(x.reshape(1, -1).double(), omega.double()),
                        torch.tensor([y]), num_blocks)
        for x, y in pair
    ]  # fmt: skip
    direction = embeddings[1] - embeddings[0]
    direction = direction / torch.linalg.vector_norm(direction)
    scores = []
    for x, y in pair:
        records, labels = x.unsqueeze(0), torch.tensor([y])
        s = torch.empty(draws, dtype=torch.float64)
        for i in range(draws):
            s[i] = (release(records, labels, omega, num_blocks, (-1.0, 1.0), generator)
                    * direction).sum()  # fmt: skip
        scores.append(s)
    return scores[0], scores[1]
