"""Standalone samplers: a trained model and its sampling rule as one TorchScript-able module.

``lightning_dpot.export.export_generator`` compiles one of these with ``torch.jit.script``
and saves it; the file then samples with plain torch (``torch.jit.load(path).sample(n,
seed=0)``), without this package. Every sampler (``StandaloneSampler``) has

* ``sample(n, seed=None) -> x``: ``n`` records ``(n, *record_shape)`` on the sampler's device
  (the CPU as saved; ``.to("cuda")`` or ``torch.jit.load(..., map_location="cuda")`` moves it);
  a ``seed`` makes the draw reproducible and leaves the global RNG alone, ``None`` uses the
  global CPU RNG. The random numbers are drawn on the CPU, so a seed draws the same latents on
  every device;
* the attributes ``kind``, ``record_shape``, ``latent`` (``"uniform"``, ``"normal"`` or
  ``"none"``), ``latent_dim``, ``latent_low``/``latent_high`` (the uniform law's bounds),
  ``num_classes`` (0: unconditional) and ``max_samples`` (−1: any number).

Three kinds:

* ``GeneratorSampler``: x = G(z), z ~ Unif[low, high]^d or N(0, I_d); ``forward(z)`` is
  G(z);
* ``ConditionalGeneratorSampler``: y ~ Unif{0, …, L−1}, then z as above, x = G(z, y);
  ``sample_labeled(n, seed) -> (x, y)``, and ``forward(z, labels)``;
* ``ParticleSampler``: the N particles of a particle flow (Sebag et al. 2023), released
  latents kept as they are and decoded on the way out by the public decoder; ``sample`` draws
  ``n ≤ N`` of them without replacement, ``forward(index)`` decodes the particles ``index``.
  More samples would need a new flow (new private releases).

Seeded draws consume the generator in the order the training modules do (labels, then latents),
so a generator's ``sample(n, seed)`` equals the module's ``sample(n, generator=torch.Generator().
manual_seed(seed))`` (conditional: ``sample_labeled``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = [
    "ConditionalGeneratorSampler",
    "GeneratorSampler",
    "LatentDecoder",
    "LatentSampler",
    "ParticleSampler",
    "Reshape",
    "StandaloneSampler",
]

LATENTS = ("uniform", "normal")


def _seeded(seed: int | None) -> torch.Generator | None:
    """A CPU generator seeded with ``seed``; ``None``: the global RNG."""
    if seed is None:
        return None
    if torch.jit.is_scripting():
        # TorchScript saves a generator seeded by ``manual_seed`` as a constant (the state it
        # had when saved); seeded at construction, it is rebuilt on every call.
        return torch.Generator(device="cpu", seed=seed)
    return torch.Generator().manual_seed(seed)


def _check_count(n: int, max_samples: int) -> None:
    if n < 1 or (max_samples >= 0 and n > max_samples):
        bound = "" if max_samples < 0 else " and <= " + str(max_samples)
        raise ValueError("n must be an integer >= 1" + bound + ", got " + str(n))


def _frozen_copy(network: nn.Module) -> nn.Module:
    """A copy of ``network`` on the CPU in eval mode (the live module is left as it is)."""
    return copy.deepcopy(network).cpu().eval()


class StandaloneSampler(nn.Module):
    """The attributes every sampler has (module docstring) and the trace fallback."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        # Holds nothing: it follows ``.to(device)``, so draws know where to go.
        self.register_buffer("device_marker", torch.empty(0), persistent=False)
        self.kind = kind
        self.latent = "none"
        self.latent_dim = 0
        self.latent_low, self.latent_high = 0.0, 0.0
        self.num_classes = 0
        self.max_samples = -1
        self.record_shape = [0]

    def trace_network(self) -> None:
        """Replace the sampler's network by its ``torch.jit.trace`` on two rows, for networks
        TorchScript cannot compile. A trace records one path through the code: the export
        checks the traced sampler's draws against the network's."""
        raise NotImplementedError


class LatentSampler(StandaloneSampler):
    """What the generator samplers share: the latent law z ~ Unif[low, high]^d or N(0, I_d).

    Args:
        kind: ``"generator"`` or ``"conditional_generator"``.
        generator: the trained network (a copy is kept, in eval mode, on the CPU).
        latent_dim: d, the size of z.
        latent: ``"uniform"`` (on [low, high]) or ``"normal"`` (standard).
        low, high: the bounds of the uniform law (unused for ``"normal"``).
    """

    def __init__(
        self,
        kind: str,
        generator: nn.Module,
        latent_dim: int,
        latent: str = "uniform",
        low: float = -1.0,
        high: float = 1.0,
    ) -> None:
        super().__init__(kind)
        if latent not in LATENTS:
            raise ValueError(f"latent must be one of {LATENTS}, got {latent!r}")
        if latent == "uniform" and not high > low:
            raise ValueError(f"the uniform latent needs low < high, got low={low}, high={high}")
        self.generator = _frozen_copy(generator)
        self.latent = latent
        self.latent_dim = int(latent_dim)
        if latent == "uniform":
            self.latent_low, self.latent_high = float(low), float(high)

    def draw_latent(self, n: int, generator: torch.Generator | None) -> Tensor:
        """z of shape ``(n, latent_dim)`` from ``generator`` (``None``: the global RNG), drawn on
        the CPU and moved to the sampler's device."""
        if self.latent == "normal":
            z = torch.randn([n, self.latent_dim], generator=generator)
        else:
            u = torch.rand([n, self.latent_dim], generator=generator)
            z = self.latent_low + (self.latent_high - self.latent_low) * u
        return z.to(self.device_marker.device)

    def example_inputs(self) -> tuple[Tensor, ...]:
        """Two rows of the network's inputs (for ``trace_network``)."""
        raise NotImplementedError

    def trace_network(self) -> None:
        self.generator = torch.jit.trace(self.generator, self.example_inputs(), check_trace=False)


