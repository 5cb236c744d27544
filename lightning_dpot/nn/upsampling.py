"""The class-conditional generator of DP-MERF's image experiments (Harder et al. 2021): a small
fully connected stage, then bilinear upsampling and 5×5 convolutions."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lightning_dpot.checks import check_positive_int
from lightning_dpot.nn.dcgan import check_label_shape


class ConditionalUpsamplingGenerator(nn.Module):
    """(z, label) → image with the layout of Harder et al. (2021)'s MNIST / Fashion-MNIST generator:

        [z, one_hot(label)] → Linear → BatchNorm → ReLU → Linear → BatchNorm
          → reshape c₁ × s/4 × s/4 → bilinear ×2 → Conv 5×5 (c₂) → ReLU
          → bilinear ×2 → Conv 5×5 (channels) → 2·sigmoid − 1,

    so images lie in the package's [−1, 1] (the authors' sigmoid gives [0, 1]). The label enters
    as a one-hot vector (no learned embedding). Harder et al.'s Fashion-MNIST setting: latent 5,
    hidden 200, channels (16, 8), s = 28, z ~ N(0, I); with a uniform latent, the range
    (−√3, √3) has the same mean and variance.

    Args:
        num_classes: number of labels.
        latent_dim: size of z.
        hidden: width of the fully connected hidden layer.
        conv_channels: (c₁, c₂), the channels before the first and second convolution.
        channels: output channels.
        image_size: output side s, a multiple of 4.
    """

    def __init__(
        self,
        num_classes: int,
        latent_dim: int = 5,
        hidden: int = 200,
        conv_channels: Sequence[int] = (16, 8),
        channels: int = 1,
        image_size: int = 28,
    ) -> None:
        super().__init__()
        self.num_classes = check_positive_int("num_classes", num_classes)
        self.latent_dim = check_positive_int("latent_dim", latent_dim)
        self.channels = check_positive_int("channels", channels)
        self.image_size = check_positive_int("image_size", image_size)
        if self.image_size % 4 != 0:
            raise ValueError(f"image_size must be a multiple of 4, got {image_size!r}")
        if len(conv_channels) != 2:
            raise ValueError(f"conv_channels must list 2 widths, got {tuple(conv_channels)!r}")
        c1, c2 = (check_positive_int("conv_channels", c) for c in conv_channels)
        hidden = check_positive_int("hidden", hidden)
        side = self.image_size // 4
        self.base_shape = (c1, side, side)
        self.dense = nn.Sequential(
            nn.Linear(self.latent_dim + self.num_classes, hidden),
            nn.BatchNorm1d(hidden),
            nn.ReLU(),
            nn.Linear(hidden, c1 * side * side),
            nn.BatchNorm1d(c1 * side * side),
        )
        self.convs = nn.Sequential(
            nn.UpsamplingBilinear2d(scale_factor=2),
            nn.Conv2d(c1, c2, 5, 1, 2),
            nn.ReLU(),
            nn.UpsamplingBilinear2d(scale_factor=2),
            nn.Conv2d(c2, self.channels, 5, 1, 2),
        )

    @property
    def output_shape(self) -> tuple[int, int, int]:
        return (self.channels, self.image_size, self.image_size)

    def forward(self, z: Tensor, labels: Tensor) -> Tensor:
        """z (B, latent_dim), labels (B,) int64 in [0, num_classes) → images (B, C, s, s)."""
        check_label_shape(z, labels)
        one_hot = nn.functional.one_hot(labels, self.num_classes).to(z.dtype)  # checks the range
        h = self.dense(torch.cat([z.reshape(z.shape[0], self.latent_dim), one_hot], 1))
        return 2.0 * torch.sigmoid(self.convs(h.view(-1, *self.base_shape))) - 1.0
