"""Noisy p-WGAN baseline (Reshetova et al. 2024, §IV-F, eq. 23).

The generator's output is passed through the data's own local randomizer before an
**unregularized** OT loss with the mechanism's cost:

    L(G) = W_p^p(P_{M(G(Z))}, Q_Y^n),   M(x) = Π(f(x)) + Z,   Z ~ Laplace(0, b) or N(0, σ²),

with f the release transform (identity or DCT), Π the release projection (ℓ1/ℓ2 ball, if any)
and fresh noise Z for every generated record at every step. Reshetova et al. 2024 use p = 1 with
the Laplace mechanism (W_1, ℓ1 cost). Eq. 23 is consistent (its minimizer also matches P_X,
Theorem III.1) but, being unregularized, it suffers from the curse of dimensionality,
W_1(P_{M(G(Z))}, Q_Y^n) = Ω(n^{-1/d}); this is the comparison of Figs. 11–12.

Privacy: the noise here is added to *generated* records, which depend on no private data; it is
drawn with torch's default RNG on the module's device and costs nothing. The privatized data
themselves are never re-noised (they come from the cached release).
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_dpot.methods.base import OptimizerName
from lightning_dpot.methods.entropic_wgan import EntropicWGAN
from lightning_dpot.privacy.mechanisms.additive import Mechanism
from lightning_dpot.privacy.mechanisms.ldp import LocalRandomizer
from lightning_dpot.privacy.mechanisms.projections import project_l1_ball, project_l2_ball


def fresh_mechanism_noise(mechanism: Mechanism, like: Tensor) -> Tensor:
    """i.i.d. noise of ``mechanism`` with the shape, dtype and device of ``like``, drawn from
    torch's default RNG of that device (not a release generator).

    Laplace(0, b): b·sign(u)·(−log(1 − |u|)) with u ~ Unif(−1 + ε_mach, 1), the inverse CDF
    that ``torch.distributions.Laplace`` uses (the open lower end keeps the noise finite).
    Gaussian: σ·N(0, 1).
    """
    if mechanism.name == "gaussian":
        return torch.randn_like(like) * mechanism.noise_scale
    if mechanism.name == "laplace":
        eps = torch.finfo(like.dtype).eps
        u = torch.empty_like(like).uniform_(eps - 1.0, 1.0)
        return -mechanism.noise_scale * torch.sign(u) * torch.log1p(-u.abs())
    raise ValueError(f"mechanism must be 'laplace' or 'gaussian', got {mechanism.name!r}")


def randomize_generated(randomizer: LocalRandomizer, samples: Tensor) -> Tensor:
    """M(G(z)) = Π(f(G(z))) + fresh noise, the data's randomizer applied to generated records
    ``(n, *sample_shape) → (n, m)``; differentiable in ``samples``."""
    v = randomizer.transform.forward(samples)
    if randomizer.l1_radius is not None:
        v = project_l1_ball(v, randomizer.l1_radius)
    if randomizer.l2_radius is not None:
        v = project_l2_ball(v, randomizer.l2_radius)
    return v + fresh_mechanism_noise(randomizer.mechanism, v)


class NoisyWGAN(EntropicWGAN):
    """Noisy p-WGAN of Reshetova et al. 2024, eq. 23: unregularized OT between M(G(Z)) and the
    release.

    The loss is ``EntropicWGAN``'s ``regularization="none"`` (exact minibatch OT by
    assignment, see ``ExactOT``), with p matched to the mechanism;
    only ``release_view`` differs.

    Args:
        generator: network z → record with attribute ``latent_dim``.
        p: cost exponent; default: matched to the mechanism (1 for Laplace, 2 for Gaussian).
        allow_cost_mismatch: permit p ≠ the mechanism's p.
        max_exact_batch: largest batch solved exactly by assignment (above it, ExactOT falls
            back to a small-blur Sinkhorn and warns). Reshetova et al. 2024, §IV-F use batch
            6000.
        latent_range: latent distribution Unif[low, high]^latent_dim.
        lr: learning rate of the generator's optimizer.
        generated_batch_size: generated samples per step (default: the real batch size).
        optimizer, betas: ``"adam"`` (Adam's ``betas``) or ``"rmsprop"``, as for
            ``GeneratorModule``.
    """

    def __init__(
        self,
        generator: nn.Module,
        p: int | None = None,
        allow_cost_mismatch: bool = False,
        max_exact_batch: int = 2048,
        latent_range: tuple[float, float] = (-1.0, 1.0),
        lr: float = 1e-4,
        generated_batch_size: int | None = None,
        optimizer: OptimizerName = "adam",
        betas: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(
            generator,
            regularization="none",
            p=p,
            allow_cost_mismatch=allow_cost_mismatch,
            max_exact_batch=max_exact_batch,
            latent_range=latent_range,
            lr=lr,
            generated_batch_size=generated_batch_size,
            optimizer=optimizer,
            betas=betas,
        )
        self.randomizer: LocalRandomizer | None = None

    @override
    def build_loss(self, datamodule: L.LightningDataModule) -> nn.Module:
        self.randomizer = datamodule.randomizer
        return super().build_loss(datamodule)

    @override
    def release_view(self, samples: Tensor) -> Tensor:
        """M(G(z)): transform → projection → fresh mechanism noise (eq. 23)."""
        if self.randomizer is None:
            raise RuntimeError(
                "NoisyWGAN.release_view needs the datamodule's randomizer: fit first"
            )
        return randomize_generated(self.randomizer, samples)

    @override
    def loss_description(self) -> dict:
        return {
            **super().loss_description(),
            "generated_through_mechanism": True,
            "paper": "Reshetova et al. 2024, eq. 23 (noisy p-WGAN)",
        }
