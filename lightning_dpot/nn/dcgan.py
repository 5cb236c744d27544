"""DCGAN generators (Radford, Metz, Chintala 2015) as used in Reshetova et al. 2024 and
Cao et al. 2021.

- ``DCGANGenerator``: the image generator of Reshetova et al. 2024, §IV-B (latent 100, tanh
  output), with a switch to remove batch normalization (§IV-F), for any image side of the form
  s = base·2^k (28 = 7·2², 32 = 4·2³, 64 = 4·2⁴).
- ``ConditionalDCGANGenerator``: the class-conditional generator of DP-Sinkhorn
  (Cao et al. 2021, App. D.3): latent 12 + class embedding 4 → 256×7×7 → [128, 64, 1] channels.

The latent distribution belongs to the training module (``latent_range`` of
``base``): Reshetova et al. 2024 use Unif[0, 1]^100 for the DCGAN,
and the official DP-Sinkhorn code draws Unif[0, 1]^12 (``torch.rand``). Each generator records
the paper's choice in ``paper_latent_range`` and its input size in ``latent_dim``.

Every forward returns images of shape (B, C, H, W) in [−1, 1] (tanh output), matching the
declared bounds of the image sources in ``lightning_dpot.data.images``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_dpot.checks import check_positive_int


def dcgan_init(module: nn.Module) -> None:
    """DCGAN initialization (Radford et al. 2015, §4): conv weights N(0, 0.02²), batch-norm
    scales N(1, 0.02²), biases 0. Apply with ``model.apply(dcgan_init)``."""
    if isinstance(module, (nn.ConvTranspose2d, nn.Conv2d)):
        nn.init.normal_(module.weight, 0.0, 0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.BatchNorm2d):
        nn.init.normal_(module.weight, 1.0, 0.02)
        nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, 0.0, 1.0)


class LatentProjection(nn.ConvTranspose2d):
    """The first transposed convolution of a DCGAN, from a 1 × 1 input (stride 1, no padding):
    out[b, o, i, j] = Σ_c z[b, c] W[c, o, i, j] (+ bias_o), computed as one matrix product.

    Same parameters (and state-dict keys) as ``nn.ConvTranspose2d`` and the same values; oneDNN's
    transposed convolution takes about 4× longer forward + backward on this shape (70 × 16 →
    256 × 7 × 7 on one CPU thread, ``benchmarks/bench_dp_sinkhorn_step.py``). Other inputs go
    through the convolution."""

    def forward(self, z: Tensor, output_size: list[int] | None = None) -> Tensor:
        if z.shape[-2:] != (1, 1) or self.stride != (1, 1) or self.padding != (0, 0):
            return super().forward(z, output_size)
        out = (z.flatten(1) @ self.weight.flatten(1)).view(z.shape[0], -1, *self.kernel_size)
        return out if self.bias is None else out + self.bias[:, None, None]


def _up_block(
    in_channels: int, out_channels: int, kernel: int, stride: int, padding: int, batch_norm: bool
) -> list[nn.Module]:
    """ConvTranspose2d → [BatchNorm2d] → ReLU; the conv has no bias when batch norm follows
    (the norm's shift replaces it). From a 1 × 1 input (``kernel`` = the output side, stride 1)
    the conv is a ``LatentProjection``."""
    conv = LatentProjection if (stride, padding) == (1, 0) else nn.ConvTranspose2d
    layers: list[nn.Module] = [
        conv(in_channels, out_channels, kernel, stride, padding, bias=not batch_norm)
    ]
    if batch_norm:
        layers.append(nn.BatchNorm2d(out_channels))
    layers.append(nn.ReLU(inplace=True))
    return layers


def dcgan_base_size(image_size: int) -> tuple[int, int]:
    """(base, k) with ``image_size = base · 2^k``, k ≥ 1 as large as possible with base ≥ 4:
    28 → (7, 2), 32 → (4, 3), 64 → (4, 4)."""
    image_size = check_positive_int("image_size", image_size)
    base, k = image_size, 0
    while base % 2 == 0 and base // 2 >= 4:
        base, k = base // 2, k + 1
    if k == 0:
        raise ValueError(
            "image_size must be base·2^k with k >= 1 and base >= 4 (an even number >= 8, "
            f"e.g. 28, 32, 64), got {image_size!r}"
        )
    return base, k


class DCGANGenerator(nn.Module):
    """DCGAN generator z ∈ R^latent_dim → image (channels, image_size, image_size) in [−1, 1].

    Architecture (Radford et al. 2015, the generator of Reshetova et al. 2024, §IV-B), with
    ``image_size = base · 2^k`` (``dcgan_base_size``) and h = ``hidden_channels``:

        z (latent_dim×1×1) → ConvT(kernel base) → h·2^(k−1) × base × base
          → k−1 × [ConvT(4, stride 2, pad 1), halving channels] → h × s/2 × s/2
          → ConvT(4, stride 2, pad 1) → channels × s × s → tanh,

    each hidden ConvT followed by BatchNorm2d (unless ``batch_norm=False``, Reshetova et al. 2024,
    §IV-F: "we removed the batch normalization layers") and ReLU. Defaults give, for 28×28 MNIST,
    100 → 256×7×7 → 128×14×14 → 1×28×28, and for 64×64 the original DCGAN
    100 → 1024×4×4 → 512×8×8 → 256×16×16 → 128×32×32 → 3×64×64.

    Batch norm couples the samples of a generated batch; that is harmless for privacy (the
    generator never sees data) but makes a sample depend on its batch in training mode.

    Args:
        latent_dim: size of z (Reshetova et al. 2024: 100, with z ~ Unif[0, 1]^100).
        image_size: side s of the square output (28, 32, 64, …: any even s ≥ 8).
        channels: output channels (1 grayscale, 3 RGB).
        hidden_channels: channels h of the last hidden feature map (doubling towards the input).
        batch_norm: batch normalization after each hidden transposed convolution.
    """

    paper_latent_range: tuple[float, float] = (0.0, 1.0)

    def __init__(
        self,
        latent_dim: int = 100,
        image_size: int = 28,
        channels: int = 1,
        hidden_channels: int = 128,
        batch_norm: bool = True,
    ) -> None:
        super().__init__()
        self.latent_dim = check_positive_int("latent_dim", latent_dim)
        self.image_size = int(image_size)
        self.channels = check_positive_int("channels", channels)
        hidden_channels = check_positive_int("hidden_channels", hidden_channels)
        self.batch_norm = bool(batch_norm)
        base, k = dcgan_base_size(image_size)
        width = hidden_channels * 2 ** (k - 1)
        layers = _up_block(latent_dim, width, base, 1, 0, self.batch_norm)
        for _ in range(k - 1):
            layers += _up_block(width, width // 2, 4, 2, 1, self.batch_norm)
            width //= 2
        layers += [nn.ConvTranspose2d(width, self.channels, 4, 2, 1), nn.Tanh()]
        self.net = nn.Sequential(*layers)
        self.apply(dcgan_init)

    @property
    def output_shape(self) -> tuple[int, int, int]:
        return (self.channels, self.image_size, self.image_size)

    def forward(self, z: Tensor) -> Tensor:
        """z of shape (B, latent_dim) (or (B, latent_dim, 1, 1)) → images (B, C, H, W)."""
        return self.net(z.reshape(z.shape[0], self.latent_dim, 1, 1))


def check_label_shape(z: Tensor, labels: Tensor) -> None:
    """One label per latent row, or a ValueError naming both shapes."""
    if labels.shape != (z.shape[0],):
        raise ValueError(
            f"labels must have shape ({z.shape[0]},) to match z, got {tuple(labels.shape)}"
        )


class ConditionalDCGANGenerator(nn.Module):
    """Class-conditional DCGAN of DP-Sinkhorn (Cao et al. 2021, App. D.3), (z, label) → image.

    The label's learned embedding (``embed_dim``) is concatenated to z and fed to four
    transposed convolutions:

        [z, E(label)] (latent_dim + embed_dim)×1×1
          → ConvT(kernel s/4, stride 1, pad 0) → 256 × s/4 × s/4
          → ConvT(4, 2, 1) → 128 × s/2 × s/2 → ConvT(4, 2, 1) → 64 × s × s
          → ConvT(3, 1, 1) → channels × s × s → tanh,

    ReLU after each hidden layer. With s = 28 this is the paper's 256×7×7 → [128, 64, 1],
    kernels [4, 4, 3], strides [2, 2, 1], padding [1, 1, 1]. The paper text lists no
    normalization; the official code has batch norm after each hidden layer, hence the
    ``batch_norm`` switch (default on, as in the code). Paper settings: latent 12, embedding 4
    (MNIST, Fashion-MNIST); z ~ Unif[0, 1]^12 in the official code.

    Args:
        num_classes: number of labels (10 for MNIST).
        latent_dim: size of z.
        embed_dim: size of the label embedding.
        channels: output channels.
        image_size: output side s, a multiple of 4 (28 in the paper).
        hidden_channels: widths of the three hidden layers.
        batch_norm: batch normalization after each hidden transposed convolution.
    """

    paper_latent_range: tuple[float, float] = (0.0, 1.0)

    def __init__(
        self,
        num_classes: int,
        latent_dim: int = 12,
        embed_dim: int = 4,
        channels: int = 1,
        image_size: int = 28,
        hidden_channels: tuple[int, int, int] = (256, 128, 64),
        batch_norm: bool = True,
    ) -> None:
        super().__init__()
        self.num_classes = check_positive_int("num_classes", num_classes)
        self.latent_dim = check_positive_int("latent_dim", latent_dim)
        self.embed_dim = check_positive_int("embed_dim", embed_dim)
        self.channels = check_positive_int("channels", channels)
        self.image_size = check_positive_int("image_size", image_size)
        if self.image_size % 4 != 0 or self.image_size < 8:
            raise ValueError(f"image_size must be a multiple of 4 and >= 8, got {image_size!r}")
        if len(hidden_channels) != 3:
            raise ValueError(f"hidden_channels must list 3 widths, got {tuple(hidden_channels)!r}")
        h1, h2, h3 = (check_positive_int("hidden_channels", h) for h in hidden_channels)
        self.batch_norm = bool(batch_norm)
        self.embedding = nn.Embedding(self.num_classes, self.embed_dim)
        self.net = nn.Sequential(
            *_up_block(latent_dim + embed_dim, h1, self.image_size // 4, 1, 0, self.batch_norm),
            *_up_block(h1, h2, 4, 2, 1, self.batch_norm),
            *_up_block(h2, h3, 4, 2, 1, self.batch_norm),
            nn.ConvTranspose2d(h3, self.channels, 3, 1, 1),
            nn.Tanh(),
        )
        self.apply(dcgan_init)
        # Channels-last weights: oneDNN's transposed convolutions run forward + backward about
        # 12% faster on one CPU thread (benchmarks/bench_dp_sinkhorn_step.py); values unchanged.
        self.to(memory_format=torch.channels_last)

    @property
    def output_shape(self) -> tuple[int, int, int]:
        return (self.channels, self.image_size, self.image_size)

    def forward(self, z: Tensor, labels: Tensor) -> Tensor:
        """z (B, latent_dim), labels (B,) int64 in [0, num_classes) → images (B, C, H, W)."""
        check_label_shape(z, labels)
        inputs = torch.cat([z.reshape(z.shape[0], self.latent_dim), self.embedding(labels)], 1)
        return self.net(inputs[:, :, None, None])
