r"""The DP sliced-Wasserstein flow (Sebag et al. 2023, §4): particles move along the gradient of
``½ G_σSW_2^2(·, ν) + λ H(·)`` (eq. 12) with the Euler–Maruyama step
``X_{k+1} = X_k + h v̂_k(X_k) + sqrt(2λh) ξ`` (eqs. 17–21), the target ν entering only through its
released noisy projections (``noisy_projections``). Notation and
the interpolation of the empirical quantiles and CDFs: ``lightning_dpot.ot.sliced``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from lightning_dpot.checks import check_nonnegative, check_positive
from lightning_dpot.ot.precision import full_precision
from lightning_dpot.ot.sliced import (
    check_matrix,
    empirical_cdf,
    empirical_quantile,
    project,
    standard_normal_like,
)

DriftEvaluation = Literal["noisy", "projection"]

__all__ = ["DriftEvaluation", "sliced_flow_drift", "sliced_flow_step"]


def _ranks_as_levels(values: Tensor) -> Tensor:
    """Levels ``rank/(n − 1)`` of every entry within its row (ties broken by sort order)."""
    n = values.shape[1]
    order = torch.argsort(values, dim=1)
    knots = torch.arange(n, device=values.device, dtype=values.dtype) / (n - 1)
    levels = torch.empty_like(values)
    levels.scatter_(1, order, knots.expand_as(values))
    return levels


@full_precision
def sliced_flow_drift(
    particles: Tensor,
    target_projections_noisy: Tensor,
    theta: Tensor,
    noise_scale: float,
    generator: torch.Generator | None = None,
    *,
    evaluate_at: DriftEvaluation = "noisy",
    target_sorted: bool = False,
) -> Tensor:
    """Monte Carlo drift ``v̂(x)`` of the Gaussian-smoothed SW flow (Sebag et al. 2023, eqs. 19–21).

    ``v̂(x) = −(1/N_θ) Σ_j ψ_j'(z_j) θ_j`` (eq. 20), with (eq. 21)
    ``ψ_j'(z) = z − F̃_{ν,j}^{-1}(F̃_{μ,j}(z))``, where

    * ``F̃_{μ,j}`` is the empirical CDF of the particles' noisy projections
      ``⟨X^i, θ_j⟩ + σ Z^i_j`` (fresh ``Z`` each call: the particles are public, their noise
      costs no privacy, but it must have the target's level ``σ`` so that both projections are
      smoothed alike — ``θ_j#μ̂ * N(0, σ²)``, eq. 19);
    * ``F̃_{ν,j}^{-1}`` is the empirical quantile function of column ``j`` of the released target
      projections ``Y Θᵀ + Z_Y`` (eq. 23);
    * both use the linear interpolation of ``empirical_cdf`` / ``empirical_quantile``.

    Where ψ' is evaluated (``evaluate_at``):

    * ``"noisy"`` (default): at each particle's own noisy projection, ``z_j = ⟨x, θ_j⟩ + σZ_j``.
      Then ``F̃_μ(z)`` is the particle's rank level and the map is the monotone matching of the two
      noisy samples. This is the unbiased one-draw estimate of the exact first variation of
      ``½ G_σSW_2^2`` under ``x ↦ x + εζ(x)``, whose velocity is ``−∫ E_Z[ψ_θ'(⟨x, θ⟩ + σZ)] θ dθ``
      (the noise moves with its particle), and it is what the authors' code computes.
    * ``"projection"``: at the clean projection ``z_j = ⟨x, θ_j⟩``, as eq. 21 is printed
      (Proposition 2 in App. A). It still uses the noisy particle CDF.

    With ``σ = 0`` both are the (unsmoothed) SW flow drift of Liutkus et al. (2019).

    DPSWflow uses ``M_θ`` of its ``N_θ`` fixed directions per step: pass ``theta[idx]`` and
    ``target_projections_noisy[:, idx]``.

    Args:
        particles: ``(n, d)``, ``n ≥ 2``.
        target_projections_noisy: ``(m, N_θ)`` released target projections (column ``j`` ↔ ``θ_j``).
        theta: ``(N_θ, d)`` unit directions.
        noise_scale: ``σ ≥ 0``, the release's noise level.
        generator: random stream of the particles' projection noise.
        evaluate_at: ``"noisy"`` or ``"projection"``, see above.
        target_sorted: ``True`` when every column of ``target_projections_noisy`` is already
            sorted ascending (e.g. ``torch.sort(release, dim=0).values``, cached once by
            DPSWflow); skips one sort per step. Sorting is post-processing and changes nothing
            else.

    Returns:
        ``(n, d)`` drift ``v̂(X^i)``.
    """
    noise_scale = check_nonnegative("noise_scale", noise_scale)
    if evaluate_at not in ("noisy", "projection"):
        raise ValueError(f"evaluate_at must be 'noisy' or 'projection', got {evaluate_at!r}")
    check_matrix("target_projections_noisy", target_projections_noisy)
    n = particles.shape[0] if particles.dim() == 2 else 0
    if n < 2:
        raise ValueError(f"the flow needs at least 2 particles, got shape {tuple(particles.shape)}")
    num_directions = theta.shape[0] if theta.dim() == 2 else -1
    if target_projections_noisy.shape[1] != num_directions:
        raise ValueError(
            f"target_projections_noisy has {target_projections_noisy.shape[1]} columns but theta "
            f"has shape {tuple(theta.shape)}; one column per direction is required"
        )
    # Same draws (layout (n, N_θ)) as noisy_projections and dp_sliced_wasserstein_loss.
    proj = project(particles, theta)
    noisy = proj + noise_scale * standard_normal_like(proj, generator) if noise_scale else proj
    proj, noisy = proj.transpose(0, 1), noisy.transpose(0, 1).contiguous()  # (N_θ, n)
    if evaluate_at == "noisy":
        z = noisy
        levels = _ranks_as_levels(noisy)
    else:
        z = proj
        levels = empirical_cdf(torch.sort(noisy, dim=1).values, proj)
    target = target_projections_noisy.transpose(0, 1).to(proj.dtype)
    if not target_sorted:
        target = torch.sort(target, dim=1).values
    transported = empirical_quantile(target.contiguous(), levels)  # (N_θ, n)
    return -((z - transported).transpose(0, 1) @ theta) / num_directions


def sliced_flow_step(
    particles: Tensor,
    target_projections_noisy: Tensor,
    theta: Tensor,
    step_size: float,
    noise_scale: float,
    diffusion: float,
    generator: torch.Generator | None = None,
    *,
    evaluate_at: DriftEvaluation = "noisy",
    target_sorted: bool = False,
) -> Tensor:
    """One Euler–Maruyama step of the DP sliced-Wasserstein flow (Sebag et al. 2023, eqs. 17–18).

    ``X^i_{k+1} = X^i_k + h v̂_k(X^i_k) + sqrt(2λh) ξ^i``, ``ξ^i ~ N(0, I_d)``, with ``v̂_k`` from
    ``sliced_flow_drift`` (eq. 18 as printed omits the ``X^i_k +``; Algorithm 2, line 9, and
    eq. 17 as an SDE discretisation include it). The target enters only through
    ``target_projections_noisy``, so a step is post-processing of that release.

    Random draws, in order, from ``generator``: the particles' projection noise (if ``σ > 0``),
    then ``ξ`` (if ``λ > 0``).

    Args:
        particles: ``(n, d)`` current particles ``X_k``.
        target_projections_noisy: ``(m, N_θ)`` released target projections.
        theta: ``(N_θ, d)`` unit directions.
        step_size: ``h > 0``.
        noise_scale: ``σ ≥ 0`` (same as the release).
        diffusion: ``λ ≥ 0``, the entropic regularisation strength of eq. 12.
        generator: the random stream.
        evaluate_at, target_sorted: see ``sliced_flow_drift``.

    Returns:
        ``(n, d)`` new particles ``X_{k+1}`` (the input is not modified).
    """
    step_size = check_positive("step_size", step_size)
    diffusion = check_nonnegative("diffusion", diffusion)
    drift = sliced_flow_drift(
        particles,
        target_projections_noisy,
        theta,
        noise_scale,
        generator,
        evaluate_at=evaluate_at,
        target_sorted=target_sorted,
    )
    moved = particles + step_size * drift
    if diffusion == 0.0:
        return moved
    return moved + math.sqrt(2.0 * diffusion * step_size) * standard_normal_like(moved, generator)
