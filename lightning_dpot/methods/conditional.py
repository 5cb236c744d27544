"""Generator modules that may be class-conditional, G(z, y), trained on central-DP data.

The sampling half of a class-conditional method (Cao et al. 2021, Algorithm 1; Harder et al.
2021): labels y ~ Unif{0, …, L−1} drawn before z, balanced label blocks for sample grids, and
the standalone sampler of ``export_generator``. Generation is
post-processing of what the method released and costs no privacy.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_dpot.data.protocols import CentralPrivateData, require_data
from lightning_dpot.methods.base import GeneratorModule
from lightning_dpot.nn.samplers import ConditionalGeneratorSampler, LatentSampler

__all__ = ["ConditionalGeneratorModule"]


class ConditionalGeneratorModule(GeneratorModule):
    """A ``GeneratorModule`` whose generator is ``(z, labels) → records`` when
    ``conditional``, else ``z → records``.

    Args:
        generator: e.g. ``ConditionalDCGANGenerator`` when
            ``conditional`` (it must have ``num_classes``).
        conditional: class-conditional generation (labels from the data source).
        **kwargs: ``GeneratorModule``'s (``latent_range``, ``lr``, ...).

    Raises:
        ValueError: ``conditional=True`` with a generator that has no ``num_classes``.
    """

    def __init__(self, generator: nn.Module, conditional: bool = True, **kwargs: Any) -> None:
        super().__init__(generator, **kwargs)
        self.conditional = bool(conditional)
        self.num_classes: int | None = None
        if self.conditional and not hasattr(generator, "num_classes"):
            raise ValueError(
                f"conditional=True needs a generator with num_classes and forward(z, labels), "
                f"got {type(generator).__name__}"
            )

    def sample_labels(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        """l_i ~ Unif{0, …, L−1} (Algorithm 1), on the module's device, drawn from
        ``generator`` (on its own device) when given."""
        assert self.num_classes is not None
        if generator is None:
            return torch.randint(self.num_classes, (n,), device=self.device)
        labels = torch.randint(self.num_classes, (n,), generator=generator, device=generator.device)
        return labels.to(self.device)

    def balanced_labels(self, n: int) -> Tensor:
        """Labels ``⌊i·L/n⌋``, i < n: contiguous equal blocks, one per class (grid rows)."""
        assert self.num_classes is not None
        return torch.arange(n, device=self.device) * self.num_classes // max(n, 1)

    def generate(self, z: Tensor, labels: Tensor | None) -> Tensor:
        """G(z, labels) when conditional, else G(z), in the trainer's precision."""
        return self.generator(z, labels) if self.conditional else self.generator(z)

    @override
    def forward(self, z: Tensor, labels: Tensor | None = None) -> Tensor:
        """Images for latents ``z``; conditional models take ``labels`` (default
        ``balanced_labels``, so that a grid with L images per row shows one class per row)."""
        if not self.conditional:
            return self.generator(z)
        if labels is None:
            if self.num_classes is None:
                self.num_classes = int(self.generator.num_classes)
            labels = self.balanced_labels(z.shape[0])
        return self.generator(z, labels.to(z.device))

    @override
    @torch.no_grad()
    def sample_labeled(
        self, n: int, *, generator: torch.Generator | None = None, batch_size: int = 10_000
    ) -> tuple[Tensor, Tensor]:
        """``n`` images with uniform random labels, on the CPU (post-processing, no privacy
        cost), for downstream-utility evaluation (Cao et al. 2021, App. D.2)."""
        if not self.conditional:
            return super().sample_labeled(n, generator=generator)
        if self.num_classes is None:
            self.num_classes = int(self.generator.num_classes)
        was_training = self.training
        self.eval()
        images, labels = [], []
        try:
            for i in range(0, n, batch_size):
                k = min(batch_size, n - i)
                lab = self.sample_labels(k, generator)
                images.append(self(self.sample_latent(k, generator), lab).cpu())
                labels.append(lab.cpu())
        finally:
            self.train(was_training)
        return torch.cat(images), torch.cat(labels)

    @override
    def standalone_sampler(self) -> LatentSampler:
        """G(z, y) with y ~ Unif{0, …, L−1} and z ~ Unif[latent_range]^latent_dim when
        conditional (``export_generator``), else G(z)."""
        if not self.conditional:
            return super().standalone_sampler()
        low, high = self.latent_range
        num_classes = self.num_classes or int(self.generator.num_classes)
        latent_dim = self.generator.latent_dim
        return ConditionalGeneratorSampler(
            self.generator, num_classes, latent_dim, "uniform", low, high
        )

    @override
    def check_data(self, datamodule: Any) -> None:
        """``check_central_data``, the check the central methods' ``setup`` runs, asked
        before a datamodule releases anything
        (``ChecksDataBeforeRelease``)."""
        self.check_central_data(datamodule)

    def check_central_data(self, datamodule: Any) -> tuple[int, ...]:
        """Check ``datamodule`` (a ``CentralPrivateData``,
        set up here) against the generator: labels when conditional, the same number of
        classes, the same record shape. Sets ``num_classes``; returns the record shape.

        Raises:
            TypeError: not a ``CentralPrivateData``.
            ValueError: naming the mismatch.
        """
        require_data(datamodule, CentralPrivateData, type(self).__name__)
        datamodule.setup("fit")  # idempotent; the rate may depend on N (expected_batch_size)
        shape = tuple(datamodule.sample_shape)
        if self.conditional:
            if datamodule.num_classes is None:
                raise ValueError(
                    "conditional=True but the data source declares no labels (num_classes=None)"
                )
            if int(self.generator.num_classes) != int(datamodule.num_classes):
                raise ValueError(
                    f"generator.num_classes={self.generator.num_classes} must equal the data's "
                    f"num_classes={datamodule.num_classes}"
                )
            self.num_classes = int(datamodule.num_classes)
        self.check_output_shape(shape)
        return shape
