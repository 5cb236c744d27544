"""Base LightningModule for generator-based methods.

A method is a short subclass. The training step of every generator method reads

    fake = release_view(G(z)),  z ~ Unif[latent_range]^latent_dim,
    loss = compute_loss(fake, real_batch),

and a subclass overrides the hooks it needs:

* ``build_loss`` — called with the datamodule by ``check_data``,
  before the release is drawn (or in ``setup``), to build the loss from the public facts it
  declares (mechanism, noise scale, transform, diameters);
* ``release_view`` — maps generated records into the domain the loss compares in
  (identity, the DCT domain, or, for the noisy-WGAN baseline, through the mechanism);
* ``compute_loss`` — the loss between generated and real batches.
"""

from __future__ import annotations

from typing import Literal

import lightning as L
import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_dpot.checks import check_positive
from lightning_dpot.data.protocols import LocalDPRelease, require_data
from lightning_dpot.generative import Generative
from lightning_dpot.nn.samplers import GeneratorSampler, LatentSampler
from lightning_dpot.ot.precision import autocast_disabled, upcast
from lightning_dpot.ot.sinkhorn import SinkhornInfo

#: The generator's optimizer (``torch.optim.Adam`` or ``torch.optim.RMSprop``).
OptimizerName = Literal["adam", "rmsprop"]


def log_sinkhorn_info(module: L.LightningModule, info: SinkhornInfo | None) -> None:
    """Log the last entropic solve: sweeps at the target λ, ‖π1 − a‖₁, whether it met the
    tolerance (``sinkhorn/…``, averaged over ranks). Nothing when no entropic solve ran."""
    if info is None:
        return
    module.log("sinkhorn/iterations", float(info.iterations), sync_dist=True)
    module.log("sinkhorn/marginal_error", info.marginal_error, sync_dist=True)
    module.log("sinkhorn/converged", float(info.converged), sync_dist=True)


