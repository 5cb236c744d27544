"""Argument and record checks shared by every mechanism, bound, accountant and data module.

Argument checks take ``(name, value)`` and return the value as a Python number; record checks
take the tensor first. Each argument check raises ``ValueError`` naming the parameter, the value
received and the accepted range, so a wrong configuration is refused loudly instead of being
clipped. The record checks (``check_records``, ``check_unit_ball``, ``check_labels``)
name the failure, how many records fail and the first one's index, never a value computed from
private records.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported by the record checks only: the CLI's calculators stay fast
    from torch import Tensor


def check_positive(name: str, value: float) -> float:
    """Require a finite ``value > 0``."""
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def check_nonnegative(name: str, value: float) -> float:
    """Require a finite ``value >= 0``."""
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def check_epsilon(name: str, value: float) -> float:
    """Privacy parameter ε: finite and > 0."""
    return check_positive(name, value)


def check_delta(name: str, value: float) -> float:
    """Privacy parameter δ: in the open interval (0, 1)."""
    value = float(value)
    if not math.isfinite(value) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must lie in the open interval (0, 1), got {value!r}")
    return value


def check_probability(name: str, value: float) -> float:
    """A rate in (0, 1], e.g. a Poisson sample rate."""
    value = float(value)
    if not math.isfinite(value) or not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must lie in (0, 1], got {value!r}")
    return value


def check_positive_int(name: str, value: int) -> int:
    """A whole number >= 1."""
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_nonnegative_int(name: str, value: int) -> int:
    """A whole number >= 0."""
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


# -- records ------------------------------------------------------------------------------------
# One NaN, infinite or out-of-support record changes a release as no neighbour can (a NaN
# gradient against a finite one reveals presence with certainty), so records are refused before
# anything is released.


def _refuse_rows(failed: Tensor, name: str, what: str, remedy: str, unit: str = "record") -> None:
    """Raise if the per-row mask ``failed`` has any ``True``: count and first index only."""
    import torch

    count = int(failed.sum())
    if count:
        first = int(failed.to(torch.uint8).argmax())  # argmax returns the first maximal index
        raise ValueError(f"{name}: {count} {unit}(s) {what}, the first at index {first}; {remedy}")


def _row_extrema(records: Tensor) -> tuple[Tensor, Tensor]:
    """Per-record minimum and maximum over all but dim 0: two values per record of memory,
    whatever the record size. NaN propagates through both; ±Inf lands on one."""
    records = records.detach()
    if records.dim() == 1:
        records = records.unsqueeze(1)
    dims = tuple(range(1, records.dim()))
    return records.amin(dim=dims), records.amax(dim=dims)


def _refuse_non_finite(lowest: Tensor, highest: Tensor, name: str) -> None:
    import torch

    _refuse_rows(
        ~(torch.isfinite(lowest) & torch.isfinite(highest)),
        name,
        "contain NaN or Inf values",
        "clean the data before it is used",
    )


def check_finite(records: Tensor, name: str = "records") -> None:
    """Require every record (row along dim 0) to hold finite values only."""
    if records.numel() > 0:
        _refuse_non_finite(*_row_extrema(records), name)


def check_records(records: Tensor, low: float, high: float, name: str = "records") -> None:
    """Require every record (row along dim 0) to be finite and inside the declared box
    ``[low, high]`` (its public support, from which every sensitivity is derived).

    Raises:
        ValueError: naming the failure, how many records fail and the first one's index.
    """
    if records.numel() == 0:
        return
    lowest, highest = _row_extrema(records)
    _refuse_non_finite(lowest, highest, name)
    _refuse_rows(
        (lowest < low) | (highest > high),
        name,
        f"lie outside the declared bounds [low, high] = [{low}, {high}]",
        "the privacy guarantee assumes these bounds. Rescale the data or declare wider bounds",
    )


def check_unit_ball(records: Tensor, name: str = "records", tolerance: float = 1e-5) -> None:
    """Require ``(n, d)`` records to be finite with ``‖x_i‖₂ ≤ 1 + tolerance`` (the support of
    the sliced release's sensitivity, Sebag et al. 2023, §5.2).

    Raises:
        ValueError: naming the failure, how many records fail and the first one's index.
    """
    import torch

    check_finite(records, name)
    if records.numel() == 0:
        return
    norms = torch.linalg.vector_norm(records.detach(), dim=1)
    _refuse_rows(
        norms > 1.0 + tolerance,
        name,
        f"have ℓ2 norm > 1 (tolerance {tolerance!r})",
        "normalise the records onto the unit ball before they are released",
    )


def check_labels(labels: Tensor, num_classes: int, num_records: int, name: str = "labels") -> None:
    """Require ``num_records`` labels, each an integer in ``[0, num_classes)``.

    Raises:
        ValueError: on a shape mismatch, or naming how many labels fail and the first index.
    """
    if tuple(labels.shape) != (num_records,):
        raise ValueError(
            f"{name} must have shape ({num_records},) (one per record), got {tuple(labels.shape)}"
        )
    labels = labels.detach()
    failed = (labels < 0) | (labels >= num_classes)
    if labels.is_floating_point():
        failed |= labels != labels.trunc()  # also NaN
    _refuse_rows(
        failed,
        name,
        f"are not integers in [0, num_classes) = [0, {num_classes})",
        "relabel the data or declare more classes",
        unit="label",
    )
