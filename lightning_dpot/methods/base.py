"""Base LightningModule for generator-based methods.

A method is a short subclass. The training step of every generator method reads

    fake = release_view(G(z)),  z ~ Unif[latent_range]^latent_dim,
    loss = compute_loss(fake, real_batch),

and a subclass overrides the hooks it needs:

* :meth:`build_loss` — called once in ``setup`` with the datamodule, to build the loss from the
  public facts it declares (mechanism, noise scale, transform, diameters);
* :meth:`release_view` — maps generated records into the domain the loss compares in
  (identity, the DCT domain, or, for the noisy-WGAN baseline, through the mechanism);
* :meth:`compute_loss` — the loss between generated and real batches.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_dpot.data.protocols import LocalDPRelease, require_data
from lightning_dpot.generative import Generative
from lightning_dpot.ot.sinkhorn import SinkhornInfo


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
        lr: Adam learning rate (a LightningCLI ``optimizer:`` entry overrides the optimizer).
        generated_batch_size: generated samples per step (default: the real batch size).
    """

    def __init__(
        self,
        generator: nn.Module,
        latent_range: tuple[float, float] = (-1.0, 1.0),
        lr: float = 1e-4,
        generated_batch_size: int | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["generator"])
        if not latent_range[1] > latent_range[0]:
            raise ValueError(
                f"latent_range must be (low, high) with high > low, got {latent_range}"
            )
        self.generator = generator
        self.latent_range = tuple(latent_range)
        self.lr = lr
        self.generated_batch_size = generated_batch_size
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

    # -- Lightning --------------------------------------------------------------------------
    @override
    def setup(self, stage: str) -> None:
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is None or self.loss_fn is not None:
            return
        require_data(datamodule, LocalDPRelease, type(self).__name__)
        self.transform = datamodule.transform
        shape = tuple(datamodule.sample_shape)
        with torch.no_grad():
            out = self.generator(torch.zeros(1, self.generator.latent_dim))
        if tuple(out.shape[1:]) != shape:
            raise ValueError(
                f"the generator outputs records of shape {tuple(out.shape[1:])}, but the data "
                f"has shape {shape}; set the generator's output shape to match"
            )
        self.loss_fn = self.build_loss(datamodule)

    @override
    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        real = batch[0]
        n = self.generated_batch_size or real.shape[0]
        fake = self.release_view(self(self.sample_latent(n)))
        loss = self.compute_loss(fake, real)
        self.log("train/loss", loss, prog_bar=True, sync_dist=True)
        return loss

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.generator.parameters(), lr=self.lr)
