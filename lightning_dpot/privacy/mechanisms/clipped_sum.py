r"""One Gaussian release of a per-class sum of per-record vectors clipped to a norm (the release
of DP-MERF, Harder et al. 2021, and of any method that releases one statistic before training).

For records x_i with labels y_i ∈ {0, …, L−1}, a public feature map f and a clip norm C:

    S = Σ_i clip_C(f(x_i)) ⊗ onehot(y_i) + N(0, σ² I),   clip_C(v) = v · min(1, C/‖v‖₂),

an ``(L, k)`` tensor (unlabelled: L = 1). Replacing one record changes the sum by at most
‖clip_C(f(x)) ⊗ e_y − clip_C(f(x')) ⊗ e_{y'}‖₂ ≤ 2C = Δ: one Gaussian mechanism with noise
multiplier σ/Δ under replace-one adjacency, emitted as one ``GaussianRelease`` (ε from the
analytic Gaussian mechanism, Balle & Wang 2018). Every record is checked finite and inside the
source's declared bounds, and the labels inside [0, L), before anything is released; the sum is
computed in float64 with autocast off, so the clip holds in the precision it is proved in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lightning_dpot.checks import check_delta, check_labels, check_nonnegative, check_positive
from lightning_dpot.checks import check_records as check_records_in_bounds
from lightning_dpot.privacy.events import EventLog, GaussianRelease, PrivacyEvent
from lightning_dpot.rng import SecretNoise, standard_normal

__all__ = ["ClippedSumRelease", "block_sum"]

#: records per chunk of features (a chunk of 2,048 × 10,000 float64 features is 160 MB)
CHUNK = 2048


def block_sum(vectors: Tensor, labels: Tensor | None, num_blocks: int) -> Tensor:
    """``Σ_i v_i ⊗ onehot(y_i)`` as ``(L, k)`` (one block when ``labels`` is ``None``)."""
    out = vectors.new_zeros(num_blocks, vectors.shape[1])
    if labels is None:
        return out + vectors.sum(0, keepdim=True)
    return out.index_add(0, labels.long().to(vectors.device), vectors)


class ClippedSumRelease:
    """The Gaussian release of ``Σ_i clip_C(f(x_i)) ⊗ onehot(y_i)`` (module docstring), counted
    and reported: a release object of ``lightning_dpot.privacy.contract``.

    Args:
        clip_norm: C > 0; the sensitivity is Δ = 2C.
        delta: δ of the guarantee.
        noise_seed, secure_rng: the noise source (``SecretNoise``).
        is_private: False only for the non-private reference (σ = 0).
        mechanism: how the report names the release.

    Example:
        >>> release = ClippedSumRelease(1.0, 1e-5, noise_seed=0, is_private=False)
        >>> release.calibrate(0.0)
        >>> records = torch.tensor([[0.5, 0.0], [3.0, 4.0]])
        >>> release(records, None, lambda x: x, 1, (-5.0, 5.0), None)  # ‖(3, 4)‖ clipped to 1
        tensor([[1.1000, 0.8000]], dtype=torch.float64)
    """

    def __init__(
        self,
        clip_norm: float,
        delta: float,
        noise_seed: int | None = None,
        secure_rng: bool = False,
        is_private: bool = True,
        mechanism: str = "gaussian sum of clipped per-record vectors",
    ) -> None:
        self.clip_norm = check_positive("clip_norm", clip_norm)
        self.delta = check_delta("delta", delta)
        self.noise = SecretNoise(noise_seed, secure_rng)
        self.is_private = bool(is_private)
        self.mechanism = mechanism
        self.events = EventLog()
        self.noise_scale = 0.0
        self.calibrated = False

    @property
    def sensitivity(self) -> float:
        """Δ = 2C, the ℓ2 sensitivity of the sum under replace-one."""
        return 2.0 * self.clip_norm

    def calibrate(self, noise_scale: float) -> None:
        """Fix σ, the standard deviation of the noise on the sum."""
        self.noise_scale = check_nonnegative("noise_scale", noise_scale)
        if self.is_private != (self.noise_scale > 0.0):
            raise ValueError(
                f"noise_scale={noise_scale!r} for a release declared is_private={self.is_private}"
            )
        self.calibrated = True

    @property
    def event(self) -> PrivacyEvent | None:
        """One ``GaussianRelease`` at σ/Δ (``None`` before calibration and when σ = 0)."""
        if not self.calibrated or self.noise_scale == 0.0:
            return None
        return GaussianRelease(self.noise_scale / self.sensitivity, adjacency="replace_one")

    def check_inputs(
        self, flat: Tensor, labels: Tensor | None, num_blocks: int, bounds: tuple[float, float]
    ) -> None:
        """Refuse, before anything is computed: no calibration, records not finite or outside
        ``bounds``, labels outside [0, L), or several blocks without labels."""
        if not self.calibrated:
            raise RuntimeError(f"{type(self).__name__}: calibrate() before releasing")
        check_records_in_bounds(flat, bounds[0], bounds[1], "records")
        if labels is not None:
            check_labels(labels, num_blocks, flat.shape[0], "labels")
        elif num_blocks != 1:
            raise ValueError(
                f"labels is None but num_blocks={num_blocks}: an unlabelled release has one "
                "block (every record's vector in each block would make Δ = 2C·sqrt(blocks))"
            )

    def __call__(
        self,
        records: Tensor,
        labels: Tensor | None,
        features: Callable[[Tensor], Tensor],
        num_blocks: int,
        bounds: tuple[float, float],
        source: Any,
    ) -> Tensor:
        """The noisy sum ``S`` as ``(L, k)`` float64; ``features`` maps float64 ``(m, d)``
        records to ``(m, k)`` vectors and must be public (fixed before the data is read). It is
        applied to one record at a time (``torch.func.vmap``), so a map that would look at other
        records cannot change the sensitivity; one that cannot run under vmap is refused.

        The noiseless sum is computed first, then the event is emitted (journaled before the
        noise exists), then the noise is drawn once and added in place."""
        flat = records.detach().reshape(records.shape[0], -1)
        self.check_inputs(flat, labels, num_blocks, bounds)
        if source is None and self.noise_scale > 0.0:
            raise ValueError(
                "source is None: a private release draws its noise from its own source "
                "(release.noise.source(...)), never from the global RNG"
            )
        total: Tensor | None = None
        width: int | None = None
        with torch.autocast(flat.device.type, enabled=False):
            for start in range(0, flat.shape[0], CHUNK):
                chunk = flat[start : start + CHUNK].double()
                # Record by record (vmap): a feature map that mixed records (a batch maximum,
                # batch statistics) would break Δ = 2C; under vmap it cannot.
                vectors = torch.func.vmap(lambda row: features(row[None])[0])(chunk).double()
                if vectors.ndim != 2 or (width is not None and vectors.shape[1] != width):
                    raise ValueError(
                        "features must map each record to one vector of a fixed length, got "
                        f"shape {tuple(vectors.shape[1:])} per record"
                    )
                width = vectors.shape[1]
                norms = torch.linalg.vector_norm(vectors, dim=1, keepdim=True)
                # a row of norm ≤ C is kept exactly; the clamp only shrinks longer rows
                vectors = vectors / (norms.clamp(min=self.clip_norm) / self.clip_norm)
                chunk_labels = None if labels is None else labels[start : start + CHUNK]
                summed = block_sum(vectors, chunk_labels, num_blocks)
                total = summed if total is None else total + summed
            if total is None:
                raise ValueError("records: the release needs at least one record, got 0")
            if not bool(torch.isfinite(total).all()):
                raise ValueError(
                    "records: their features are not finite (a projection overflowed); "
                    "rescale the data or declare tighter bounds"
                )
            event = self.event
            if event is not None:
                # journaled before the noise is drawn: a crash after this line stays accounted
                self.events.emit(event)
            if self.noise_scale > 0.0:
                total += self.noise_scale * standard_normal(
                    tuple(total.shape), source, device=flat.device
                )
        return total

    def facts(self) -> dict[str, Any]:
        """What the accountant's report needs beyond the events (plain JSON types)."""
        return {
            "mechanism": self.mechanism,
            "noise_scale": self.noise_scale,
            "sensitivity_l2": self.sensitivity,
            "sensitivity_check": f"every per-record vector clipped to norm {self.clip_norm} "
            "(replace-one)",
            "releases": self.events.total,
            **self.noise.facts(),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"events": self.events.state_dict(), "noise_scale": self.noise_scale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.events.load_state_dict(state["events"])
        self.calibrate(float(state["noise_scale"]))
