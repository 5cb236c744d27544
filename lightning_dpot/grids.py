"""Image grids of samples and the figure writer, shared by the methods, the callbacks and the
commands."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

__all__ = [
    "ImageLogger",
    "images_to_grid",
    "images_to_unit_range",
    "is_image_batch",
    "save_figure",
]


@runtime_checkable
class ImageLogger(Protocol):
    """A logger that takes images (Lightning's ``WandbLogger`` and the project's
    ``WandbRunLogger`` do)."""

    def log_image(self, key: str, images: list[Any], step: int | None = None) -> None: ...


def is_image_batch(records: Tensor) -> bool:
    """Whether ``records`` are images ``(K, C, H, W)`` with C in (1, 3) (gray or RGB)."""
    return records.ndim == 4 and records.shape[1] in (1, 3)


def images_to_unit_range(images: Tensor, low: float = -1.0, high: float = 1.0) -> Tensor:
    """Images with values in [low, high] → [0, 1] on the CPU, what PNG writers take."""
    return ((images.detach().float().cpu() - low) / (high - low)).clamp(0.0, 1.0)


def images_to_grid(images: Tensor, nrow: int | None = None, low: float = -1.0, high: float = 1.0):
    """Images ``(K, C, H, W)`` with values in [low, high] → one grid image ``(3, H', W')`` in
    [0, 1] (``torchvision.utils.make_grid``, ``nrow`` per row, default ⌈√K⌉)."""
    from torchvision.utils import make_grid

    if not is_image_batch(images):
        raise ValueError(
            f"images must have shape (K, C, H, W) with C in (1, 3), got {tuple(images.shape)}"
        )
    nrow = nrow or math.ceil(math.sqrt(images.shape[0]))
    scaled = images_to_unit_range(images, low, high)
    return make_grid(scaled, nrow=nrow, padding=2, pad_value=1.0)


def save_figure(figure: Any, path: str | Path, dpi: int = 100) -> Path:
    """Write the matplotlib ``figure`` to ``path`` and close it. The saved canvas is grown to
    hold every title, label and legend (``bbox_inches="tight"``), so a title longer than its
    panels is never cut at the edge."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi, bbox_inches="tight", pad_inches=0.1)
    plt.close(figure)
    return path
