"""Argument checks shared by every mechanism, bound and accountant.

Each check raises ``ValueError`` naming the parameter, the value received and the accepted
range, so a wrong configuration is refused loudly instead of being clipped.
"""

from __future__ import annotations

import math


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


def check_epsilon(value: float, name: str = "epsilon") -> float:
    """Privacy parameter ε: finite and > 0."""
    return check_positive(name, value)


def check_delta(value: float, name: str = "delta") -> float:
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
