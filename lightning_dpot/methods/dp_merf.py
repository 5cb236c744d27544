r"""DP-MERF (Harder et al. 2021): a generator fitted to one private mean embedding of random
Fourier features.

Release, once, before training
------------------------------
Random Fourier features of the Gaussian kernel k(x, x') = exp(−‖x − x'‖²/(2ℓ²))
(Rahimi & Recht 2007), with D frequencies ω_j ~ N(0, ℓ⁻² I) drawn from a public seed:

    φ(x) = D^{-1/2} [cos(ω_1ᵀx), …, cos(ω_Dᵀx), sin(ω_1ᵀx), …, sin(ω_Dᵀx)] ∈ R^{2D},

so ``φ(x)ᵀφ(x') ≈ k(x, x')`` and ``‖φ(x)‖₂ = 1`` for every x. A class-conditional embedding
is ``e(x, y) = φ(x) ⊗ onehot(y) ∈ R^{L×2D}``, still of norm 1 (unconditional: L = 1). The
release is the noisy mean embedding of the n private records,

    μ̃ = (Σ_i e(x_i, y_i) + N(0, σ² I)) / n.

Privacy. Replacing one record changes the sum by ``‖e(x, y) − e(x', y')‖₂ ≤ 2 = Δ``: one
Gaussian mechanism with noise multiplier σ/Δ, emitted as one
``GaussianRelease`` (replace-one; ε from the analytic
Gaussian mechanism, Balle & Wang 2018). This is Harder et al.'s Δ = 2/n on the mean; n is the
public dataset size, the same under replace-one. Each row of features is computed in float64 and
scaled onto the unit ball before it is summed (the float64 sum adds at most O(n·ulp), about
1e-11 at n = 60,000, which the calibration's 1e-9 relative margin on σ covers); the records
are checked finite and inside the source's declared bounds before anything is released.

Training, post-processing of μ̃ (no privacy cost, any number of steps):

    θ ← Adam(∇_θ ‖μ̃ − (1/B) Σ_b e(G_θ(z_b, y_b), y_b)‖²),  y_b ~ Unif{0, …, L−1},

the squared MMD between the released embedding and a generated batch's. Labels are drawn
uniformly, so the generated class proportions are 1/L (Fashion-MNIST and MNIST are balanced; the
class weights in μ̃ are not fitted).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_dpot.checks import (
    check_delta,
    check_epsilon,
    check_labels,
    check_nonnegative,
    check_nonnegative_int,
    check_positive,
    check_positive_int,
    check_records,
)
from lightning_dpot.methods.base import OptimizerName
from lightning_dpot.methods.conditional import ConditionalGeneratorModule
from lightning_dpot.ot.precision import upcast
from lightning_dpot.privacy.accounting.calibration import calibrated_noise_std
from lightning_dpot.privacy.contract import ReleasesPrivateData
from lightning_dpot.privacy.events import EventLog, GaussianRelease, PrivacyEvent
from lightning_dpot.privacy.guards import check_release_before_training, warn_if_unaccounted
from lightning_dpot.rng import SecretNoise, seeded_generator, standard_normal

__all__ = ["DPMERF", "MeanEmbeddingRelease", "fourier_features", "random_frequencies"]

#: ℓ2 sensitivity of the summed embedding under replace-one (two unit vectors).
SENSITIVITY = 2.0
_CHUNK = 2048


def random_frequencies(num_frequencies: int, dim: int, length_scale: float, seed: int) -> Tensor:
    """``(D, d)`` frequencies ω_j ~ N(0, ℓ⁻² I) in float64 from the public ``seed``."""
    generator = seeded_generator(seed)
    omega = torch.randn(num_frequencies, dim, generator=generator, dtype=torch.float64)
    return omega / length_scale


def fourier_features(x: Tensor, omega: Tensor) -> Tensor:
    """``φ(x) = D^{-1/2} [cos(xΩᵀ), sin(xΩᵀ)]`` of ``(n, d)`` records, in ``omega``'s dtype."""
    projection = x.to(omega.dtype) @ omega.T
    scale = 1.0 / math.sqrt(omega.shape[0])
    return torch.cat([torch.cos(projection), torch.sin(projection)], dim=1) * scale


