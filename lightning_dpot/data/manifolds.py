"""Synthetic 2-D data (Reshetova et al. 2024, §IV-A; Sebag et al. 2023, §5.4).

Each source samples records uniformly by arc length on a known curve, declares the curve as its
public support (so its diameters are exact public constants, not estimates from the data) and
measures a generated sample's distance to that support for the ``manifold_error`` metric.

Reshetova et al. 2024 state ℓ1 sensitivity 2 and ℓ2 sensitivity √2 for the unit half-circle; its
actual diameters are 1 + √2 in ℓ1 (between (−1, 0) and (1/√2, 1/√2)) and 2 in ℓ2 (between
(±1, 0)), so the paper under-noised. These sources use the exact values.

The records are generated as they are released, with no preprocessing, so they declare no
identities (``DataSplits.train_ids``): the privacy ledger's keys of their bytes identify them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_dpot.checks import check_positive, check_positive_int
from lightning_dpot.data.sources import DataSource, DataSplits, generated_draw


def project_to_polyline(
    points: Tensor, vertices: Tensor, chunk: int = 4096
) -> tuple[Tensor, Tensor]:
    """Euclidean distance from each of ``points`` (n, 2) to the polyline through ``vertices``
    (S + 1, 2), exact per segment: ‖p − (a + clamp(t, 0, 1)(b − a))‖,
    t = ⟨p − a, b − a⟩/‖b − a‖²; and the position of the nearest point as a fraction of the
    polyline's arc length, in [0, 1]."""
    a, b = vertices[:-1].to(points), vertices[1:].to(points)
    ab = b - a
    length = ab.norm(dim=1)
    start = torch.cat([length.new_zeros(1), length.cumsum(0)[:-1]])
    denom = (ab * ab).sum(dim=1).clamp_min(1e-12)
    distances, positions = [], []
    for block in points.split(chunk):
        ap = block[:, None, :] - a[None]
        t = ((ap * ab[None]).sum(dim=2) / denom).clamp(0.0, 1.0)
        nearest = a[None] + t[..., None] * ab[None]
        dist, seg = (block[:, None, :] - nearest).norm(dim=2).min(dim=1)
        distances.append(dist)
        frac = t.gather(1, seg[:, None]).squeeze(1)
        positions.append((start[seg] + frac * length[seg]) / length.sum())
    if not distances:
        return points.new_zeros(0), points.new_zeros(0)
    return torch.cat(distances), torch.cat(positions)


def distance_to_polyline(points: Tensor, vertices: Tensor, chunk: int = 4096) -> Tensor:
    """Distance from each of ``points`` (n, 2) to the polyline (``project_to_polyline``)."""
    return project_to_polyline(points, vertices, chunk)[0]


def arc_coverage(positions: Tensor, bins: int = 18) -> float:
    """Share of ``bins`` equal pieces of the curve (by arc length) that hold at least a quarter
    of the uniform share of ``positions`` (fractions in [0, 1] of near-curve samples): 1 when
    samples spread along the whole curve, small when they pile up on part of it (default 18
    bins: 10° each on the half-circle). 0 without samples."""
    if positions.numel() == 0:
        return 0.0
    counts = torch.bincount((positions * bins).long().clamp(0, bins - 1), minlength=bins)
    return float((counts >= 0.25 * positions.numel() / bins).double().mean())


class CurveSource(DataSource):
    """Records drawn uniformly by arc length from a closed-form planar curve."""

    generated = True

    low, high = -1.0, 1.0
    sample_shape = (2,)
    _resolution = 4096

    def __init__(self, n: int = 400_000, n_test: int = 10_000, data_seed: int = 0) -> None:
        self.n = check_positive_int("n", n)
        self.n_test = check_positive_int("n_test", n_test)
        self.data_seed = data_seed

    def curve(self, t: Tensor) -> Tensor:
        """Point of the curve at parameter t ∈ [0, 1], shape (len(t), 2)."""
        raise NotImplementedError

    def polyline(self) -> Tensor:
        return self.curve(torch.linspace(0.0, 1.0, self._resolution + 1, dtype=torch.float64))

    def _sample(self, n: int, generator: torch.Generator) -> Tensor:
        verts = self.polyline()
        seg = (verts[1:] - verts[:-1]).norm(dim=1)
        cdf = torch.cat([seg.new_zeros(1), seg.cumsum(0)]) / seg.sum()
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        idx = torch.searchsorted(cdf, u, right=True).clamp(1, len(seg)) - 1
        frac = ((u - cdf[idx]) / seg[idx] * seg.sum()).clamp(0.0, 1.0)
        return (verts[idx] + frac[:, None] * (verts[idx + 1] - verts[idx])).to(torch.float32)

    def load(self) -> DataSplits:
        gen = torch.Generator().manual_seed(self.data_seed)
        train, test = self._sample(self.n, gen), self._sample(self.n_test, gen)
        return DataSplits(train=train, test=test, generated_by=generated_draw(self))

    def distance_to_support(self, points: Tensor) -> Tensor:
        """Distance of each 2-D point to the curve."""
        return distance_to_polyline(points.reshape(-1, 2).double(), self.polyline()).float()

    def coverage(self, points: Tensor, near: float = 0.25, bins: int = 18) -> float:
        """``arc_coverage`` of the points within ``near`` of the curve."""
        dist, pos = project_to_polyline(points.reshape(-1, 2).double(), self.polyline())
        return arc_coverage(pos[dist <= near], bins)


