"""The bounded (step, ε) record of the accountant and its plot: evenly spaced points within the
capacity, the latest always kept, a resume from an earlier step replacing what came after it,
and the state round trip of a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_dpot.privacy.accounting.curve import (
    EpsilonCurve,
    plot_epsilon_curve,
    upper_staircase,
)


def test_a_long_run_keeps_evenly_spaced_points_within_the_capacity():
    curve = EpsilonCurve(capacity=16)
    for step in range(1001):
        curve.record(step, step / 1000)
        assert len(curve.points()) <= 16
    points = curve.points()
    assert points[0] == (0, 0.0) and points[-1] == (1000, 1.0)  # the first and the latest
    (gap,) = {b[0] - a[0] for a, b in zip(points[:-2], points[1:-1], strict=True)}
    assert gap == 128 and len(points) >= 8  # the spacing doubled each time the record filled
    assert all(epsilon == step / 1000 for step, epsilon in points)


def test_the_docstring_example():
    curve = EpsilonCurve(capacity=4)
    for step in range(10):
        curve.record(step, 0.1 * step)
    assert curve.points() == [(0, 0.0), (4, 0.4), (8, 0.8), (9, 0.9)]


def test_a_step_recorded_again_or_earlier_replaces_what_followed():
    curve = EpsilonCurve()
    for step in range(5):
        curve.record(step, float(step))
    curve.record(4, 4.5)  # the end of training at the last step's count
    assert curve.points()[-1] == (4, 4.5) and len(curve.points()) == 5
    curve.record(2, 2.5)  # a resume from an earlier checkpoint
    assert curve.points() == [(0, 0.0), (1, 1.0), (2, 2.5)]


def test_the_state_round_trips():
    curve = EpsilonCurve(capacity=8)
    for step in range(37):
        curve.record(step, step**0.5)
    restored = EpsilonCurve()
    restored.load_state_dict(curve.state_dict())
    assert restored.points() == curve.points()
    curve.record(40, 7.0)
    restored.record(40, 7.0)
    assert restored.points() == curve.points()


def test_bad_capacity_and_an_empty_plot_are_refused(tmp_path):
    with pytest.raises(ValueError, match="capacity must be an integer >= 2"):
        EpsilonCurve(capacity=1)
    with pytest.raises(ValueError, match="holds no point"):
        plot_epsilon_curve(EpsilonCurve(), tmp_path / "e.png", delta=1e-5)


def test_the_plot_is_a_png(tmp_path):
    curve = EpsilonCurve()
    for step, epsilon in ((0, 0.0), (10, 1.5), (20, 2.0)):
        curve.record(step, epsilon)
    path = plot_epsilon_curve(curve, tmp_path / "e.png", delta=1e-5, target_epsilon=3.0)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_drawn_line_never_shows_less_than_was_spent():
    """ε(T) grows like √T early on: a chord between sparse points would draw it lower."""
    spent = [3.0 * step**0.5 for step in range(3001)]
    curve = EpsilonCurve(capacity=16)
    for step, epsilon in enumerate(spent):
        curve.record(step, epsilon)
    xs, ys = upper_staircase(curve.points())
    covered = set()
    for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:], strict=False):
        if y0 == y1:  # a level piece, drawn over the steps (x0, x1]
            assert all(y0 >= spent[t] for t in range(x0 + 1, x1 + 1))
            covered |= set(range(x0 + 1, x1 + 1))
    assert covered == set(range(1, 3001)) and ys[0] == spent[0]
    chords = np.interp(range(3001), *zip(*curve.points(), strict=True))
    assert (chords < np.array(spent) - 1.0).any()  # a straight line would show less
