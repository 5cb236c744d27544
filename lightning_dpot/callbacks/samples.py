"""Sample grids with fixed randomness, saved as PNG and sent to the logger.

Every grid is ``sample(K, generator=torch.Generator().manual_seed(seed))`` of the
``Generative`` protocol: the same seed at every epoch, so a
generator network shows the same latent codes G_t(z_1), …, G_t(z_K) evolving, and a particle
flow its first K particles moving (the global RNG is neither read nor advanced). Sampling is
post-processing of the trained model: no privacy cost.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from typing_extensions import override

from lightning_dpot.checks import check_positive_int
from lightning_dpot.generative import draw, record_shape
from lightning_dpot.grids import ImageLogger, images_to_grid, is_image_batch, save_figure


def _weights_signature(pl_module: L.LightningModule) -> str:
    """A digest of the module's parameters: equal while the weights are unchanged (drawing
    samples does not move them, even where it updates batch-norm statistics), different once a
    callback has replaced them; the same on every DDP rank."""
    digest = hashlib.sha1()
    for parameter in pl_module.parameters():
        digest.update(parameter.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _is_point_batch(samples: Tensor) -> bool:
    """Whether ``samples`` are 2-D points ``(K, 2)``."""
    return samples.ndim == 2 and samples.shape[1] == 2


class SampleGrid(Callback):
    """Saves ``samples_epoch{E}.png`` every ``every_n_epochs`` epochs and ``samples.png`` (the
    latest) in ``trainer.log_dir``, and logs it as ``key`` to every logger that has
    ``log_image`` (e.g. wandb). Image records ``(C, H, W)`` with C in (1, 3) and values in
    [−1, 1] make an image grid; 2-D records (x₁, x₂) a scatter plot.

    Works with every method (the ``Generative`` protocol) whose
    records are images or 2-D points; any other record shape is refused when fitting starts.

    Args:
        num_samples: K, the number of images in the grid (points in the scatter plot).
        every_n_epochs: save a grid after every n-th training epoch, and at the end whenever the
            model differs from the last grid's.
        seed: seed of the draw, the same for every grid.
        nrow: images per grid row (default ⌈√K⌉).
        key: name of the logged image.

    Raises:
        ValueError: at fit start, when the method's records are neither images nor 2-D points.

    Example::

        >>> import lightning as L
        >>> from lightning_dpot.callbacks import SampleGrid
        >>> grid = SampleGrid(num_samples=16, every_n_epochs=5)
        >>> trainer = L.Trainer(callbacks=[grid], logger=False, enable_progress_bar=False)
        >>> grid in trainer.callbacks
        True
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
        self._last_saved: tuple[int, str] | None = None  # (step, weights)

    def generate(self, pl_module: L.LightningModule) -> Tensor:
        """The K samples of the fixed seed (the module's train/eval mode is kept)."""
        generator = torch.Generator().manual_seed(self.seed)
        samples, _ = draw(pl_module, self.num_samples, generator=generator)
        return samples

    @staticmethod
    def check_records(method: str, samples: Tensor) -> None:
        """Refuse, in one line, records that are neither images nor 2-D points.

        Raises:
            ValueError: naming the callback, what it draws and ``method``'s record shape.
        """
        if not (is_image_batch(samples) or _is_point_batch(samples)):
            raise ValueError(
                "SampleGrid draws image grids (records (C, H, W) with C in (1, 3)) and scatter "
                f"plots (2-D records); {method} generates records of shape "
                f"{tuple(samples.shape[1:])}"
            )

    def save_grid(self, trainer: L.Trainer, pl_module: L.LightningModule, tag: str) -> Path | None:
        """Write ``samples_{tag}.png`` and ``samples.png``; log the picture. Rank 0 only.

        Raises:
            ValueError: the records are neither images nor 2-D points.
        """
        # trainer.log_dir broadcasts under DDP: every rank reads it before the rank check.
        log_dir = Path(trainer.log_dir or trainer.default_root_dir)
        self._last_saved = (trainer.global_step, _weights_signature(pl_module))
        if not trainer.is_global_zero:
            return None
        samples = self.generate(pl_module)
        self.check_records(type(pl_module).__name__, samples)
        path = log_dir / f"samples_{tag}.png"
        if is_image_batch(samples):
            from torchvision.utils import save_image

            path.parent.mkdir(parents=True, exist_ok=True)
            save_image(images_to_grid(samples, self.nrow), path)
        else:
            self._save_scatter(samples, path, f"samples at step {trainer.global_step}")
        shutil.copyfile(path, log_dir / "samples.png")
        for logger in trainer.loggers:
            if isinstance(logger, ImageLogger):
                logger.log_image(key=self.key, images=[str(path)], step=trainer.global_step)
        return path

    @staticmethod
    def _save_scatter(points: Tensor, path: Path, title: str) -> None:
        """The 2-D ``points`` as a scatter plot (equal axes) in ``path``."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(4, 4))
        ax.scatter(points[:, 0], points[:, 1], s=4)
        ax.set_aspect("equal", adjustable="datalim")
        ax.set_title(title)
        save_figure(fig, path)

    def check_before_release(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Refuse a method whose records get no picture, before the datamodule releases
        anything (``check_before_release``)."""
        empty = torch.empty(0, *record_shape(pl_module))  # no records, the method's shape
        self.check_records(type(pl_module).__name__, empty)

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The same check, for a datamodule that released nothing before the fit."""
        self.check_before_release(trainer, pl_module)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        epoch = trainer.current_epoch
        if (epoch + 1) % self.every_n_epochs == 0:
            self.save_grid(trainer, pl_module, f"epoch{epoch}")

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The final model's grid, unless the last grid already shows it. A fit that ends
        between epochs gets ``samples_epoch{E}.png``; weights replaced after the last epoch's
        grid (Lightning's ``EMAWeightAveraging`` copies its average in at ``on_train_end``) get
        ``samples_final.png``, so ``samples.png`` is always the model the run leaves."""
        state = (trainer.global_step, _weights_signature(pl_module))
        if self._last_saved == state:
            return
        same_step = self._last_saved is not None and self._last_saved[0] == state[0]
        tag = "final" if same_step else f"epoch{trainer.current_epoch}"
        self.save_grid(trainer, pl_module, tag)
