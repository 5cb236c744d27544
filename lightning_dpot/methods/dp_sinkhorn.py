r"""DP-Sinkhorn (Cao et al. 2021): central DP by sanitizing ∇_X of a Sinkhorn loss.

Algorithm 1 (Cao et al. 2021, §4; see docs/dp_sinkhorn.md), one optimizer step t = 1, …, T
------------------------------------------------------------------------------------------
Input: private records d = {(y, l)}^M, Poisson rate q, noise multiplier σ, clip Δ, generator
g_θ, learning rate α, entropic λ, debias fraction p. T is **not** an input: the
``PrivacyAccountantCallback`` stops training
before the step that would exceed the target (ε, δ).

1. Y ← Poisson sample of d with rate q (App. C, Algorithm 2;
   ``CentralDPDataModule``). |Y| ~ Binomial(M, q); Y = ∅ is
   possible and is still a step.
2. n = ``num_cross`` (default round(q·M), the expected batch), n' = ⌊n·p⌋;
   z_1..z_{n+n'} ~ Unif[``latent_range``]^latent_dim, labels l_i ~ Unif{0, …, L−1}.
3. X = g_θ(z, l) ∈ R^{(n+n')×d}.
4. G = ∇_X Ŝ_{c,λ,p}(X, Y), Ŝ = 2Ŵ_λ(X[0:n], Y) − Ŵ_λ(X[0:n], X[n':n+n']) (Def. 4.3, eq. 6;
   ``SemiDebiasedSinkhorn``), cost
   c_m(x, y) = ‖x−y‖₂² + m‖x−y‖₁ on [x, α_c·onehot(l)] (App. D.3).
   **Empty batch** (Y = ∅): the cross term is absent and Ŝ = −Ŵ_λ(X[0:n], X[n':n+n']), the
   debias term, which needs no real data. Step 5 then releases clipped debias gradients plus
   noise, distributed as with data apart from the cross term itself (released as exact zeros,
   the debias rows would tell that the batch was empty). The step is accounted like any other.
5. Sanitize G by a backward hook registered on X (``X.register_hook``,
   ``GradientSanitizer``):
   G̃[0:n] = clip_F(G[0:n], Δ) + 2Δσ·N(0, I)  (the cross block, jointly clipped);
   G̃[n:n+n'] = clip_F(G[n:n+n'], Δ)           (debias rows: data-independent, no noise).
6. G_θ = J_θ(X)ᵀ G̃ (autograd through the generator), θ ← θ − α·Adam(G_θ) (weight decay
   2·10⁻⁵, lr 10⁻⁴ MNIST / 10⁻⁵ Fashion-MNIST, CelebA; App. D.3).

Privacy. θ_t is post-processing of G̃_1..G̃_t. Each G̃ is the Gaussian mechanism on the clipped
cross block (ℓ2 sensitivity 2Δ, noise std 2Δσ: multiplier σ) applied to a Poisson sample with
rate q. The sanitizer is the method's release object (``lightning_dpot.privacy.contract``):
each call emits one ``SubsampledGaussianStep(σ, q)``, σ computed from the noise std and the
sensitivity it uses, q read from the datamodule and checked against the training loader's
Poisson sampler at the start of training; the accountant composes what was emitted. The paper's
per-row text (§4.3) and its Theorem 4.1 disagree with its accounting; see
``lightning_dpot.privacy.mechanisms.gradient_sanitizer`` and docs/dp_sinkhorn.md. Under DDP each
rank Poisson-samples its own shard and sanitizes its own block with its own noise; the gradients are
averaged (post-processing) and the accounting is that of one step (parallel composition, see
docs/design.md#distributed-training).

Nothing derived from Y other than G̃ leaves a private step: the loss value and the real batch
size are **not** logged in private mode (both depend on Y); only the non-private reference logs
``train/loss``. The noise is secret by default (OS entropy); see ``noise_seed``.

Non-private reference (ε = ∞, paper Table 1 "Non-priv Sinkhorn"): ``noise_multiplier=None``
(or 0) removes the hook altogether (no clipping, no noise) and nothing is emitted.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_dpot.checks import (
    check_nonnegative,
    check_positive,
)
from lightning_dpot.methods.base import log_sinkhorn_info
from lightning_dpot.methods.central import SanitizedGradientModule
from lightning_dpot.ot.backend import NEWTON_MAX_POINTS
from lightning_dpot.ot.dp_sinkhorn import SemiDebiasedSinkhorn, debias_rows, mixed_cost_diameter

__all__ = ["DPSinkhorn"]


class DPSinkhorn(SanitizedGradientModule):
    """DP-Sinkhorn (Cao et al. 2021, Algorithm 1; module docstring), on the template of
    ``lightning_dpot.methods.central``.

    Args:
        generator: ``(z, labels) → images`` (e.g. ``ConditionalDCGANGenerator``, paper D.3) when
        ``conditional``, else ``z → images``.
        noise_multiplier: σ (paper 1.5 MNIST, 1.9 Fashion-MNIST/CelebA); ``None`` or 0 for the
            non-private reference (or with ``target_epsilon``, which calibrates it).
        target_epsilon: calibrate σ at setup: the smallest σ whose ε after the run's planned
            steps (``trainer.max_steps`` or ``max_epochs`` × steps per epoch) at rate q is ≤ this
            (``calibrated_noise_std``); needs
            ``delta`` and ``noise_multiplier=None``.
        delta: δ of the guarantee (the accountant reads it from the sanitizer). The
            calibration uses RDP, the accountant ``dpot fit`` attaches, so the reported ε is the
            one calibrated against.
        clip_norm: Δ > 0, Frobenius clip of the cross block and of the debias block (paper 0.5).
        debias_fraction: p ∈ [0, 1] (paper 0.4; official code 0.2).
        l1_weight: m ≥ 0 of the cost ‖x−y‖₂² + m‖x−y‖₁ (paper 1 MNIST, 3 Fashion-MNIST).
        entropic_reg: λ > 0 (paper 0.05 MNIST/Fashion-MNIST, 5 CelebA).
        class_weight: α_c of the one-hot class features in the cost (paper 15).
        conditional: class-conditional generation (labels from the data source).
        num_cross: n, generated cross rows per step; default round(q·M) (paper: n = q·M = 50).
        latent_range: z ~ Unif[low, high]^latent_dim (official code: [0, 1]).
        lr, weight_decay, betas: Adam (paper 10⁻⁴ MNIST / 10⁻⁵ others, 2·10⁻⁵, (0.9, 0.999)).
        scaling: ε-scaling ratio of the annealing (0.5 = geomloss' default, as in the
            paper); every solve then iterates at λ to the solver's tolerance.
        noise_seed: ``None`` = secret noise from OS entropy; an integer makes the noise
            reproducible and **voids the guarantee** for anyone who knows it (tests only).
        secure_rng: noise from the OS CSPRNG instead (``docs/secure_noise.md``).
        cuda_graphs: on a GPU, replay each step's fixed-budget solve as a captured CUDA graph,
            one per Poisson batch size met (``lightning_dpot.ot.graphs``; values equal to
            the eager solve's); no effect on the CPU.
    """

    method_description = "DP-Sinkhorn (Cao et al. 2021, Algorithm 1)"

    def __init__(
        self,
        generator: nn.Module,
        noise_multiplier: float | None = 1.5,
        target_epsilon: float | None = None,
        delta: float | None = None,
        clip_norm: float = 0.5,
        debias_fraction: float = 0.4,
        l1_weight: float = 1.0,
        entropic_reg: float = 0.05,
        class_weight: float = 15.0,
        conditional: bool = True,
        num_cross: int | None = None,
        latent_range: tuple[float, float] = (0.0, 1.0),
        lr: float = 1e-4,
        weight_decay: float = 2e-5,
        betas: tuple[float, float] = (0.9, 0.999),
        scaling: float = 0.5,
        noise_seed: int | None = None,
        secure_rng: bool = False,
        cuda_graphs: bool = False,
    ) -> None:
        super().__init__(
            generator, noise_multiplier, target_epsilon, delta, clip_norm, num_cross,
            conditional, noise_seed, secure_rng, latent_range=latent_range, lr=lr,
        )  # fmt: skip
        self.save_hyperparameters(ignore=["generator"])
        debias_rows(1, debias_fraction)  # validates p
        self.debias_fraction = float(debias_fraction)
        self.l1_weight = check_nonnegative("l1_weight", l1_weight)
        self.entropic_reg = check_positive("entropic_reg", entropic_reg)
        self.class_weight = check_nonnegative("class_weight", class_weight)
        self.weight_decay = check_nonnegative("weight_decay", weight_decay)
        self.betas = (float(betas[0]), float(betas[1]))
        self.scaling = float(scaling)
        self.cuda_graphs = bool(cuda_graphs)

    # -- the loss (lightning_dpot.methods.central does the rest) ------------------------------
    @override
    def generated_rows(self) -> int:
        """n cross rows and ⌊n·p⌋ debias rows (module docstring, step 2)."""
        return self.sanitized_rows + debias_rows(self.sanitized_rows, self.debias_fraction)

    @override
    def build_central_loss(self, datamodule: Any, shape: tuple[int, ...]) -> None:
        dim = 1
        for s in shape:
            dim *= int(s)
        class_weight = self.class_weight if self.conditional else 0.0
        self.loss_fn = SemiDebiasedSinkhorn(
            entropic_reg=self.entropic_reg,
            l1_weight=self.l1_weight,
            debias_fraction=self.debias_fraction,
            num_classes=self.num_classes if self.conditional else None,
            class_weight=class_weight,
            diameter=mixed_cost_diameter(
                dim, float(datamodule.value_range), self.l1_weight, class_weight
            ),
            scaling=self.scaling,
            fixed_budget=self.private,
            cuda_graphs=self.cuda_graphs,
        )
        if self.private and self.sanitized_rows > NEWTON_MAX_POINTS:
            warnings.warn(
                f"DPSinkhorn: private solves run the fixed-budget Newton path, whose steps cost "
                f"O(n³) for n = {self.sanitized_rows} generated rows (above "
                f"{NEWTON_MAX_POINTS}: seconds per solve); a smaller batch keeps steps fast",
                stacklevel=2,
            )

    @override
    def central_loss(
        self, fake: Tensor, labels: Tensor | None, real: Tensor, real_labels: Tensor | None
    ) -> Tensor:
        """Ŝ of Def. 4.3; an empty Poisson batch leaves the debias term only (step 4)."""
        assert self.loss_fn is not None
        loss = self.loss_fn(fake, real, self.sanitized_rows, labels, real_labels)
        if not self.private:  # the solve on real records is not released
            log_sinkhorn_info(self, self.loss_fn.last_info)
        return loss

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        """Adam with the fused kernel: one call per step, and the step counts stay tensors (the
        per-parameter loop reads each back to the host, a synchronization on a GPU)."""
        return torch.optim.Adam(
            self.generator.parameters(),
            lr=self.lr,
            betas=self.betas,
            weight_decay=self.weight_decay,
            fused=True,
        )

    def loss_description(self) -> dict[str, Any]:
        """Settings for ``report.json`` (RunReport)."""
        n = self.num_cross
        return {
            "loss": "semi-debiased Sinkhorn (Cao et al. 2021, Def. 4.3)",
            "cost": f"|x-y|_2^2 + {self.l1_weight}*|x-y|_1",
            "entropic_reg": self.entropic_reg,
            "debias_fraction": self.debias_fraction,
            "num_cross": n,
            "num_debias": None if n is None else debias_rows(n, self.debias_fraction),
            "class_weight": self.class_weight if self.conditional else None,
            "clip_norm": self.sanitizer.clip_norm,
            "noise_multiplier": self.sanitizer.noise_multiplier if self.private else None,
            "noise_std": self.sanitizer.noise_std if self.private else None,
            "sensitivity_l2": self.sanitizer.sensitivity_l2 if self.private else None,
            "sanitization": "cross block clipped jointly (Frobenius) + N(0,(2*clip*sigma)^2); "
            "debias rows clipped only"
            if self.private
            else "none (non-private reference)",
        }
