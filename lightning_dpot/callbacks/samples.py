"""Sample grids with fixed randomness, saved as PNG and sent to the logger.

Every grid is ``sample(K, generator=torch.Generator().manual_seed(seed))`` of the
:class:`~lightning_dpot.generative.Generative` protocol: the same seed at every epoch, so a
generator network shows the same latent codes G_t(z_1), …, G_t(z_K) evolving, and a particle
flow its first K particles moving (the global RNG is neither read nor advanced). Sampling is
post-processing of the trained model: no privacy cost.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from typing_extensions import override

from lightning_dpot.checks import check_positive_int
from lightning_dpot.generative import draw
from lightning_dpot.grids import ImageLogger, images_to_grid


class SampleGrid(Callback):
    """Saves ``samples_epoch{E}.png`` every ``every_n_epochs`` epochs and ``samples.png`` (the
    latest grid) in ``trainer.log_dir``, and logs the grid as ``key`` to every logger that has
    ``log_image`` (e.g. wandb).

    Works with every method (the :class:`~lightning_dpot.generative.Generative` protocol) whose
    records are images ``(K, C, H, W)`` in [−1, 1]; for non-image records it warns once and
    does nothing.

    Args:
        num_samples: K, the number of images in the grid.
        every_n_epochs: save a grid after every n-th training epoch (and always at the end).
        seed: seed of the draw, the same for every grid.
        nrow: images per grid row (default ⌈√K⌉).
        key: name of the logged image.
    """

    def __init__(
        self,
        num_samples: int = 64,
        every_n_epochs: int = 1,
        seed: int = 0,
        nrow: int | None = None,
        key: str = "samples",
    ) -> None:
        self.num_samples = check_positive_int("num_samples", num_samples)
        self.every_n_epochs = check_positive_int("every_n_epochs", every_n_epochs)
        self.seed = int(seed)
        self.nrow = None if nrow is None else check_positive_int("nrow", nrow)
        self.key = key
        self._last_saved_step: int | None = None
        self._disabled = False

    def generate(self, pl_module: L.LightningModule) -> Tensor:
        """The K samples of the fixed seed (the module's train/eval mode is kept)."""
        generator = torch.Generator().manual_seed(self.seed)
        images, _ = draw(pl_module, self.num_samples, generator=generator)
        return images

    def save_grid(self, trainer: L.Trainer, pl_module: L.LightningModule, tag: str) -> Path | None:
        """Write ``samples_{tag}.png`` and ``samples.png``; log the grid. Rank 0 only."""
        # trainer.log_dir broadcasts under DDP: every rank reads it before the rank check.
        log_dir = Path(trainer.log_dir or trainer.default_root_dir)
        if self._disabled or not trainer.is_global_zero:
            return None
        from torchvision.utils import save_image

        images = self.generate(pl_module)
        if images.ndim != 4 or images.shape[1] not in (1, 3):
            warnings.warn(
                f"SampleGrid: records of shape {tuple(images.shape[1:])} are not images "
                "(C, H, W) with C in (1, 3); no sample grids will be saved",
                stacklevel=2,
            )
            self._disabled = True
            return None
        grid = images_to_grid(images, self.nrow)
        log_dir.mkdir(parents=True, exist_ok=True)
        path = log_dir / f"samples_{tag}.png"
        save_image(grid, path)
        save_image(grid, log_dir / "samples.png")
        for logger in trainer.loggers:
            if isinstance(logger, ImageLogger):
                logger.log_image(key=self.key, images=[grid], step=trainer.global_step)
        self._last_saved_step = trainer.global_step
        return path

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch
        if (epoch + 1) % self.every_n_epochs == 0:
            self.save_grid(trainer, pl_module, f"epoch{epoch}")

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._last_saved_step != trainer.global_step:
            self.save_grid(trainer, pl_module, f"epoch{trainer.current_epoch}")
