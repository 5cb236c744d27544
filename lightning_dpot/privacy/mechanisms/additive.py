"""Local randomizers: the Laplace and Gaussian mechanisms (Reshetova et al. 2024, §II, eqs. 8–10).

A mechanism is fully determined by its public parameters: the sensitivity Δ (from declared
bounds or a projection radius, see ``lightning_dpot.privacy.mechanisms.sensitivity``) and either
the privacy target (ε, δ) or the noise scale. The other is derived, so a configuration can state
whichever the paper states (e.g. "b = 3" in Reshetova et al. 2024, Fig. 11 or "(35, 1e-4)" in
Fig. 3).

* Laplace: Z_i ~ Laplace(0, b) i.i.d., b = Δ1/ε — pure ε-DP, density ∝ exp(−‖z‖₁/b).
  Its matched OT cost is ‖·‖₁ with λ = b (p = 1, Theorem 1 of Reshetova et al. 2024).
* Gaussian: Z_i ~ N(0, σ²) i.i.d., σ from ``lightning_dpot.privacy.mechanisms.gaussian`` — (ε,
  δ)-DP. Its matched OT cost is ‖·‖₂² with λ = 2σ² (p = 2).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

import torch
from torch import Tensor

from lightning_dpot.checks import check_delta, check_epsilon, check_positive
from lightning_dpot.privacy.mechanisms.gaussian import (
    CALIBRATIONS,
    GaussianCalibration,
    gaussian_epsilon,
    gaussian_sigma,
)
from lightning_dpot.rng import NoiseSource, standard_normal, uniform

MechanismName = Literal["laplace", "gaussian"]


@dataclass(frozen=True)
class LaplaceMechanism:
    """Pure ε-DP Laplace mechanism with scale ``b = sensitivity / epsilon``.

    ``sensitivity`` is the ℓ1 sensitivity Δ1 of the released vector.
    """

    epsilon: float
    sensitivity: float
    name: str = "laplace"
    p: int = 1
    delta: float = 0.0

    def __post_init__(self) -> None:
        check_epsilon("epsilon", self.epsilon)
        check_positive("sensitivity_l1", self.sensitivity)

    @classmethod
    def from_scale(cls, scale: float, sensitivity: float) -> LaplaceMechanism:
        """The mechanism with Laplace scale ``b``: ε = Δ1 / b."""
        scale = check_positive("noise_scale", scale)
        sensitivity = check_positive("sensitivity_l1", sensitivity)
        return cls(epsilon=sensitivity / scale, sensitivity=sensitivity)

    @property
    def noise_scale(self) -> float:
        """Laplace scale b (the σ of Reshetova et al. 2024, §IV for p = 1)."""
        return self.sensitivity / self.epsilon

    @property
    def noise_std(self) -> float:
        """Per-coordinate standard deviation √2·b."""
        return math.sqrt(2.0) * self.noise_scale

    def sample_noise(self, shape: tuple[int, ...], generator: NoiseSource) -> Tensor:
        """i.i.d. Laplace(0, b) noise by inverse CDF: b·sign(u)·(−log(1 − 2|u|)), u ~ U(−½, ½)
        (``lightning_dpot.rng`` for the sources)."""
        u = uniform(shape, generator).sub_(0.5)
        sign = torch.sign(u)
        # In place, bit-identical to −b·sign(u)·log1p(−2|u|): multiplying by ±1 is exact.
        noise = u.abs_().mul_(-2.0).log1p_().mul_(sign).mul_(-self.noise_scale)
        return noise.to(torch.float32)

    def describe(self) -> dict:
        return {**asdict(self), "noise_scale": self.noise_scale}


@dataclass(frozen=True)
class GaussianMechanism:
    """(ε, δ)-DP Gaussian mechanism; σ follows from (ε, δ, Δ2) by ``calibration``.

    ``sensitivity`` is the ℓ2 sensitivity Δ2 of the released vector.
    """

    epsilon: float
    delta: float
    sensitivity: float
    calibration: GaussianCalibration = "analytic"
    name: str = "gaussian"
    p: int = 2

    def __post_init__(self) -> None:
        check_epsilon("epsilon", self.epsilon)
        check_delta("delta", self.delta)
        check_positive("sensitivity_l2", self.sensitivity)
        if self.calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {self.calibration!r}")
        # Computed once; the dataclass is frozen.
        sigma = gaussian_sigma(self.epsilon, self.delta, self.sensitivity, self.calibration)
        object.__setattr__(self, "_sigma", sigma)

    @classmethod
    def from_scale(
        cls,
        scale: float,
        delta: float,
        sensitivity: float,
        calibration: GaussianCalibration = "analytic",
    ) -> GaussianMechanism:
        """The mechanism with noise std σ: ε follows from (σ, δ, Δ2)."""
        scale = check_positive("noise_scale", scale)
        epsilon = gaussian_epsilon(scale, delta, sensitivity, calibration)
        mechanism = cls(
            epsilon=epsilon, delta=delta, sensitivity=sensitivity, calibration=calibration
        )
        object.__setattr__(mechanism, "_sigma", scale)  # exactly the stated σ, not a round trip
        return mechanism

    @property
    def noise_scale(self) -> float:
        """Noise standard deviation σ."""
        return self._sigma  # type: ignore[attr-defined]

    @property
    def noise_std(self) -> float:
        return self.noise_scale

    def sample_noise(self, shape: tuple[int, ...], generator: NoiseSource) -> Tensor:
        """i.i.d. N(0, σ²) noise."""
        noise = standard_normal(shape, generator).mul_(self.noise_scale)
        return noise.to(torch.float32)

    def describe(self) -> dict:
        return {**asdict(self), "noise_scale": self.noise_scale}


Mechanism = LaplaceMechanism | GaussianMechanism


def make_mechanism(
    name: MechanismName,
    sensitivity: float,
    epsilon: float | None = None,
    delta: float | None = None,
    noise_scale: float | None = None,
    calibration: GaussianCalibration = "analytic",
) -> Mechanism:
    """Build a mechanism from exactly one of ``epsilon`` or ``noise_scale``.

    ``sensitivity`` is Δ1 for ``laplace`` and Δ2 for ``gaussian``; ``delta`` is required for
    ``gaussian`` and refused for ``laplace`` (which is pure DP).
    """
    if (epsilon is None) == (noise_scale is None):
        raise ValueError(
            "give exactly one of epsilon or noise_scale, got "
            f"epsilon={epsilon!r}, noise_scale={noise_scale!r}"
        )
    if name == "laplace":
        if delta not in (None, 0, 0.0):
            raise ValueError(
                f"delta must be unset for the pure-DP Laplace mechanism, got {delta!r}"
            )
        if epsilon is not None:
            return LaplaceMechanism(epsilon=epsilon, sensitivity=sensitivity)
        return LaplaceMechanism.from_scale(noise_scale, sensitivity)
    if name == "gaussian":
        if delta is None:
            raise ValueError("delta is required for the Gaussian mechanism, in (0, 1)")
        if epsilon is not None:
            return GaussianMechanism(epsilon, delta, sensitivity, calibration)
        return GaussianMechanism.from_scale(noise_scale, delta, sensitivity, calibration)
    raise ValueError(f"mechanism must be 'laplace' or 'gaussian', got {name!r}")
