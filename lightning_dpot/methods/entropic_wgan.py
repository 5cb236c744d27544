"""Entropic p-Wasserstein GAN on locally privatized data (Reshetova et al. 2024, Algorithm 1).

Loss W_{p,λ}(P_G, Q_Y) = min_π ⟨π, C⟩ + λ KL(π ‖ μ⊗ν), C_ij = ‖G(z_i) − y_j‖_p^p, λ = p·σ^p,
with σ the mechanism's noise scale (Laplace b for p = 1, Gaussian std for p = 2). Theorem 1 of
Reshetova et al. 2024: with the cost matched to the mechanism (p = 1 ↔ Laplace, p = 2 ↔ Gaussian),
the minimizer over generators recovers the *raw* distribution P_X from privatized samples Y — the
entropic term is what denoises, so the loss is deliberately **not** debiased.

``regularization`` selects the variant: ``entropic`` (the method), ``divergence`` (the debiased
Sinkhorn divergence, a comparison) or ``none`` (the unregularized p-WGAN, eq. 13, which learns
the noisy distribution P_Y).
"""

from __future__ import annotations

from typing import Literal

import lightning as L
from torch import Tensor, nn
from typing_extensions import override

from lightning_dpot.methods.base import GeneratorModule, OptimizerName, log_sinkhorn_info
from lightning_dpot.ot import EntropicOT, ExactOT
from lightning_dpot.ot.sinkhorn import Backend, SinkhornInfo

Regularization = Literal["entropic", "divergence", "none"]


class EntropicWGAN(GeneratorModule):
    """Entropic p-WGAN; see module docstring.

    Args:
        regularization: ``entropic`` | ``divergence`` | ``none``.
        p: cost exponent; default: matched to the datamodule's mechanism.
        entropic_reg: λ; default p·σ^p from the mechanism.
        allow_cost_mismatch: permit p ≠ the mechanism's p (Theorem 1 then does not apply).
        scaling: Sinkhorn ε-scaling ratio in (0, 1) (annealing; convergence is set by ``tol``).
        max_exact_batch: largest batch solved exactly when ``regularization="none"``.
        backend: Sinkhorn backend, ``auto`` | ``tensorized`` | ``online`` | ``multiscale``
            (``lightning_dpot.ot.sinkhorn``); ``auto`` picks by size, dimension and device.
        tol: tolerance on the marginal violation ‖π1 − a‖₁ of every solve.
        max_iter: cap on the Sinkhorn sweeps at λ.
        latent_range, lr, generated_batch_size, optimizer, betas: as for
            ``GeneratorModule`` (Adam, lr 10⁻⁴ by default).
    """

    def __init__(
        self,
        generator: nn.Module,
        regularization: Regularization = "entropic",
        p: int | None = None,
        entropic_reg: float | None = None,
        allow_cost_mismatch: bool = False,
        scaling: float = 0.9,
        max_exact_batch: int = 2048,
        latent_range: tuple[float, float] = (-1.0, 1.0),
        lr: float = 1e-4,
        generated_batch_size: int | None = None,
        backend: Backend = "auto",
        tol: float = 1e-3,
        max_iter: int = 2000,
        optimizer: OptimizerName = "adam",
        betas: tuple[float, float] | None = None,
    ) -> None:
        super().__init__(
            generator,
            latent_range=latent_range,
            lr=lr,
            generated_batch_size=generated_batch_size,
            optimizer=optimizer,
            betas=betas,
        )
        if regularization not in ("entropic", "divergence", "none"):
            raise ValueError(
                f"regularization must be 'entropic', 'divergence' or 'none', got {regularization!r}"
            )
        if p is not None and p not in (1, 2):
            raise ValueError(f"p must be 1 or 2, got {p!r}")
        self.regularization = regularization
        self.p = p
        self.entropic_reg = entropic_reg
        self.allow_cost_mismatch = allow_cost_mismatch
        self.scaling = scaling
        self.max_exact_batch = max_exact_batch
        self.backend, self.tol, self.max_iter = backend, tol, max_iter
        self.last_sinkhorn: SinkhornInfo | None = None

    @override
    def build_loss(self, datamodule: L.LightningDataModule) -> nn.Module:
        mechanism = datamodule.mechanism
        p = self.p or mechanism.p
        if p != mechanism.p and not self.allow_cost_mismatch:
            raise ValueError(
                f"p={p} does not match the {mechanism.name} mechanism (p={mechanism.p}); "
                "Theorem 1 of Reshetova et al. 2024 pairs p=1 with Laplace and p=2 with "
                "Gaussian. Set allow_cost_mismatch=true to train with a mismatched cost anyway"
            )
        self.p = p
        diameter = datamodule.support_diameter(p)
        if self.regularization == "none":
            return ExactOT(p, diameter, self.max_exact_batch)
        if self.entropic_reg is None:
            self.entropic_reg = p * mechanism.noise_scale**p
        return EntropicOT(
            p,
            self.entropic_reg,
            diameter,
            self.scaling,
            debias=self.regularization == "divergence",
            tol=self.tol,
            max_iter=self.max_iter,
            backend=self.backend,
        )

    @override
    def compute_loss(self, fake: Tensor, real: Tensor) -> Tensor:
        loss = super().compute_loss(fake, real)
        if self.loss_fn.last_info is not None:
            self.last_sinkhorn = self.loss_fn.last_info
            log_sinkhorn_info(self, self.last_sinkhorn)
        return loss

    def loss_description(self) -> dict:
        """The loss actually trained, for the run report."""
        info = self.last_sinkhorn
        return {
            "regularization": self.regularization,
            "p": self.p,
            "entropic_reg": None if self.regularization == "none" else self.entropic_reg,
            "sinkhorn": None
            if info is None
            else {"requested_backend": self.backend, "max_iter": self.max_iter, **info.as_dict()},
        }
