r"""Noise sources: a seeded ``torch.Generator`` or the operating system's CSPRNG.

The privacy of a noisy release rests on the noise being unpredictable. A ``torch.Generator``
(Mersenne Twister on CPU, Philox on CUDA) is not a cryptographic generator: its whole future
follows from its state, and its state can be reconstructed from enough outputs or from a seed.
``OSRandom`` draws every bit from ``os.urandom`` (the kernel CSPRNG: ChaCha20 on Linux), so
past outputs say nothing about the noise. ``secure_rng: true`` on the data modules and methods
selects it (``docs/secure_noise.md``, which also measures its cost and states what it does *not*
fix: the floating-point attack on textbook samplers, Mironov 2012).

The samplers are the textbook ones, computed in float64:

* uniform on the open interval (0, 1): ``(k + ½) / 2⁵³`` with k a uniform 53-bit integer (every
  output is a double; 0 and 1 are never returned, so logarithms stay finite);
* Laplace(0, b): inverse CDF ``−b·sign(u − ½)·log(1 − 2|u − ½|)``;
* N(0, 1): Box–Muller, ``sqrt(−2 log u₁)·(cos 2πu₂, sin 2πu₂)``;
* permutations: ``argsort`` of independent uniform 64-bit integers (ties have probability
  < n²/2⁶⁵ and are broken by position, a negligible bias).

``uniform``, ``standard_normal`` and ``permutation`` dispatch on the source, so call
sites take a ``NoiseSource`` and stay the same for both kinds.
"""

from __future__ import annotations

import math
import os
import secrets

import numpy as np
import torch
from torch import Tensor

from lightning_dpot.checks import check_nonnegative_int

__all__ = [
    "NoiseSource",
    "OSRandom",
    "SecretNoise",
    "permutation",
    "seeded_generator",
    "standard_normal",
    "uniform",
]

_TWO_POW_53 = float(2**53)


class OSRandom:
    """Cryptographically secure random source (the OS CSPRNG); unseedable by design."""

    def _bits(self, count: int) -> np.ndarray:
        return np.frombuffer(os.urandom(8 * count), dtype=np.uint64)

    def uniform(self, shape: tuple[int, ...]) -> Tensor:
        """float64 uniforms on the open interval (0, 1), 53 random bits each."""
        count = math.prod(shape)
        k = (self._bits(count) >> np.uint64(11)).astype(np.float64)
        return torch.from_numpy((k + 0.5) / _TWO_POW_53).reshape(shape)

    def standard_normal(self, shape: tuple[int, ...]) -> Tensor:
        """float64 N(0, 1) by Box–Muller."""
        count = math.prod(shape)
        pairs = (count + 1) // 2
        u = self.uniform((2, pairs))
        radius = torch.sqrt(-2.0 * torch.log(u[0]))
        angle = 2.0 * math.pi * u[1]
        z = torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])
        return z[:count].reshape(shape)

    def permutation(self, n: int) -> Tensor:
        """A uniformly random permutation of ``range(n)`` (int64)."""
        keys = torch.from_numpy(self._bits(n).view(np.int64).copy())
        return torch.argsort(keys, stable=True)

    def __repr__(self) -> str:
        return "OSRandom()"


NoiseSource = torch.Generator | OSRandom
"""Where noise comes from: a (seeded or secretly seeded) torch generator, or ``OSRandom``."""


def seeded_generator(*key: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A torch generator seeded by a tuple of integers (``SeedSequence(key)``), e.g.
    ``(seed, stream, step)``: reproducible, independent streams, identical on every rank."""
    state = np.random.SeedSequence([int(k) for k in key]).generate_state(2, dtype=np.uint32)
    return torch.Generator(device=device).manual_seed(int(state[0]) << 32 | int(state[1]))


class SecretNoise:
    """Where a release object's noise comes from; the one helper every release uses.

    * default (``noise_seed=None``): a torch generator per device, seeded once from the OS
      entropy pool and never recorded, so nobody can regenerate the noise;
    * ``secure_rng=True``: the OS CSPRNG itself (``OSRandom``), no generator state at all;
    * ``noise_seed=k``: the generator of ``(k, *key)`` (``seeded_generator``), reproducible,
      and anyone who knows ``k`` can subtract the noise: tests and debugging only. Reports say
      ``noise_seed_is_public``.
    """

    def __init__(self, noise_seed: int | None = None, secure_rng: bool = False) -> None:
        if secure_rng and noise_seed is not None:
            raise ValueError(
                "secure_rng=True draws from the OS CSPRNG, which has no seed: got "
                f"noise_seed={noise_seed!r} (give one or the other)"
            )
        self.noise_seed = (
            None if noise_seed is None else check_nonnegative_int("noise_seed", noise_seed)
        )
        self.secure_rng = bool(secure_rng)
        self._entropy: dict[str, torch.Generator] = {}

    def source(self, *key: int, device: torch.device | str = "cpu") -> NoiseSource:
        """The noise source of the call identified by ``key`` (used only with a public seed)."""
        if self.secure_rng:
            return OSRandom()
        if self.noise_seed is not None:
            return seeded_generator(self.noise_seed, *key, device=device)
        name = str(torch.device(device))
        if name not in self._entropy:
            self._entropy[name] = torch.Generator(device=device).manual_seed(secrets.randbits(63))
        return self._entropy[name]

    def facts(self) -> dict:
        return {"noise_seed_is_public": self.noise_seed is not None, "secure_rng": self.secure_rng}

    def __getstate__(self) -> dict:
        """Everything but the secretly seeded generators: a pickled ``torch.Generator`` keeps
        its seed, from which the noise could be regenerated and subtracted. A loaded copy seeds
        fresh ones from OS entropy."""
        return {**self.__dict__, "_entropy": {}}


def uniform(shape: tuple[int, ...], source: NoiseSource | None) -> Tensor:
    """float64 uniforms in [0, 1) (torch) or (0, 1) (``OSRandom``), on the CPU."""
    if isinstance(source, OSRandom):
        return source.uniform(shape)
    return torch.rand(shape, generator=source, dtype=torch.float64)


def standard_normal(
    shape: tuple[int, ...],
    source: NoiseSource | None,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """N(0, 1) draws of ``shape``; an ``OSRandom`` draws on the CPU and copies to
    ``device``, a torch generator draws on its own device."""
    if isinstance(source, OSRandom):
        return source.standard_normal(shape).to(device=device, dtype=dtype)
    return torch.randn(shape, generator=source, device=device, dtype=dtype)


def permutation(n: int, source: NoiseSource | None) -> Tensor:
    """A uniformly random permutation of ``range(n)`` from ``source``."""
    if isinstance(source, OSRandom):
        return source.permutation(n)
    return torch.randperm(n, generator=source)