class GeneratorSampler(LatentSampler):
    """x = G(z), z from the latent law (``LatentSampler``, whose arguments it takes but
    ``kind``)."""

    def __init__(
        self,
        generator: nn.Module,
        latent_dim: int,
        latent: str = "uniform",
        low: float = -1.0,
        high: float = 1.0,
    ) -> None:
        super().__init__("generator", generator, latent_dim, latent, low, high)
        with torch.no_grad():
            self.record_shape = list(self.forward(*self.example_inputs()).shape[1:])

    def forward(self, z: Tensor) -> Tensor:
        """G(z) for latents ``z`` of shape ``(n, latent_dim)``."""
        return self.generator(z)

    def example_inputs(self) -> tuple[Tensor, ...]:
        return (self.draw_latent(2, _seeded(0)),)

    @torch.jit.export
    def sample(self, n: int, seed: int | None = None) -> Tensor:
        """``n`` records G(z); ``seed`` makes the draw reproducible."""
        _check_count(n, self.max_samples)
        with torch.no_grad():
            return self.forward(self.draw_latent(n, _seeded(seed)))


class ConditionalGeneratorSampler(LatentSampler):
    """x = G(z, y), y ~ Unif{0, …, L−1} drawn before z (Cao et al. 2021, Algorithm 1).

    Args:
        generator: the network ``(z, labels) → records``.
        num_classes: L.
        latent_dim, latent, low, high: as ``LatentSampler``.
    """

    def __init__(
        self,
        generator: nn.Module,
        num_classes: int,
        latent_dim: int,
        latent: str = "uniform",
        low: float = -1.0,
        high: float = 1.0,
    ) -> None:
        super().__init__("conditional_generator", generator, latent_dim, latent, low, high)
        if int(num_classes) < 1:
            raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
        self.num_classes = int(num_classes)
        with torch.no_grad():
            self.record_shape = list(self.forward(*self.example_inputs()).shape[1:])

    def forward(self, z: Tensor, labels: Tensor) -> Tensor:
        """G(z, y) for latents ``(n, latent_dim)`` and integer labels ``(n,)``."""
        return self.generator(z, labels)

    def example_inputs(self) -> tuple[Tensor, ...]:
        generator = _seeded(0)
        labels = torch.randint(self.num_classes, [2], generator=generator)
        return self.draw_latent(2, generator), labels.to(self.device_marker.device)

    @torch.jit.export
    def sample_labeled(self, n: int, seed: int | None = None) -> tuple[Tensor, Tensor]:
        """``n`` records and their labels ``(x, y)``; ``seed`` makes the draw reproducible."""
        _check_count(n, self.max_samples)
        generator = _seeded(seed)
        labels = torch.randint(self.num_classes, [n], generator=generator)
        labels = labels.to(self.device_marker.device)
        with torch.no_grad():
            return self.forward(self.draw_latent(n, generator), labels), labels

    @torch.jit.export
    def sample(self, n: int, seed: int | None = None) -> Tensor:
        """The records of ``sample_labeled``."""
        return self.sample_labeled(n, seed)[0]


class Reshape(nn.Module):
    """Rows ``(n, m)`` → records ``(n, *shape)``: the decoder of latents that are the records
    themselves, flattened."""

    def __init__(self, shape: Sequence[int]) -> None:
        super().__init__()
        self.shape = [int(s) for s in shape]

    def forward(self, z: Tensor) -> Tensor:
        return z.reshape([z.shape[0]] + self.shape)


class LatentDecoder(nn.Module):
    """The public decoder of a stage-1 autoencoder: z → ``autoencoder.decode(z)`` (a copy, in
    eval mode, on the CPU)."""

    def __init__(self, autoencoder: nn.Module) -> None:
        super().__init__()
        self.autoencoder = _frozen_copy(autoencoder)

    def forward(self, z: Tensor) -> Tensor:
        return self.autoencoder.decode(z)


class ParticleSampler(StandaloneSampler):
    """A particle flow's N released particles, decoded on the way out (module docstring).

    Args:
        particles: ``(N, d)``, post-processing of the flow's private releases (a detached CPU
            copy is kept as the buffer ``particles``).
        decoder: latents → records (``LatentDecoder`` or ``Reshape``; kept as given).
    """

    def __init__(self, particles: Tensor, decoder: nn.Module) -> None:
        super().__init__("particles")
        if particles.ndim != 2 or particles.shape[0] < 1:
            raise ValueError(
                f"particles must have shape (N, d) with N >= 1, got {tuple(particles.shape)}"
            )
        self.register_buffer("particles", particles.detach().cpu().clone())
        self.decoder = decoder
        self.max_samples = int(particles.shape[0])
        with torch.no_grad():
            self.record_shape = list(self.forward(torch.zeros(1, dtype=torch.long)).shape[1:])

    def forward(self, index: Tensor) -> Tensor:
        """The decoded particles at the integer positions ``index``."""
        return self.decoder(self.particles[index])

    @torch.jit.export
    def sample(self, n: int, seed: int | None = None) -> Tensor:
        """``n ≤ N`` distinct particles, decoded, in random order; ``seed`` makes the draw
        reproducible."""
        _check_count(n, self.max_samples)
        order = torch.randperm(self.max_samples, generator=_seeded(seed))[:n]
        order = order.to(self.particles.device)
        with torch.no_grad():  # decoded 1024 at a time: the decoder's activations stay bounded
            return torch.cat([self.forward(chunk) for chunk in order.split(1024)])

    def trace_network(self) -> None:
        self.decoder = torch.jit.trace(self.decoder, (self.particles[:2],), check_trace=False)
