r"""The template of a central-DP method that sanitizes the gradient of its loss with respect to
the generated records (the scheme of DP-Sinkhorn, Cao et al. 2021, Algorithm 1).

Per step, on a Poisson sample Y of the private records at rate q:

    X = G(z, l),   G = ∇_X loss(X, Y),   G̃[0:n] = clip_F(G[0:n], Δ) + 2Δσ·N(0, I),

then θ ← optimizer(J_θ(X)ᵀ G̃). Only G̃ depends on Y, and it is the sampled Gaussian mechanism
(multiplier σ, rate q): θ is post-processing. The base does everything that makes this true:
it validates σ, the target ε and δ; binds the central data (``CentralPrivateData``) and reads q
and whether the Poisson seed is public (a public seed voids amplification, so q = 1 is
accounted); calibrates σ to ``target_epsilon`` over the planned steps; registers the sanitizer
(``GradientSanitizer``, the release object) as a hook on X; refuses a loader that is not
Poisson-sampled at q, and ``16-mixed`` loss scaling; and logs the loss only when not private.

A method writes two things:

* ``build_central_loss(datamodule, shape)``: its loss, from public facts of the data;
* ``central_loss(fake, labels, real, real_labels)``: the loss of one step on the generated
  rows ``fake`` (their first ``sanitized_rows`` rows carry the data's influence).

and may change how many rows a step generates (``generated_rows``; default ``num_cross``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from typing_extensions import override

from lightning_dpot.checks import check_delta, check_epsilon, check_nonnegative, check_positive_int
from lightning_dpot.data.poisson import PoissonBatchSampler
from lightning_dpot.methods.conditional import ConditionalGeneratorModule
from lightning_dpot.ot.precision import upcast
from lightning_dpot.privacy.accounting.calibration import calibrated_noise_std
from lightning_dpot.privacy.contract import ReleasesPrivateData
from lightning_dpot.privacy.guards import planned_releases, warn_if_unaccounted
from lightning_dpot.privacy.mechanisms.gradient_sanitizer import GradientSanitizer

__all__ = ["SanitizedGradientModule"]


class SanitizedGradientModule(ReleasesPrivateData, ConditionalGeneratorModule):
    """A generator trained on central-DP data through sanitized gradients (module docstring).

    Args:
        generator: ``(z, labels) → records`` when ``conditional``, else ``z → records``.
        noise_multiplier: σ; ``None`` or 0 for the non-private reference (or with
            ``target_epsilon``, which calibrates it).
        target_epsilon: calibrate σ at setup, the smallest whose ε after the planned steps at
            rate q is at most this; needs ``delta`` and ``noise_multiplier=None``.
        delta: δ of the guarantee.
        clip_norm: Δ > 0, the Frobenius clip of the sanitized rows.
        num_cross: n, rows whose gradients are sanitized per step; default round(q·M).
        conditional: class-conditional generation (labels from the data source).
        noise_seed: ``None`` = secret noise from OS entropy; an integer makes the noise
            reproducible and voids the guarantee for anyone who knows it (tests only).
        secure_rng: noise from the OS CSPRNG.
        **kwargs: ``GeneratorModule``'s (``latent_range``, ``lr``, ...).

    Raises:
        ValueError: naming the parameter: σ < 0, ``target_epsilon`` with a σ or without
            ``delta``, ε or δ out of range, ``clip_norm`` ≤ 0, ``num_cross`` < 1.
    """

    #: the method's name in the privacy report
    method_description = "a central-DP generator with sanitized gradients"

    def __init__(
        self,
        generator: nn.Module,
        noise_multiplier: float | None = 1.0,
        target_epsilon: float | None = None,
        delta: float | None = None,
        clip_norm: float = 1.0,
        num_cross: int | None = None,
        conditional: bool = True,
        noise_seed: int | None = None,
        secure_rng: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(generator, conditional, **kwargs)
        sigma = (
            0.0
            if noise_multiplier is None
            else check_nonnegative("noise_multiplier", noise_multiplier)
        )
        if target_epsilon is not None:
            if sigma > 0:
                raise ValueError(
                    f"target_epsilon={target_epsilon!r} calibrates the noise multiplier: set "
                    f"noise_multiplier to null, got {noise_multiplier!r}"
                )
            if delta is None:
                raise ValueError("target_epsilon needs delta, the δ of the (ε, δ) target")
            check_epsilon("target_epsilon", target_epsilon)
        self.target_epsilon = target_epsilon
        self.private = sigma > 0 or target_epsilon is not None
        self.sanitizer = GradientSanitizer(clip_norm, sigma, noise_seed, secure_rng)
        self.sanitizer.delta = None if delta is None else check_delta("delta", delta)
        self.num_cross = None if num_cross is None else check_positive_int("num_cross", num_cross)
        self.sample_rate: float | None = None
        self.poisson_seed_is_public: bool | None = None  # known at setup

    # -- what a method writes ---------------------------------------------------------------
    def build_central_loss(self, datamodule: Any, shape: tuple[int, ...]) -> None:
        """Build the loss (``self.loss_fn``) from the data's public facts; records ``shape``."""
        raise NotImplementedError

    def central_loss(
        self, fake: Tensor, labels: Tensor | None, real: Tensor, real_labels: Tensor | None
    ) -> Tensor:
        """One step's loss; the first ``sanitized_rows`` rows of ``fake`` meet the data."""
        raise NotImplementedError

    @property
    def sanitized_rows(self) -> int:
        """n: the rows whose gradient block is clipped jointly and noised."""
        assert self.num_cross is not None
        return self.num_cross

    def generated_rows(self) -> int:
        """Rows generated per step (default n; more where the loss has data-free rows)."""
        return self.sanitized_rows

    # -- privacy contract -------------------------------------------------------------------
    @override
    def privacy_releases(self) -> list[GradientSanitizer]:
        return [self.sanitizer]

    @property
    @override
    def is_private(self) -> bool:
        """Noise is added (σ > 0, or σ still to be calibrated from ``target_epsilon``)."""
        return self.private

    @override
    def privacy_context(self) -> dict[str, Any]:
        public = self.poisson_seed_is_public
        return {
            "method": self.method_description,
            "poisson_seed_is_public": public,
            "amplification_by_sampling": None if public is None else not public,
        }

    def _calibrate(self, datamodule: Any) -> None:
        """σ from ``target_epsilon`` over the planned steps at the sanitizer's rate q."""
        assert self.target_epsilon is not None and self.sanitizer.sample_rate is not None
        steps = planned_releases(self.trainer, int(datamodule.steps_per_epoch))
        self.planned_release_count = steps
        self.sanitizer.noise_multiplier = calibrated_noise_std(
            self.target_epsilon, self.sanitizer.delta, 1.0, steps, self.sanitizer.sample_rate
        )

    # -- Lightning --------------------------------------------------------------------------
    @override
    def setup(self, stage: str) -> None:
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is None and self.private and stage == "fit":
            raise ValueError(
                f"private {type(self).__name__} trains on a datamodule implementing "
                "CentralPrivateData (e.g. CentralDPDataModule), which states its sample rate "
                "and sampling seed: pass datamodule=..., not train_dataloaders"
            )
        if datamodule is None or self.bind_private_data(datamodule):
            return
        shape = self.check_central_data(datamodule)
        if self.private:
            self.sample_rate = float(datamodule.sample_rate)
            # Masks from a public seed are known: no amplification by sampling is claimed.
            self.poisson_seed_is_public = datamodule.seed is not None
            self.sanitizer.sample_rate = 1.0 if self.poisson_seed_is_public else self.sample_rate
            if self.target_epsilon is not None:
                self._calibrate(datamodule)
        if self.num_cross is None:
            self.num_cross = max(1, round(float(datamodule.expected_real_batch)))
        self.build_central_loss(datamodule, shape)

    @override
    def on_train_start(self) -> None:
        if not self.private:
            return
        warn_if_unaccounted(self)
        if self.trainer.precision == "16-mixed":
            raise ValueError(
                "precision='16-mixed' scales the loss (float16 loss scaling), so the sanitizer "
                f"would clip the scaled gradient; train private {type(self).__name__} with "
                "'bf16-mixed' or '32-true'"
            )
        sampler = getattr(self.trainer.train_dataloader, "sampler", None)
        if not isinstance(sampler, PoissonBatchSampler):
            raise TypeError(
                f"{type(self).__name__} (private) must train on a Poisson-sampled loader "
                f"(PoissonBatchSampler, e.g. CentralDPDataModule), got "
                f"sampler={type(sampler).__name__}"
            )
        if sampler.sample_rate != self.sample_rate:
            raise ValueError(
                f"the training loader samples at rate {sampler.sample_rate!r} but the sanitizer "
                f"accounts sample_rate={self.sample_rate!r}; they must match"
            )

    @override
    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        real = batch[0]
        real_labels = batch[1] if self.conditional and len(batch) > 1 else None
        total = self.generated_rows()
        z = self.sample_latent(total)
        labels = self.sample_labels(total) if self.conditional else None
        # The generator runs in the trainer's precision; the loss, its gradient G and the
        # release G̃ in at least float32 (docs/performance.md#mixed-precision).
        fake = upcast(self.generate(z, labels))
        if self.private and fake.requires_grad:
            rank, rows = int(self.global_rank), self.sanitized_rows
            fake.register_hook(lambda grad: self.sanitizer(grad, rows, rank=rank))
        loss = self.central_loss(fake, labels, real.to(fake.dtype), real_labels)
        if not self.private:  # the loss depends on the real batch: never logged when private
            rows = self.sanitized_rows
            self.log("train/loss", loss, prog_bar=True, batch_size=rows, sync_dist=True)
        return loss
