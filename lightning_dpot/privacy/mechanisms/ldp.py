"""The local randomizer of Reshetova et al. 2024: transform → projection → noise, applied once
per record.

    Y_i = M(f(x_i)) = Π(f(x_i)) + Z_i,

with f a fixed transform (identity or DCT), Π an optional projection onto an ℓ1/ℓ2 ball and
Z_i the mechanism's noise. Sensitivity is derived from the source's declared diameters, the
transform and the projection radii
(``declared_sensitivity``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_dpot.checks import check_records
from lightning_dpot.privacy.mechanisms.additive import Mechanism, MechanismName, make_mechanism
from lightning_dpot.privacy.mechanisms.gaussian import GaussianCalibration
from lightning_dpot.privacy.mechanisms.projections import project_l1_ball, project_l2_ball
from lightning_dpot.privacy.mechanisms.sensitivity import declared_sensitivity
from lightning_dpot.privacy.mechanisms.transforms import RecordTransform
from lightning_dpot.rng import NoiseSource


@dataclass(frozen=True)
class LocalRandomizer:
    """A configured local randomizer; call it on raw records ``(n, *sample_shape)``."""

    mechanism: Mechanism
    transform: RecordTransform
    low: float
    high: float
    l1_radius: float | None = None
    l2_radius: float | None = None

    @classmethod
    def build(
        cls,
        mechanism: MechanismName,
        transform: RecordTransform,
        low: float,
        high: float,
        diameter_l1: float,
        diameter_l2: float,
        epsilon: float | None = None,
        delta: float | None = None,
        noise_scale: float | None = None,
        calibration: GaussianCalibration = "analytic",
        l1_radius: float | None = None,
        l2_radius: float | None = None,
    ) -> LocalRandomizer:
        """Derive Δ from the public declarations and build the mechanism."""
        d1, d2 = transform.diameters(diameter_l1, diameter_l2)
        p = 1 if mechanism == "laplace" else 2
        sensitivity = declared_sensitivity(p, d1, d2, transform.out_dim, l1_radius, l2_radius)
        mech = make_mechanism(mechanism, sensitivity, epsilon, delta, noise_scale, calibration)
        return cls(mech, transform, low, high, l1_radius, l2_radius)

    def check_records(self, x: Tensor) -> None:
        """Refuse an empty set, records of another shape, non-finite records and records outside
        the declared bounds (``check_records``)."""
        if x.numel() == 0:
            raise ValueError("the dataset is empty: nothing to privatize")
        if tuple(x.shape[1:]) != self.transform.sample_shape:
            raise ValueError(
                f"records must have shape {self.transform.sample_shape} (the declared "
                f"sample_shape the sensitivity was derived for), got {tuple(x.shape[1:])}"
            )
        check_records(x, self.low, self.high, "data")

    def __call__(self, x: Tensor, generator: NoiseSource) -> Tensor:
        """Privatize every record once: ``(n, *sample_shape) → (n, m)``, float32.

        Transform, projection and noise run in float32 with autocast off, whatever the
        caller's precision (a bfloat16 DCT or projection could leave a record outside the
        radius its sensitivity assumes, and a bfloat16 noise draw is coarse)."""
        self.check_records(x)
        with torch.autocast(x.device.type, enabled=False):
            v = self.transform.forward(x.float())
            if self.l1_radius is not None:
                v = project_l1_ball(v, self.l1_radius)
            if self.l2_radius is not None:
                v = project_l2_ball(v, self.l2_radius)
            return v + self.mechanism.sample_noise(tuple(v.shape), generator)

    def describe(self) -> dict:
        return {
            **self.mechanism.describe(),
            **self.transform.describe(),
            "declared_bounds": [self.low, self.high],
            "l1_radius": self.l1_radius,
            "l2_radius": self.l2_radius,
        }