class GeneratorModule(L.LightningModule, Generative):
    """Trains ``generator`` by minimizing an OT loss to the (privatized) training data.

    Args:
        generator: network z → record with attribute ``latent_dim``.
        latent_range: the latent distribution is Unif[low, high]^latent_dim
            (Reshetova et al. 2024: [−1, 1] for the 2-D MLP, [0, 1] for the DCGAN).
        lr: learning rate of the generator's optimizer, the run's only one (a method builds its
            optimizer in ``configure_optimizers``; ``dpot fit`` takes no ``optimizer:`` section).
        generated_batch_size: generated samples per step (default: the real batch size).
        optimizer: ``"adam"`` or ``"rmsprop"`` (torch's defaults but ``lr`` and ``betas``;
            Reshetova et al. 2024 train the 2-D MLP of Figs. 1–2 with RMSprop, lr 10⁻⁴).
        betas: Adam's (β₁, β₂); ``None``: torch's (0.9, 0.999). Adam only.

    Raises:
        ValueError: ``latent_range`` not increasing, ``lr`` ≤ 0, an unknown ``optimizer``, or
            ``betas`` with ``optimizer="rmsprop"``.
    """

    def __init__(
        self,
        generator: nn.Module,
        latent_range: tuple[float, float] = (-1.0, 1.0),
        lr: float = 1e-4,
        generated_batch_size: int | None = None,
        optimizer: OptimizerName = "adam",
        betas: tuple[float, float] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["generator"])
        if not latent_range[1] > latent_range[0]:
            raise ValueError(
                f"latent_range must be (low, high) with high > low, got {latent_range}"
            )
        if optimizer not in ("adam", "rmsprop"):
            raise ValueError(f"optimizer must be 'adam' or 'rmsprop', got {optimizer!r}")
        if betas is not None and optimizer != "adam":
            raise ValueError(
                f"betas are Adam's: optimizer={optimizer!r} takes none, got betas={betas}"
            )
        self.generator = generator
        self.latent_range = tuple(latent_range)
        self.lr = check_positive("lr", lr)
        self.generated_batch_size = generated_batch_size
        self.optimizer_name = optimizer
        self.betas = None if betas is None else (float(betas[0]), float(betas[1]))
        self.loss_fn: nn.Module | None = None

    # -- hooks ------------------------------------------------------------------------------
    def build_loss(self, datamodule: L.LightningDataModule) -> nn.Module:
        raise NotImplementedError

    def release_view(self, samples: Tensor) -> Tensor:
        """Generated records ``(n, *sample_shape)`` → vectors in the loss's domain ``(n, m)``."""
        return self.transform.forward(samples)

    def compute_loss(self, fake: Tensor, real: Tensor) -> Tensor:
        assert self.loss_fn is not None
        return self.loss_fn(fake, real)

    # -- generation -------------------------------------------------------------------------
    def sample_latent(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """z ~ Unif[latent_range]^latent_dim on the module's device, drawn from ``generator``
        (on its own device) when given, else from the global RNG."""
        low, high = self.latent_range
        if generator is None:
            z = torch.rand(n, self.generator.latent_dim, device=self.device)
        else:
            shape = (n, self.generator.latent_dim)
            z = torch.rand(shape, generator=generator, device=generator.device).to(self.device)
        return low + (high - low) * z

    @override
    def forward(self, z: Tensor) -> Tensor:
        return self.generator(z)

    @override
    @torch.no_grad()
    def sample(
        self, n: int, *, generator: torch.Generator | None = None, batch_size: int = 10_000
    ) -> Tensor:
        """``n`` records G(z) on the CPU, in eval mode (post-processing: no privacy cost)."""
        was_training = self.training
        self.eval()
        try:
            out = [
                self(self.sample_latent(min(batch_size, n - i), generator)).cpu()
                for i in range(0, n, batch_size)
            ]
        finally:
            self.train(was_training)
        return torch.cat(out) if out else torch.empty(0)

    def standalone_sampler(self) -> LatentSampler:
        """G with its latent law Unif[latent_range]^latent_dim, for
        ``export_generator`` (a copy of the generator only)."""
        low, high = self.latent_range
        return GeneratorSampler(self.generator, self.generator.latent_dim, "uniform", low, high)

    # -- Lightning --------------------------------------------------------------------------
    def check_output_shape(self, shape: tuple[int, ...]) -> None:
        """Refuse a generator whose records do not have the data's record ``shape``.

        Raises:
            ValueError: naming both shapes.
        """
        was_training = self.generator.training
        self.generator.eval()
        try:
            with torch.no_grad():
                out = self(torch.zeros(2, self.generator.latent_dim, device=self.device))
        finally:
            self.generator.train(was_training)
        if tuple(out.shape[1:]) != tuple(shape):
            raise ValueError(
                f"the generator outputs records of shape {tuple(out.shape[1:])}, but the data "
                f"has shape {tuple(shape)}; set the generator's output shape to match"
            )

    def check_data(self, datamodule: L.LightningDataModule) -> None:
        """Check ``datamodule`` against this module from what it states before its release
        (``ChecksDataBeforeRelease``): a
        ``LocalDPRelease``, records of the generator's
        shape, and a loss built from its mechanism (``build_loss``), kept with the
        transform for training. ``setup`` runs it too.

        Raises:
            TypeError: not a ``LocalDPRelease``.
            ValueError: naming the mismatch.
        """
        require_data(datamodule, LocalDPRelease, type(self).__name__)
        self.check_output_shape(tuple(datamodule.sample_shape))
        self.transform = datamodule.transform
        self.loss_fn = self.build_loss(datamodule)

    @override
    def setup(self, stage: str) -> None:
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is None or self.loss_fn is not None:
            return
        self.check_data(datamodule)

    @override
    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        """The generator runs in the trainer's precision; the release view and the loss run
        outside autocast on float32 records (``lightning_dpot.ot.precision``)."""
        real = batch[0]
        n = self.generated_batch_size or real.shape[0]
        samples = self(self.sample_latent(n))
        with autocast_disabled(samples):
            fake = self.release_view(upcast(samples))
            loss = self.compute_loss(fake, real)
        self.log("train/loss", loss, prog_bar=True, sync_dist=True)
        return loss

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        parameters = self.generator.parameters()
        if self.optimizer_name == "rmsprop":
            return torch.optim.RMSprop(parameters, lr=self.lr)
        return torch.optim.Adam(parameters, lr=self.lr, betas=self.betas or (0.9, 0.999))