class HalfCircle(CurveSource):
    """Upper half of the unit circle, {(cos πt, sin πt) : t ∈ [0, 1]} (Reshetova et al. 2024,
    Fig. 1)."""

    def curve(self, t: Tensor) -> Tensor:
        return torch.stack([torch.cos(math.pi * t), torch.sin(math.pi * t)], dim=1)

    def diameter(self, p: float) -> float:
        return 1.0 + math.sqrt(2.0) if p == 1 else 2.0

    def distance_to_support(self, points: Tensor) -> Tensor:
        p = points.reshape(-1, 2)
        to_arc = (p.norm(dim=1) - 1.0).abs()
        ends = torch.minimum(
            (p - p.new_tensor([1.0, 0.0])).norm(dim=1), (p - p.new_tensor([-1.0, 0.0])).norm(dim=1)
        )
        return torch.where(p[:, 1] >= 0, to_arc, ends)


class Ellipse(CurveSource):
    """Ellipse x²/a² + y²/b² = 1 (Reshetova et al. 2024, Fig. 2), a = ``semi_major`` ≤ 1,
    b = ``semi_minor``."""

    def __init__(self, semi_major: float = 1.0, semi_minor: float = 0.5, **kwargs) -> None:
        super().__init__(**kwargs)
        self.semi_major = check_positive("semi_major", semi_major)
        self.semi_minor = check_positive("semi_minor", semi_minor)
        if max(self.semi_major, self.semi_minor) > 1.0:
            raise ValueError("semi_major and semi_minor must be <= 1 (declared bounds [-1, 1])")

    def curve(self, t: Tensor) -> Tensor:
        angle = 2 * math.pi * t
        return torch.stack(
            [self.semi_major * torch.cos(angle), self.semi_minor * torch.sin(angle)], dim=1
        )

    def diameter(self, p: float) -> float:
        a, b = self.semi_major, self.semi_minor
        # ℓ1: max over antipodal points of 2(a|cos t| + b|sin t|) = 2√(a² + b²); ℓ2: 2·max(a, b).
        return 2.0 * math.hypot(a, b) if p == 1 else 2.0 * max(a, b)


class Rectangle(CurveSource):
    """Boundary of the rectangle [−w, w] × [−h, h] (Reshetova et al. 2024, Fig. 2)."""

    def __init__(self, half_width: float = 1.0, half_height: float = 0.5, **kwargs) -> None:
        super().__init__(**kwargs)
        self.half_width = check_positive("half_width", half_width)
        self.half_height = check_positive("half_height", half_height)
        if max(self.half_width, self.half_height) > 1.0:
            raise ValueError("half_width and half_height must be <= 1 (declared bounds [-1, 1])")

    def polyline(self) -> Tensor:
        w, h = self.half_width, self.half_height
        return torch.tensor([[w, h], [-w, h], [-w, -h], [w, -h], [w, h]], dtype=torch.float64)

    def diameter(self, p: float) -> float:
        w, h = self.half_width, self.half_height
        return 2.0 * (w + h) if p == 1 else 2.0 * math.hypot(w, h)


class GaussianMixture2D(DataSource):
    """Five isotropic Gaussians with centres on a circle (Sebag et al. 2023, §5.4), truncated to
    the unit disk by rejection so that the declared support is {‖x‖₂ ≤ 1} (ℓ2 diameter 2,
    ℓ1 2√2)."""

    generated = True
    low, high = -1.0, 1.0
    sample_shape = (2,)

    def __init__(
        self,
        n: int = 10_000,
        n_test: int = 2_000,
        num_components: int = 5,
        radius: float = 0.6,
        std: float = 0.08,
        data_seed: int = 0,
    ) -> None:
        self.n = check_positive_int("n", n)
        self.n_test = check_positive_int("n_test", n_test)
        self.num_components = check_positive_int("num_components", num_components)
        self.radius = check_positive("radius", radius)
        self.std = check_positive("std", std)
        if self.radius >= 1.0:
            raise ValueError(f"radius must be < 1 (support is the unit disk), got {radius!r}")
        self.data_seed = data_seed

    def centers(self) -> Tensor:
        angle = 2 * math.pi * torch.arange(self.num_components, dtype=torch.float32)
        angle = angle / self.num_components
        return self.radius * torch.stack([torch.cos(angle), torch.sin(angle)], dim=1)

    def _sample(self, n: int, generator: torch.Generator) -> Tensor:
        out: list[Tensor] = []
        kept = 0
        while kept < n:
            comp = torch.randint(self.num_components, (2 * n,), generator=generator)
            x = self.centers()[comp] + self.std * torch.randn(2 * n, 2, generator=generator)
            x = x[x.norm(dim=1) <= 1.0]
            out.append(x)
            kept += len(x)
        return torch.cat(out)[:n]

    def diameter(self, p: float) -> float:
        return 2.0 * math.sqrt(2.0) if p == 1 else 2.0

    def load(self) -> DataSplits:
        gen = torch.Generator().manual_seed(self.data_seed)
        train, test = self._sample(self.n, gen), self._sample(self.n_test, gen)
        return DataSplits(train=train, test=test, generated_by=generated_draw(self))
