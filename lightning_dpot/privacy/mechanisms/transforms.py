"""Data-independent transforms applied to each record before noise (Reshetova et al. 2024, §IV-E).

A transform maps a record of shape ``sample_shape`` to a vector in R^m; the mechanism privatizes
that vector and the OT loss compares generated and privatized data in the same domain.
Because the transform is fixed in advance (no data-dependent choices), the sensitivity in the
transformed domain follows from the declared bounds alone (``RecordTransform.diameters``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class RecordTransform:
    """Identity: f(x) = vec(x) ∈ R^d."""

    name = "identity"

    def __init__(self, sample_shape: tuple[int, ...]) -> None:
        self.sample_shape = tuple(sample_shape)

    @property
    def out_dim(self) -> int:
        return math.prod(self.sample_shape)

    def forward(self, x: Tensor) -> Tensor:
        """``(n, *sample_shape) → (n, m)``."""
        return x.reshape(x.shape[0], -1)

    def inverse(self, y: Tensor) -> Tensor:
        """``(n, m) → (n, *sample_shape)`` (a right inverse: exact on the kept subspace)."""
        return y.reshape(y.shape[0], *self.sample_shape)

    def diameters(self, diameter_l1: float, diameter_l2: float) -> tuple[float, float]:
        """Public bounds on ‖f(x) − f(x')‖₁ and ‖f(x) − f(x')‖₂ from those of x."""
        return diameter_l1, diameter_l2

    def describe(self) -> dict:
        return {"transform": self.name}


def dct_matrix(n: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """Orthonormal DCT-II matrix D (D Dᵀ = I): D[k, i] = α_k cos(π (2i + 1) k / (2n)),
    α_0 = √(1/n), α_k = √(2/n)."""
    k = torch.arange(n, dtype=dtype).unsqueeze(1)
    i = torch.arange(n, dtype=dtype).unsqueeze(0)
    mat = torch.cos(math.pi * (2 * i + 1) * k / (2 * n)) * math.sqrt(2.0 / n)
    mat[0] /= math.sqrt(2.0)
    return mat


class DCT2D(RecordTransform):
    """Orthonormal 2-D DCT of each image channel, keeping the top-left ``keep × keep`` block of
    low-frequency coefficients (a data-independent mask; Reshetova et al. 2024, §IV-E).

    f(x) = mask(D_H x D_Wᵀ) ∈ R^(C·keep²). Being an orthonormal map followed by a coordinate
    projection, f is 1-Lipschitz in ℓ2, so Δ2 ≤ diam₂(x); in ℓ1 only Cauchy–Schwarz holds,
    Δ1 ≤ √m · diam₂(x). (The paper picked its ℓ1 clipping level from a data quantile; that leaks,
    so here the level must be declared, as ``l1_radius`` of the DataModule.)
    """

    name = "dct"

    def __init__(self, sample_shape: tuple[int, ...], keep: int | None = None) -> None:
        super().__init__(sample_shape)
        if len(self.sample_shape) != 3:
            raise ValueError(
                f"the DCT transform needs images of shape (C, H, W), got {self.sample_shape}"
            )
        _, h, w = self.sample_shape
        keep = min(h, w) if keep is None else keep
        if not 1 <= keep <= min(h, w):
            raise ValueError(f"dct_keep must lie in [1, {min(h, w)}], got {keep!r}")
        self.keep = keep
        self._dh = dct_matrix(h, torch.float32)
        self._dw = dct_matrix(w, torch.float32)

    @property
    def out_dim(self) -> int:
        return self.sample_shape[0] * self.keep * self.keep

    def forward(self, x: Tensor) -> Tensor:
        dh, dw = self._dh.to(x), self._dw.to(x)
        coeffs = dh @ x.reshape(x.shape[0], *self.sample_shape) @ dw.T
        return coeffs[..., : self.keep, : self.keep].reshape(x.shape[0], -1)

    def inverse(self, y: Tensor) -> Tensor:
        c, h, w = self.sample_shape
        coeffs = y.new_zeros(y.shape[0], c, h, w)
        coeffs[..., : self.keep, : self.keep] = y.reshape(y.shape[0], c, self.keep, self.keep)
        dh, dw = self._dh.to(y), self._dw.to(y)
        return dh.T @ coeffs @ dw

    def diameters(self, diameter_l1: float, diameter_l2: float) -> tuple[float, float]:
        return math.sqrt(self.out_dim) * diameter_l2, diameter_l2

    def describe(self) -> dict:
        return {"transform": self.name, "dct_keep": self.keep}


def make_transform(
    name: str, sample_shape: tuple[int, ...], dct_keep: int | None = None
) -> RecordTransform:
    """``"identity"`` or ``"dct"``."""
    if name == "identity":
        return RecordTransform(sample_shape)
    if name == "dct":
        return DCT2D(sample_shape, dct_keep)
    raise ValueError(f"transform must be 'identity' or 'dct', got {name!r}")
