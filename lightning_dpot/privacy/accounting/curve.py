"""ε over the steps of a run: a bounded record of what the accountant reported, and its plot.

``EpsilonCurve`` keeps the pairs (optimizer step, ε at δ) that
``PrivacyAccountantCallback`` logs as it composes releases, in at
most ``capacity`` points: when the record is full, every other kept point is dropped and the
spacing between kept steps doubles, so a run of any length keeps evenly spaced points; the
latest pair is always kept. It is bookkeeping only: each ε is the accountant's own (a function
of the public σ, q and step count, never of the data), so the curve and its plot reveal nothing
the report does not. ``plot_epsilon_curve`` draws it (``epsilon.png`` of a run).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_dpot.checks import check_positive_int
from lightning_dpot.grids import save_figure

__all__ = ["EpsilonCurve", "plot_epsilon_curve", "upper_staircase"]


class EpsilonCurve:
    """A bounded record of (step, ε) pairs (module docstring).

    Args:
        capacity: most points kept (≥ 2), the latest pair included.

    Example (spacing 4, and the latest point)::

        >>> curve = EpsilonCurve(capacity=4)
        >>> for step in range(10):
        ...     curve.record(step, 0.1 * step)
        >>> [(step, round(eps, 1)) for step, eps in curve.points()]
        [(0, 0.0), (4, 0.4), (8, 0.8), (9, 0.9)]
    """

    def __init__(self, capacity: int = 512) -> None:
        self.capacity = check_positive_int("capacity", capacity)
        if self.capacity < 2:
            raise ValueError(f"capacity must be an integer >= 2, got {capacity!r}")
        self._kept: list[tuple[int, float]] = []
        self._latest: tuple[int, float] | None = None
        self._spacing = 1

    def record(self, step: int, epsilon: float) -> None:
        """Record ε after ``step``. A step at or before recorded ones (a resume from an earlier
        checkpoint) replaces them."""
        step, epsilon = int(step), float(epsilon)
        if self._kept and self._kept[-1][0] >= step:
            self._kept = [point for point in self._kept if point[0] < step]
        self._latest = (step, epsilon)
        if self._kept and step - self._kept[-1][0] < self._spacing:
            return
        self._kept.append(self._latest)
        if len(self._kept) >= self.capacity:  # room for the latest point beside the kept ones
            self._kept = self._kept[::2]
            self._spacing *= 2

    def points(self) -> list[tuple[int, float]]:
        """The kept pairs and the latest one, by step."""
        if self._latest is None or (self._kept and self._kept[-1] == self._latest):
            return list(self._kept)
        return [*self._kept, self._latest]

    def state_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "kept": [list(point) for point in self._kept],
            "latest": None if self._latest is None else list(self._latest),
            "spacing": self._spacing,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.capacity = int(state["capacity"])
        self._kept = [(int(step), float(eps)) for step, eps in state["kept"]]
        latest = state["latest"]
        self._latest = None if latest is None else (int(latest[0]), float(latest[1]))
        self._spacing = int(state["spacing"])


def upper_staircase(points: list[tuple[int, float]]) -> tuple[list[int], list[float]]:
    """The step function through the kept ``(step, ε)`` points that holds, on each interval
    ``(step_i, step_{i+1}]``, the later point's ε: with ε non-decreasing in the steps it lies on
    or above the ε spent at every step in between."""
    xs, ys = [points[0][0]], [points[0][1]]
    for step, epsilon in points[1:]:
        xs += [xs[-1], step]
        ys += [epsilon, epsilon]
    return xs, ys


def plot_epsilon_curve(
    curve: EpsilonCurve,
    path: str | Path,
    *,
    delta: float | None,
    target_epsilon: float | None = None,
    accountant: str = "",
) -> Path:
    """Draw ε against the optimizer step as a PNG at ``path`` (matplotlib, Agg), with the target
    as a dashed line when there is one; returns ``path``. Between two kept points the line holds
    the later point's ε (``upper_staircase``): ε grows with the steps, so the picture never
    shows less than was spent, however sparse the kept points (a chord of the concave curve
    would).

    Raises:
        ValueError: the curve holds no point.
    """
    points = curve.points()
    if not points:
        raise ValueError("the epsilon curve holds no point: nothing was accounted")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, epsilons = zip(*points, strict=True)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(*upper_staircase(points), label="ε spent")
    if len(points) < 50:
        ax.plot(steps, epsilons, ".", color=ax.lines[-1].get_color())
    if target_epsilon is not None:
        label = f"target ε={target_epsilon:g}"
        ax.axhline(target_epsilon, linestyle="--", color="gray", label=label)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("ε" + ("" if delta is None else f" at δ={delta:g}"))
    ax.set_ylim(bottom=0.0)
    ax.set_title(f"privacy spent ({accountant})" if accountant else "privacy spent")
    ax.legend(loc="lower right")
    return save_figure(fig, path)
