"""Fully connected generators (Reshetova et al. 2024, §IV-A and §IV-C)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor, nn


class MLPGenerator(nn.Module):
    """z ∈ R^latent_dim → record of shape ``output_shape``, ReLU hidden layers, linear output.

    Settings of Reshetova et al. 2024: 2-D manifolds use ``hidden=(256, 256)`` (§IV-A); the
    W2-vs-n study uses ``hidden=(500, 500)`` with a 2-D latent (§IV-C).
    ``output_activation="tanh"`` bounds the output to [−1, 1] for image data.
    """

    def __init__(
        self,
        latent_dim: int = 2,
        output_shape: Sequence[int] = (2,),
        hidden: Sequence[int] = (256, 256),
        output_activation: str | None = None,
    ) -> None:
        super().__init__()
        self.latent_dim = latent_dim
        self.output_shape = tuple(output_shape)
        widths = [latent_dim, *hidden]
        layers: list[nn.Module] = []
        for w_in, w_out in zip(widths[:-1], widths[1:], strict=True):
            layers += [nn.Linear(w_in, w_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], math.prod(self.output_shape)))
        if output_activation == "tanh":
            layers.append(nn.Tanh())
        elif output_activation is not None:
            raise ValueError(f"output_activation must be None or 'tanh', got {output_activation!r}")
        self.net = nn.Sequential(*layers)

    def forward(self, z: Tensor) -> Tensor:
        return self.net(z).reshape(z.shape[0], *self.output_shape)
