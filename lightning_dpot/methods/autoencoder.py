"""Stage 1 of the DP sliced-Wasserstein flow: an autoencoder trained on the public split only.

Sebag et al. 2023, §5 / App. C: the autoencoder is trained on ``X_pub`` and never sees ``X_priv``;
its encoder maps records to ℓ2-normalized latents on which the DP flow runs. Training is ordinary
(non-private) minimisation of the reconstruction error

    L(x) = mean ‖D(E(x)) − x‖²   (``loss="mse"``)   or
    L(x) = BCE((D(E(x)) + 1)/2, (x + 1)/2)   (``loss="bce"``, pixels mapped to [0, 1]),

and costs no privacy because only public records are used: records trained on without noise,
which the datamodule (``PublicSplitDataModule``) enters in the
privacy ledger as a public use before serving them, refusing records released privately before
(``public_reuse``, ``lightning_dpot.data.ledger_public``). Its public/private split is written
into every checkpoint under ``"public_private_split"``; stage 2 refuses to start if its split
differs.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor
from typing_extensions import override

from lightning_dpot.data.protocols import PublicData, require_data
from lightning_dpot.data.split import SPLIT_CHECKPOINT_KEY
from lightning_dpot.generative import Generative
from lightning_dpot.nn.autoencoder import Autoencoder

__all__ = ["AutoencoderModule"]


class AutoencoderModule(L.LightningModule, Generative):
    """Trains ``autoencoder`` on the public split (module docstring).

    Args:
        autoencoder: e.g. ``ConvAutoencoder32``.
        loss: ``"mse"`` or ``"bce"``.
        lr: Adam learning rate.
    """

    def __init__(
        self, autoencoder: Autoencoder, loss: Literal["mse", "bce"] = "mse", lr: float = 1e-3
    ) -> None:
        super().__init__()
        if loss not in ("mse", "bce"):
            raise ValueError(f"loss must be 'mse' or 'bce', got {loss!r}")
        self.save_hyperparameters(ignore=["autoencoder"])
        self.autoencoder = autoencoder
        self.loss = loss
        self.lr = lr

    @property
    def latent_dim(self) -> int:
        return int(self.autoencoder.latent_dim)

    @override
    def forward(self, x: Tensor) -> Tensor:
        return self.autoencoder(x)

    def reconstruction_loss(self, x: Tensor) -> Tensor:
        recon = self.autoencoder(x)
        if self.loss == "mse":
            return F.mse_loss(recon, x)
        return F.binary_cross_entropy((recon + 1) / 2, ((x + 1) / 2).clamp(0, 1))

    @override
    def setup(self, stage: str) -> None:
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        if datamodule is not None:
            require_data(datamodule, PublicData, "AutoencoderModule (public split only)")

    @override
    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        loss = self.reconstruction_loss(batch[0])
        self.log("train/reconstruction", loss, prog_bar=True, sync_dist=True)
        return loss

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.autoencoder.parameters(), lr=self.lr)

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        datamodule = self.trainer.datamodule if self._trainer is not None else None
        split = getattr(datamodule, "split", None)
        if split is not None:
            checkpoint[SPLIT_CHECKPOINT_KEY] = split.to_dict()

    @override
    @torch.no_grad()
    def sample(self, n: int, *, generator: torch.Generator | None = None) -> Tensor:
        """Decoded random points of the latent sphere (a sanity view of the decoder, not a
        generative model)."""
        device = self.device if generator is None else generator.device
        z = torch.randn((n, self.latent_dim), generator=generator, device=device).to(self.device)
        return self.autoencoder.decode(z / z.norm(dim=1, keepdim=True)).cpu()
