"""Autoencoders of Sebag et al. 2023 (App. C.1) with ℓ2-normalized latents.

The DP sliced-Wasserstein flow runs in the latent space of an autoencoder trained on public data.
Its sensitivity bound (Sebag et al. 2023, Lemma 1; see docs/dpswflow.md) needs every private
latent on the unit ball, so the encoders end with ``z = h / ‖h‖₂`` (on the unit sphere,
``‖z‖₂ = 1``). Images are in the data's declared range ``[-1, 1]``; the paper's decoders end with
a sigmoid (``[0, 1]``), mapped here to ``[-1, 1]`` by ``2·sigmoid − 1`` so that the decoder's
output is in the data's domain.

* ``ConvAutoencoder32`` — 32×32 (MNIST / Fashion-MNIST padded from 28×28), latent 8, the
  architecture of Liutkus et al. (2019) used by Sebag et al. 2023: encoder convs (out, kernel,
  stride, padding) = (3,3,1,1), (32,4,2,0), (32,3,1,1), (32,3,1,1) + ReLU, linear to the bottleneck,
  normalise; decoder linear to 8192 = 32×16×16, convs (32,3,1,1), (32,3,1,1), a transposed conv
  (32,2,2,0) that upsamples 16→32 (the paper lists it among "convolution layers"; a plain conv with
  stride 2 would give 8×8), then a (C,3,1,1) conv; ReLU after each but the last, sigmoid.
* ``DCGANAutoencoder64`` — 64×64 CelebA, DCGAN-style: encoder convs (64,3,1,1),
  (128,4,2,1), (256,4,2,1), (512,4,2,1) + LeakyReLU(0.2), linear, normalise; decoder transposed
  convs (512,4,1,0), (256,4,2,1), (128,4,2,1), (64,4,2,1) each + LeakyReLU + BatchNorm (the
  paper's order), then a final (C,4,2,1) transposed conv to 64×64 (the paper's four layers end at
  32×32) and a sigmoid.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = [
    "Autoencoder",
    "ConvAutoencoder32",
    "DCGANAutoencoder64",
    "DecoderGenerator",
    "l2_normalize",
]


def l2_normalize(h: Tensor, eps: float = 1e-12) -> Tensor:
    """Rows onto the unit sphere: ``h / max(‖h‖₂, eps)``."""
    return h / torch.linalg.vector_norm(h, dim=1, keepdim=True).clamp_min(eps)


class Autoencoder(nn.Module):
    """Encoder ``x → z ∈ S^{d−1}`` and decoder ``z → x̂ ∈ [-1, 1]``; ``latent_dim`` = d."""

    latent_dim: int
    image_shape: tuple[int, int, int]
    encoder_body: nn.Module
    to_latent: nn.Module
    decoder_body: nn.Module

    def encode(self, x: Tensor) -> Tensor:
        """ℓ2-normalized latents ``(n, d)``, ``‖z_i‖₂ = 1``."""
        h = self.encoder_body(x).flatten(1)
        return l2_normalize(self.to_latent(h))

    def decode(self, z: Tensor) -> Tensor:
        """Images ``(n, C, H, W)`` in ``[-1, 1]``."""
        return 2.0 * torch.sigmoid(self.decoder_body(z)) - 1.0

    def forward(self, x: Tensor) -> Tensor:
        return self.decode(self.encode(x))


class _Reshape(nn.Module):
    def __init__(self, *shape: int) -> None:
        super().__init__()
        self.shape = shape

    def forward(self, x: Tensor) -> Tensor:
        return x.view(x.shape[0], *self.shape)


class ConvAutoencoder32(Autoencoder):
    """Sebag et al. 2023, App. C.1 autoencoder for ``channels × 32 × 32`` images (module docstring).

    Args:
        latent_dim: bottleneck size d (paper: 8).
        channels: image channels (1 for MNIST / Fashion-MNIST).
    """

    def __init__(self, latent_dim: int = 8, channels: int = 1) -> None:
        super().__init__()
        if latent_dim < 1 or channels < 1:
            raise ValueError(
                f"latent_dim and channels must be >= 1, got {latent_dim!r} and {channels!r}"
            )
        self.latent_dim = int(latent_dim)
        self.image_shape = (int(channels), 32, 32)
        self.encoder_body = nn.Sequential(
            nn.Conv2d(channels, 3, 3, 1, 1),
            nn.ReLU(),
            nn.Conv2d(3, 32, 4, 2, 0),  # 32 → 15
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, 1, 1),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, 1, 1),
            nn.ReLU(),
        )
        self.to_latent = nn.Linear(32 * 15 * 15, latent_dim)
        self.decoder_body = nn.Sequential(
            nn.Linear(latent_dim, 8192),
            nn.ReLU(),
            _Reshape(32, 16, 16),
            nn.Conv2d(32, 32, 3, 1, 1),
            nn.ReLU(),
            nn.Conv2d(32, 32, 3, 1, 1),
            nn.ReLU(),
            nn.ConvTranspose2d(32, 32, 2, 2, 0),  # 16 → 32
            nn.ReLU(),
            nn.Conv2d(32, channels, 3, 1, 1),
        )


class DCGANAutoencoder64(Autoencoder):
    """Sebag et al. 2023, App. C.1 DCGAN-style autoencoder for ``channels × 64 × 64`` (CelebA).

    Args:
        latent_dim: bottleneck size d.
        channels: image channels (3 for CelebA).
        width: base number of filters (paper: 64).
    """

    def __init__(self, latent_dim: int = 32, channels: int = 3, width: int = 64) -> None:
        super().__init__()
        if latent_dim < 1 or channels < 1 or width < 1:
            raise ValueError(
                f"latent_dim, channels and width must be >= 1, got {latent_dim!r}, "
                f"{channels!r}, {width!r}"
            )
        self.latent_dim = int(latent_dim)
        self.image_shape = (int(channels), 64, 64)
        w = int(width)
        self.encoder_body = nn.Sequential(
            nn.Conv2d(channels, w, 3, 1, 1),
            nn.LeakyReLU(0.2),
            nn.Conv2d(w, 2 * w, 4, 2, 1),  # 32
            nn.LeakyReLU(0.2),
            nn.Conv2d(2 * w, 4 * w, 4, 2, 1),  # 16
            nn.LeakyReLU(0.2),
            nn.Conv2d(4 * w, 8 * w, 4, 2, 1),  # 8
            nn.LeakyReLU(0.2),
        )
        self.to_latent = nn.Linear(8 * w * 8 * 8, latent_dim)
        self.decoder_body = nn.Sequential(
            _Reshape(latent_dim, 1, 1),
            nn.ConvTranspose2d(latent_dim, 8 * w, 4, 1, 0),  # 4
            nn.LeakyReLU(0.2),
            nn.BatchNorm2d(8 * w),
            nn.ConvTranspose2d(8 * w, 4 * w, 4, 2, 1),  # 8
            nn.LeakyReLU(0.2),
            nn.BatchNorm2d(4 * w),
            nn.ConvTranspose2d(4 * w, 2 * w, 4, 2, 1),  # 16
            nn.LeakyReLU(0.2),
            nn.BatchNorm2d(2 * w),
            nn.ConvTranspose2d(2 * w, w, 4, 2, 1),  # 32
            nn.LeakyReLU(0.2),
            nn.BatchNorm2d(w),
            nn.ConvTranspose2d(w, channels, 4, 2, 1),  # 64
        )


class DecoderGenerator(nn.Module):
    """A generator with the decoder's architecture (the DPSWgen baseline of Sebag et al. 2023, §5):
    ``u ~ N(0, I_latent_dim) → image in [-1, 1]``, a fresh, independently initialised decoder.

    Args:
        architecture: ``"conv32"`` (``ConvAutoencoder32``) or ``"dcgan64"``
            (``DCGANAutoencoder64``).
        latent_dim: input size.
        channels: image channels.
    """

    def __init__(
        self, architecture: str = "conv32", latent_dim: int = 8, channels: int = 1
    ) -> None:
        super().__init__()
        builders = {"conv32": ConvAutoencoder32, "dcgan64": DCGANAutoencoder64}
        if architecture not in builders:
            raise ValueError(f"architecture must be one of {list(builders)}, got {architecture!r}")
        self.latent_dim = int(latent_dim)
        self.body = builders[architecture](latent_dim=latent_dim, channels=channels).decoder_body

    def forward(self, u: Tensor) -> Tensor:
        return 2.0 * torch.sigmoid(self.body(u)) - 1.0
