r"""Sanitization of the loss gradient w.r.t. generated records (DP-Sinkhorn, Cao et al. 2021,
§4.3).

Let G = ∇_X Ŝ ∈ R^{(n+n')×d} be the gradient of the loss w.r.t. the generated batch. Rows
[0:n) (the *cross block* G_c) depend on the real Poisson batch Y; rows [n:n+n') (G_d) do not
(Def. 4.3). The release is (see docs/dp_sinkhorn.md)::

    G̃_c = G_c · min(1, Δ / ‖G_c‖_F) + 2Δσ · N(0, I_{n×d}),
    G̃_d = G_d · min(1, Δ / ‖G_d‖_F)                        (clipped, no noise).

Privacy. Under add/remove-one adjacency, both clipped cross blocks have Frobenius norm ≤ Δ, so
‖clip(G_c(Y)) − clip(G_c(Y'))‖_F ≤ 2Δ: ℓ2 sensitivity ``sensitivity_l2 = 2Δ``. The Gaussian noise
has standard deviation ``noise_std = 2Δσ`` per entry, so one release is the Gaussian mechanism
with noise multiplier ``noise_std / sensitivity_l2 = σ`` and, with Poisson sampling at rate q, one
step of the Poisson-subsampled Gaussian mechanism (σ, q) — what
``GradientSanitizer.accounting_noise_multiplier`` reports, computed from the two numbers the
hook actually uses. G̃_d is a function of the generator alone (post-processing).

Why not the paper's per-row text: §4.3 clips each row to Δ and adds N(0, Δ²σ²); its Theorem 4.1
then gives (α, 2αn/σ²)-RDP per step (n-fold composition of rows), i.e. an effective multiplier
σ/(2√n), while the paper's accounting uses σ. Algorithm 1 and the official code clip the whole
block with noise 2Δσ, which matches multiplier σ; we implement that.

Noise source. The noise must be secret: by default it comes from a private ``torch.Generator``
seeded from OS entropy (``noise_seed=None``). An explicit ``noise_seed`` makes runs reproducible
(the noise of the run's k-th release on rank r is drawn from a generator seeded by
``(noise_seed, k, r)``), but anyone who knows the seed can subtract the noise: use it for tests
and debugging only (``SecretNoise``).

Events. The sanitizer is a release object (``lightning_dpot.privacy.contract``): every call
with noise emits one ``SubsampledGaussianStep`` (σ, q) into
``events``, q being the Poisson rate the method sets in ``sample_rate``. Under DDP each rank
sanitizes its own block (parallel composition: one step) and emits into its own log.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_dpot.checks import (
    check_delta,
    check_nonnegative,
    check_positive,
    check_probability,
)
from lightning_dpot.privacy.events import EventLog, SubsampledGaussianStep
from lightning_dpot.rng import SecretNoise, standard_normal

__all__ = ["GradientSanitizer", "clip_frobenius"]


def clip_frobenius(block: Tensor, clip_norm: float) -> Tensor:
    """``block · min(1, Δ/‖block‖_F)`` in float64; a zero block stays zero, and a block with a
    non-finite entry becomes zero (a fixed function of the block of norm ≤ Δ, so the
    sensitivity holds and the release stays finite whatever the loss computed). No host
    synchronisation."""
    block = block.double()  # the clip is proved in the precision it is computed in
    # A NaN or ∞ anywhere would survive the scaling: replace the block by 0 (norm 0 ≤ Δ),
    # decided on the device, so no host synchronisation reveals which step it was.
    block = torch.where(torch.isfinite(block).all(), block, torch.zeros_like(block))
    norm = torch.linalg.vector_norm(block)
    # min(1, Δ/‖G‖): a block inside the ball is unchanged; 1e-300 keeps 0/0 out of a zero block.
    scale = torch.clamp(clip_norm / norm.clamp_min(1e-300), max=1.0)
    return block * scale


class GradientSanitizer:
    """Clip the cross block jointly to Δ and add N(0, (2Δσ)²); clip the debias rows only.

    Args:
        clip_norm: Δ > 0, the Frobenius clip of each block (paper 0.5).
        noise_multiplier: σ ≥ 0 (paper 1.5 MNIST, 1.9 Fashion-MNIST/CelebA); 0 = no noise
            (non-private reference; clipping still applies).
        noise_seed: ``None`` (default): secret noise from OS entropy. An integer: reproducible
            noise, **no privacy** against anyone who knows it (module docstring).
        secure_rng: draw the noise from the OS CSPRNG (``OSRandom``, on the CPU, then copied to the
        gradient's device) instead of
            a secretly seeded ``torch.Generator``; excludes ``noise_seed``.
        sample_rate: the Poisson rate q of the batches whose gradients it sanitizes (1 for a
            whole dataset); part of every event, so required before a call with noise (the
            method sets it from its datamodule).

    After each call, ``last`` holds what was released (``released``, the returned gradient,
    flattened) and ``num_cross``; nothing before the noise is kept.
    """

    def __init__(
        self,
        clip_norm: float,
        noise_multiplier: float,
        noise_seed: int | None = None,
        secure_rng: bool = False,
        sample_rate: float | None = None,
        delta: float | None = None,
    ) -> None:
        self.clip_norm = check_positive("clip_norm", clip_norm)
        self.delta = None if delta is None else check_delta("delta", delta)
        self.noise_multiplier = check_nonnegative("noise_multiplier", noise_multiplier)
        self.noise = SecretNoise(noise_seed, secure_rng)
        self.sample_rate = (
            None if sample_rate is None else check_probability("sample_rate", sample_rate)
        )
        self.events = EventLog()
        self.last: dict[str, Tensor | int] = {}

    # -- the numbers the accountant is told -------------------------------------------------------
    @property
    def sensitivity_l2(self) -> float:
        """2Δ: the ℓ2 distance between two clipped cross blocks (add/remove one record)."""
        return 2.0 * self.clip_norm

    @property
    def noise_std(self) -> float:
        """2Δσ: the standard deviation of the noise added to each cross-block entry."""
        return 2.0 * self.clip_norm * self.noise_multiplier

    def accounting_noise_multiplier(self) -> float:
        """``noise_std / sensitivity_l2`` (= σ): the SGM multiplier of one release."""
        return self.noise_std / self.sensitivity_l2

    # -- the release object's contract (lightning_dpot.privacy.contract) ------------------------
    @property
    def is_private(self) -> bool:
        return self.noise_multiplier > 0.0

    @property
    def event(self) -> SubsampledGaussianStep | None:
        """One Poisson-subsampled Gaussian step (σ, q); ``None`` without noise."""
        if self.noise_multiplier == 0.0:
            return None
        if self.sample_rate is None:
            raise RuntimeError("GradientSanitizer.sample_rate (the Poisson rate q) is not set")
        rate = check_probability("sample_rate", self.sample_rate)
        return SubsampledGaussianStep(self.accounting_noise_multiplier(), rate)

    def facts(self) -> dict:
        return {
            "mechanism": "gaussian on the jointly clipped cross block (Cao et al. 2021, §4.3)",
            "clip_norm": self.clip_norm,
            "sensitivity_l2": self.sensitivity_l2,
            "noise_std": self.noise_std,
            "noise_multiplier": self.noise_multiplier,
            "releases": self.events.total,
            **self.noise.facts(),
        }

    # -- the release ------------------------------------------------------------------------------
    def __call__(self, grad: Tensor, num_cross: int, rank: int = 0) -> Tensor:
        """Sanitize ``grad`` (``(n + n', ...)``, the gradient w.r.t. the generated batch) whose
        first ``num_cross`` = n rows form the cross block; returns a tensor of ``grad``'s shape
        and dtype.

        Clipping and noise are computed in float64 with autocast off, whatever the training
        precision (a bf16 draw would be coarse enough to help floating-point attacks, Mironov
        2012); only the released sum is cast back. The event is emitted (and journaled) before
        the noise is drawn. With a public ``noise_seed`` the noise of the k-th release on rank
        r comes from ``(noise_seed, k, r)``, so no two releases of a run share it (gradient
        accumulation and resumes included)."""
        if not 0 <= num_cross <= grad.shape[0]:
            raise ValueError(
                f"num_cross must lie in [0, {grad.shape[0]}] (rows of grad), got {num_cross!r}"
            )
        with torch.autocast(grad.device.type, enabled=False):
            flat = grad.detach().reshape(grad.shape[0], -1)
            cross = clip_frobenius(flat[:num_cross], self.clip_norm)
            debias = clip_frobenius(flat[num_cross:], self.clip_norm)
            event = self.event
            if event is not None:
                index = self.events.total
                # Emit before drawing: the journal holds the release before any noise (and
                # so any output of it) exists; a crash after this line is still accounted.
                self.events.emit(event)
                source = self.noise.source(index, rank, device=grad.device)
                noise = standard_normal(tuple(cross.shape), source, device=grad.device)
                cross = cross + self.noise_std * noise
            released = torch.cat([cross, debias]).to(grad.dtype)
        self.last = {"released": released.detach(), "num_cross": num_cross}
        return released.reshape(grad.shape)
