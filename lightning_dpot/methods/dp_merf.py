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

from lightning_dpot.checks import check_nonnegative_int, check_positive, check_positive_int
from lightning_dpot.methods.base import OptimizerName
from lightning_dpot.methods.released_statistic import ReleasedStatisticModule
from lightning_dpot.privacy.mechanisms.clipped_sum import ClippedSumRelease, block_sum
from lightning_dpot.rng import seeded_generator

__all__ = ["DPMERF", "MeanEmbeddingRelease", "fourier_features", "random_frequencies"]

#: ℓ2 sensitivity of the summed embedding under replace-one (two unit vectors).
SENSITIVITY = 2.0


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


class MeanEmbeddingRelease(ClippedSumRelease):
    """The Gaussian release of the summed random-feature embedding (module docstring): a
    ``ClippedSumRelease`` of the features φ at C = 1, which moves no row (‖φ(x)‖₂ = 1) and
    makes Δ = 2 hold in float64 whatever the rounding.

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
        super().__init__(
            SENSITIVITY / 2, delta, noise_seed, secure_rng, is_private,
            mechanism="gaussian mean embedding of random Fourier features (Harder et al. 2021)",
        )  # fmt: skip

    def __call__(  # type: ignore[override]
        self,
        records: Tensor,
        labels: Tensor | None,
        omega: Tensor,
        num_blocks: int,
        bounds: tuple[float, float],
        source: Any,
    ) -> Tensor:
        """The noisy sum ``Σ_i e(x_i, y_i) + N(0, σ²I)``, ``(L, 2D)`` in float64, for the
        ``(D, d)`` frequencies ``omega`` (``ClippedSumRelease.__call__``)."""
        width = math.prod(records.shape[1:])
        if width != omega.shape[1]:
            raise ValueError(f"records have {width} values each, the frequencies {omega.shape[1]}")
        omega = omega.to(device=records.device, dtype=torch.float64)
        return super().__call__(
            records, labels, lambda x: fourier_features(x, omega), num_blocks, bounds, source
        )


class DPMERF(ReleasedStatisticModule):
    """DP-MERF (Harder et al. 2021; module docstring): one private release of the random-feature
    mean embedding, then a generator trained to match it (``ReleasedStatisticModule``).

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

    method_description = "DP-MERF (Harder et al. 2021): one release"

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
        self.num_frequencies = check_positive_int("num_frequencies", num_frequencies)
        self.length_scale = check_positive("length_scale", length_scale)
        self.frequency_seed = check_nonnegative_int("frequency_seed", frequency_seed)
        release = MeanEmbeddingRelease(delta, noise_seed, secure_rng, noise_scale != 0.0)
        blocks = int(getattr(generator, "num_classes", 1)) if conditional else 1
        super().__init__(
            generator, release, (blocks, 2 * self.num_frequencies), noise_scale, target_epsilon,
            generated_batch_size, conditional,
            latent_range=latent_range, lr=lr, optimizer=optimizer, betas=betas,
        )  # fmt: skip
        self.omega: Tensor | None = None
        self.num_records: int | None = None

    @property
    def embedding(self) -> Tensor:
        """μ̃, the released mean embedding ``(L, 2D)`` (zeros before the release)."""
        return self.statistic

    @override
    def privacy_context(self) -> dict[str, Any]:
        return {
            **super().privacy_context(),
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

    # -- the template's three parts -------------------------------------------------------------
    @override
    def prepare_release(self, datamodule: Any, shape: tuple[int, ...]) -> None:
        """The public frequencies Ω for records of ``shape``, and n, the public dataset size."""
        self.num_records = int(datamodule.num_private)
        dim = math.prod(int(s) for s in shape)
        self.omega = random_frequencies(
            self.num_frequencies, dim, self.length_scale, self.frequency_seed
        ).float()

    @override
    def release_statistic(self, datamodule: Any, source: Any) -> Tensor:
        """μ̃ = (Σ_i e(x_i, y_i) + N(0, σ²I)) / n."""
        assert self.omega is not None and self.num_records is not None
        labels = datamodule.train_labels if self.conditional else None
        noisy_sum = self.release(
            datamodule.train_records.to(self.device),
            None if labels is None else labels.to(self.device),
            self.omega.double(),
            self.statistic.shape[0],
            (float(datamodule.source.low), float(datamodule.source.high)),
            source,
        )
        return noisy_sum / self.num_records

    @override
    def statistic_loss(self, fake: Tensor, labels: Tensor | None) -> Tensor:
        """‖μ̃ − (1/B) Σ_b e(G(z_b, y_b), y_b)‖², in float32 with autocast off."""
        assert self.omega is not None
        n = fake.shape[0]
        omega = self.omega.to(fake.device)
        with torch.autocast(fake.device.type, enabled=False):
            features = fourier_features(fake.reshape(n, -1), omega)
            generated = block_sum(features, labels, self.statistic.shape[0])
            return (self.statistic - generated / n).pow(2).sum()

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        """Checkpoints written before the template held μ̃ under ``embedding``."""
        if prefix + "embedding" in state_dict and prefix + "statistic" not in state_dict:
            state_dict[prefix + "statistic"] = state_dict.pop(prefix + "embedding")
        super()._load_from_state_dict(state_dict, prefix, *args)

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
