"""Image grids of samples, shared by the methods, the callbacks and the commands."""

from __future__ import annotations

import math
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

__all__ = ["ImageLogger", "images_to_grid"]


@runtime_checkable
class ImageLogger(Protocol):
    """A logger that takes images (Lightning's ``WandbLogger`` and the project's
    :class:`~lightning_dpot.loggers.WandbRunLogger` do)."""

    def log_image(self, key: str, images: list[Any], step: int | None = None) -> None: ...


def images_to_grid(images: Tensor, nrow: int | None = None, low: float = -1.0, high: float = 1.0):
    """Images ``(K, C, H, W)`` with values in [low, high] → one grid image ``(3, H', W')`` in
    [0, 1] (``torchvision.utils.make_grid``, ``nrow`` per row, default ⌈√K⌉)."""
    from torchvision.utils import make_grid

    if images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(
            f"images must have shape (K, C, H, W) with C in (1, 3), got {tuple(images.shape)}"
        )
    nrow = nrow or math.ceil(math.sqrt(images.shape[0]))
    scaled = ((images.detach().float().cpu() - low) / (high - low)).clamp(0.0, 1.0)
    return make_grid(scaled, nrow=nrow, padding=2, pad_value=1.0)