def class_embedding(features: Tensor, labels: Tensor | None, num_blocks: int) -> Tensor:
    """``Σ_i φ_i ⊗ onehot(y_i)`` as ``(L, 2D)`` (one block when ``labels`` is ``None``)."""
    out = features.new_zeros(num_blocks, features.shape[1])
    if labels is None:
        return out + features.sum(0, keepdim=True)
    return out.index_add(0, labels.to(features.device), features)


class MeanEmbeddingRelease:
    """The Gaussian release of the summed random-feature embedding, counted and reported
    (module docstring).

    Args:
        delta: δ of the guarantee.
        noise_seed, secure_rng: the noise source (``SecretNoise``).
        is_private: False only for the non-private reference (σ = 0).
    """

    def __init__(
        self,
        delta: float,
        noise_seed: int | None = None,
        secure_rng: bool = False,
        is_private: bool = True,
    ) -> None:
        self.delta = check_delta("delta", delta)
        self.noise = SecretNoise(noise_seed, secure_rng)
        self.is_private = bool(is_private)
        self.events = EventLog()
        self.noise_scale = 0.0
        self.calibrated = False

    def calibrate(self, noise_scale: float) -> None:
        """Fix σ, the standard deviation of the noise on the sum."""
        self.noise_scale = check_nonnegative("noise_scale", noise_scale)
        if self.is_private != (self.noise_scale > 0.0):
            raise ValueError(
                f"noise_scale={noise_scale!r} for a release declared is_private={self.is_private}"
            )
        self.calibrated = True

    @property
    def event(self) -> PrivacyEvent | None:
        """One ``GaussianRelease`` at σ/Δ (``None`` before calibration and when σ = 0)."""
        if not self.calibrated or self.noise_scale == 0.0:
            return None
        return GaussianRelease(self.noise_scale / SENSITIVITY, adjacency="replace_one")

    def __call__(
        self,
        records: Tensor,
        labels: Tensor | None,
        omega: Tensor,
        num_blocks: int,
        bounds: tuple[float, float],
        source: Any,
    ) -> Tensor:
        """The noisy sum ``Σ_i e(x_i, y_i) + N(0, σ²I)``, ``(L, 2D)`` in float64.

        Everything it can refuse is checked before the event is emitted: calibration, records
        finite and inside ``bounds``, labels in ``[0, L)`` (or one block without labels), a
        noise source when σ > 0, finite features. The noiseless sum is computed first, in
        float64 with autocast off (each row of features scaled onto the unit ball), then the
        event is emitted, then the noise is drawn and added in place."""
        if not self.calibrated:
            raise RuntimeError("MeanEmbeddingRelease: calibrate() before releasing")
        flat = records.detach().reshape(records.shape[0], -1)
        check_records(flat, bounds[0], bounds[1], "records")
        if labels is not None:
            check_labels(labels, num_blocks, flat.shape[0], "labels")
        elif num_blocks != 1:
            raise ValueError(
                f"labels is None but num_blocks={num_blocks}: an unlabelled release has one "
                "block (every record's embedding in each block would make Δ = 2·sqrt(blocks))"
            )
        if flat.shape[1] != omega.shape[1]:
            raise ValueError(
                f"records have {flat.shape[1]} values each, the frequencies {omega.shape[1]}"
            )
        if source is None and self.noise_scale > 0.0:
            raise ValueError(
                "source is None: a private release draws its noise from its own source "
                "(release.noise.source(...)), never from the global RNG"
            )
        omega = omega.to(device=flat.device, dtype=torch.float64)
        total = torch.zeros(num_blocks, 2 * omega.shape[0], dtype=torch.float64, device=flat.device)
        with torch.autocast(flat.device.type, enabled=False):
            for start in range(0, flat.shape[0], _CHUNK):
                features = fourier_features(flat[start : start + _CHUNK], omega)
                norms = torch.linalg.vector_norm(features, dim=1, keepdim=True)
                features = features / norms.clamp(min=1.0)
                chunk_labels = None if labels is None else labels[start : start + _CHUNK].long()
                total += class_embedding(features, chunk_labels, num_blocks)
            if not bool(torch.isfinite(total).all()):
                raise ValueError(
                    "records: their random features are not finite (a projection overflowed); "
                    "rescale the data or declare tighter bounds"
                )
            event = self.event
            if event is not None:
                self.events.emit(event)  # journaled before the noise is drawn
            if self.noise_scale > 0.0:
                total += self.noise_scale * standard_normal(
                    tuple(total.shape), source, device=flat.device
                )
        return total

    def facts(self) -> dict[str, Any]:
        """What the accountant's report needs beyond the events (plain JSON types)."""
        return {
            "mechanism": "gaussian mean embedding of random Fourier features (Harder et al. 2021)",
            "noise_scale": self.noise_scale,
            "sensitivity_l2": SENSITIVITY,
            "sensitivity_check": "every feature row scaled onto the unit ball (replace-one)",
            "releases": self.events.total,
            **self.noise.facts(),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"events": self.events.state_dict(), "noise_scale": self.noise_scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.events.load_state_dict(state["events"])
        self.calibrate(float(state["noise_scale"]))


class DPMERF(ReleasesPrivateData, ConditionalGeneratorModule):
    """DP-MERF (Harder et al. 2021; module docstring): one private release of the random-feature
    mean embedding, then a generator trained to match it.

    Args:
        generator: ``(z, labels) → images`` (e.g. ``ConditionalDCGANGenerator``) when
        ``conditional``, else ``z → images``.
        noise_scale / target_epsilon: exactly one: σ, the noise std on the summed embedding
            (0: the non-private reference), or the ε it is calibrated to (analytic Gaussian
            mechanism at ``delta``, Δ = 2).
        delta: δ of the guarantee.
        num_frequencies: D (2D features; Harder et al. 2021 and DPImageBench: 2D = 10,000).
        length_scale: ℓ of the Gaussian kernel, in the records' units; public, never from the
            data. Harder et al. (2021)'s code draws the frequencies from N(0, I/σ_rff), so its
            length scale is √σ_rff: √105 ≈ 10.2 for MNIST in [0, 1] (default 20.5 in [−1, 1])
            and √127 ≈ 11.3 for Fashion-MNIST (22.5 in [−1, 1]).
        frequency_seed: seed of the public frequencies Ω.
        generated_batch_size: B, generated samples per step.
        conditional: class-conditional embedding and generator.
        latent_range, lr, optimizer, betas: ``GeneratorModule``'s.
        noise_seed: ``None`` = secret noise from OS entropy; an integer makes the noise
            reproducible and **voids the guarantee** for anyone who knows it (tests only).
        secure_rng: noise from the OS CSPRNG instead (``docs/secure_noise.md``).

    Raises:
        ValueError: both or neither of ``noise_scale`` and ``target_epsilon``, or a parameter
            out of range (named).
    """

    def __init__(
        self,
        generator: nn.Module,
        noise_scale: float | None = None,
        target_epsilon: float | None = None,
        delta: float = 1e-5,
        num_frequencies: int = 5000,
        length_scale: float = 20.5,
        frequency_seed: int = 0,
        generated_batch_size: int = 100,
        conditional: bool = True,
        latent_range: tuple[float, float] = (0.0, 1.0),
        lr: float = 1e-3,
        optimizer: OptimizerName = "adam",
        betas: tuple[float, float] | None = None,
        noise_seed: int | None = None,
        secure_rng: bool = False,
    ) -> None:
        super().__init__(
            generator, conditional, latent_range=latent_range, lr=lr,
            generated_batch_size=check_positive_int("generated_batch_size", generated_batch_size),
            optimizer=optimizer, betas=betas,
        )  # fmt: skip
        if (noise_scale is None) == (target_epsilon is None):
            raise ValueError(
                "give exactly one of noise_scale (σ ≥ 0, 0 = not private) and target_epsilon "
                f"(> 0), got noise_scale={noise_scale!r}, target_epsilon={target_epsilon!r}"
            )
        self.target_epsilon = (
            None if target_epsilon is None else check_epsilon("target_epsilon", target_epsilon)
        )
        self.release = MeanEmbeddingRelease(
            delta, noise_seed, secure_rng, is_private=noise_scale != 0.0
        )
        self.given_noise_scale = (
            None if noise_scale is None else check_nonnegative("noise_scale", noise_scale)
        )
        self.num_frequencies = check_positive_int("num_frequencies", num_frequencies)
        self.length_scale = check_positive("length_scale", length_scale)
        self.frequency_seed = check_nonnegative_int("frequency_seed", frequency_seed)
        blocks = int(generator.num_classes) if self.conditional else 1
        self.register_buffer("released", torch.zeros((), dtype=torch.bool))
        self.register_buffer("embedding", torch.zeros(blocks, 2 * self.num_frequencies))
        self.omega: Tensor | None = None
        self.num_records: int | None = None

    # -- privacy contract -----------------------------------------------------------------------
    @override
    def privacy_releases(self) -> list[MeanEmbeddingRelease]:
        return [self.release]

    @override
    def next_step_events(self) -> list[PrivacyEvent]:
        """Steps release nothing: the one release happens before training."""
        return []

    @override
    def planned_events(self) -> list[PrivacyEvent]:
        """The one release, before it is drawn (so a budget can refuse it)."""
        event = self.release.event
        return [] if bool(self.released) or event is None else [event]

    @override
    def privacy_context(self) -> dict[str, Any]:
        return {
            "method": "DP-MERF (Harder et al. 2021): one release",
            "num_frequencies": self.num_frequencies,
            "length_scale": self.length_scale,
            "frequency_seed_is_public": True,
        }

    @override
    def resume_settings(self) -> dict[str, Any]:
        """What the features depend on: a resume must use the release's own kernel."""
        return {
            "num_frequencies": self.num_frequencies,
            "length_scale": self.length_scale,
            "frequency_seed": self.frequency_seed,
        }

    # -- Lightning ------------------------------------------------------------------------------
    @override
    def setup(self, stage: str) -> None:
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is None or self.bind_private_data(datamodule):
            return
        shape = self.check_central_data(datamodule)
        self.num_records = int(datamodule.num_private)
        dim = math.prod(int(s) for s in shape)
        self.omega = random_frequencies(
            self.num_frequencies, dim, self.length_scale, self.frequency_seed
        ).float()
        sigma = self.given_noise_scale
        if self.target_epsilon is not None:
            sigma = calibrated_noise_std(self.target_epsilon, self.release.delta, SENSITIVITY, 1)
            self.planned_release_count = 1
        if not self.release.calibrated:
            self.release.calibrate(float(sigma))

    @override
    def on_fit_start(self) -> None:
        """Release once (rank 0, broadcast), unless a checkpoint already holds the release;
        refused where it would not be accounted (``check_release_before_training``)."""
        warn_if_unaccounted(self)
        if bool(self.released):
            return
        check_release_before_training(self)
        datamodule = self.trainer.datamodule
        assert self.omega is not None and self.num_records is not None
        if self.trainer.is_global_zero:
            source = self.release.noise.source(0, device=self.device)
            labels = datamodule.train_labels if self.conditional else None
            noisy_sum = self.release(
                datamodule.train_records.to(self.device),
                None if labels is None else labels.to(self.device),
                self.omega.double(),
                self.embedding.shape[0],
                (float(datamodule.source.low), float(datamodule.source.high)),
                source,
            )
            mean = (noisy_sum / self.num_records).float()
        else:
            mean = torch.zeros_like(self.embedding)
        self.embedding = self.trainer.strategy.broadcast(mean, src=0).to(self.device)
        self.released = torch.ones((), dtype=torch.bool, device=self.device)

    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        """One step on the squared MMD to the released embedding; ``batch`` is not read."""
        if not bool(self.released):
            raise RuntimeError(
                "DPMERF trains only on its release, made when the fit starts (the tuner's "
                "lr_find runs before it: give lr instead)"
            )
        assert self.omega is not None and self.generated_batch_size is not None
        n = self.generated_batch_size
        labels = self.sample_labels(n) if self.conditional else None
        fake = upcast(self.generate(self.sample_latent(n), labels)).reshape(n, -1)
        omega = self.omega.to(fake.device)
        with torch.autocast(fake.device.type, enabled=False):
            features = fourier_features(fake, omega)
            generated = class_embedding(features, labels, self.embedding.shape[0])
            loss = (self.embedding - generated / n).pow(2).sum()
        self.log("train/loss", loss, prog_bar=True, sync_dist=True)  # a function of μ̃ only
        return loss

    def loss_description(self) -> dict[str, Any]:
        """Settings for ``report.json`` (RunReport)."""
        return {
            "loss": "squared MMD to the released random-feature mean embedding "
            "(Harder et al. 2021)",
            "kernel": f"gaussian, length scale {self.length_scale}",
            "num_features": 2 * self.num_frequencies,
            "generated_batch_size": self.generated_batch_size,
            "noise_scale": self.release.noise_scale,
        }
