"""Amplification by shuffling (Feldman, McMillan, Talwar 2021): closed form and numerical bound."""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import binom

from lightning_dpot.commands.account import build_parser
from lightning_dpot.privacy.accounting.shuffling import (
    closed_form_max_epsilon0,
    shuffle_delta_numerical,
    shuffle_epsilon_closed_form,
    shuffle_epsilon_numerical,
)


def _theorem_3_1_by_hand(epsilon0: float, n: int, delta: float) -> float:
    # (e^x - 1)/(e^x + 1) = tanh(x/2); 8 sqrt(e^x L)/sqrt(n) = 8 sqrt(e^x L / n)
    amplification = 8.0 * (math.sqrt(math.exp(epsilon0) * math.log(4.0 / delta) / n))
    amplification += 8.0 * math.exp(epsilon0) / n
    return math.log(1.0 + math.tanh(epsilon0 / 2.0) * amplification)


@pytest.mark.parametrize(
    ("epsilon0", "n", "delta"),
    [(5.0, 400_000, 1e-6), (1.0, 10_000, 1e-6), (0.5, 1_000, 1e-5), (3.0, 100_000, 1e-8)],
)
def test_closed_form_matches_theorem_3_1_evaluated_independently(epsilon0, n, delta):
    assert shuffle_epsilon_closed_form(epsilon0, n, delta) == pytest.approx(
        _theorem_3_1_by_hand(epsilon0, n, delta), rel=1e-12
    )


def test_closed_form_value_for_the_reshetova_2024_setting():
    # e^5 = 148.413; tanh(2.5) = 0.986614; log(4e6) = 15.2018;
    # 8 sqrt(148.413 * 15.2018 / 4e5) = 0.600806; 8 * 148.413 / 4e5 = 0.002968
    # log(1 + 0.986614 * 0.603774) = log(1.595692) = 0.467316
    assert shuffle_epsilon_closed_form(5.0, 400_000, 1e-6) == pytest.approx(0.467316, abs=1e-6)


def test_closed_form_refuses_epsilon0_outside_its_validity_range():
    limit = closed_form_max_epsilon0(400_000, 1e-6)
    assert limit == pytest.approx(math.log(400_000 / (16 * math.log(2e6))))
    shuffle_epsilon_closed_form(limit, 400_000, 1e-6)  # the boundary itself is covered
    with pytest.raises(ValueError, match="validity range"):
        shuffle_epsilon_closed_form(limit + 1e-9, 400_000, 1e-6)
    with pytest.raises(ValueError, match="validity range"):
        shuffle_epsilon_closed_form(0.1, 100, 1e-6)  # n too small for any epsilon0


@pytest.mark.parametrize(
    ("epsilon0", "n", "delta"),
    [(0.5, 1_000, 1e-5), (1.0, 10_000, 1e-6), (3.0, 100_000, 1e-6), (5.0, 400_000, 1e-6)],
)
def test_numerical_bound_is_below_closed_form(epsilon0, n, delta):
    assert shuffle_epsilon_numerical(epsilon0, n, delta) < shuffle_epsilon_closed_form(
        epsilon0, n, delta
    )


def test_numerical_bound_decreases_with_n():
    values = [shuffle_epsilon_numerical(2.0, n, 1e-6) for n in (1_000, 5_000, 20_000, 100_000)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))


def test_numerical_bound_increases_with_epsilon0():
    values = [shuffle_epsilon_numerical(e0, 20_000, 1e-6) for e0 in (0.25, 0.5, 1.0, 2.0, 4.0)]
    assert all(a < b for a, b in zip(values, values[1:], strict=False))


def test_numerical_epsilon_is_the_smallest_that_meets_delta_within_tolerance():
    epsilon0, n, delta, tol = 2.0, 10_000, 1e-6, 1e-6
    epsilon = shuffle_epsilon_numerical(epsilon0, n, delta, tolerance=tol)
    assert shuffle_delta_numerical(epsilon0, n, epsilon) <= delta
    assert shuffle_delta_numerical(epsilon0, n, epsilon * (1 - 2 * tol)) > delta


def _clone_pair_hockey_stick_brute_force(epsilon0, n, epsilon):
    """Both directions of D_{e^eps} between P = (A+D, C-A+1-D) and Q = (A+1-D, C-A+D)."""
    p = math.exp(epsilon0) / (math.exp(epsilon0) + 1)
    pmf_p, pmf_q = {}, {}
    for c in range(n):
        weight_c = binom.pmf(c, n - 1, math.exp(-epsilon0))
        for a in range(c + 1):
            weight = weight_c * binom.pmf(a, c, 0.5)
            for d, weight_d in ((1, p), (0, 1 - p)):
                key_p, key_q = (a + d, c - a + 1 - d), (a + 1 - d, c - a + d)
                pmf_p[key_p] = pmf_p.get(key_p, 0.0) + weight * weight_d
                pmf_q[key_q] = pmf_q.get(key_q, 0.0) + weight * weight_d
    keys = set(pmf_p) | set(pmf_q)
    scale = math.exp(epsilon)
    forward = sum(max(0.0, pmf_p.get(k, 0.0) - scale * pmf_q.get(k, 0.0)) for k in keys)
    backward = sum(max(0.0, pmf_q.get(k, 0.0) - scale * pmf_p.get(k, 0.0)) for k in keys)
    return forward, backward


@pytest.mark.parametrize(
    ("epsilon0", "n", "epsilon"), [(1.0, 30, 0.3), (2.0, 40, 0.5), (0.5, 25, 0.1), (3.0, 20, 1.0)]
)
def test_numerical_delta_equals_brute_force_divergence_of_the_clone_pair(epsilon0, n, epsilon):
    forward, backward = _clone_pair_hockey_stick_brute_force(epsilon0, n, epsilon)
    assert forward == pytest.approx(backward, rel=1e-9)
    assert shuffle_delta_numerical(epsilon0, n, epsilon, tail_mass=0.0) == pytest.approx(
        max(forward, backward), rel=1e-9
    )


def test_numerical_bound_is_no_smaller_than_exact_shuffled_randomized_response():
    # Binary randomized response is an epsilon0-LDP randomizer; its shuffled release (a count)
    # has an exactly computable privacy profile, which every valid upper bound must dominate.
    epsilon0, n, delta = 2.0, 5_000, 1e-6
    flip = 1.0 / (1.0 + math.exp(epsilon0))
    others = binom.pmf(np.arange(n + 1), n - 1, flip)
    shifted = np.concatenate([[0.0], others[:-1]])
    count_given_0 = (1 - flip) * others + flip * shifted
    count_given_1 = flip * others + (1 - flip) * shifted

    def excess(epsilon):
        scale = math.exp(epsilon)
        return (
            max(
                np.maximum(count_given_0 - scale * count_given_1, 0).sum(),
                np.maximum(count_given_1 - scale * count_given_0, 0).sum(),
            )
            - delta
        )

    exact = brentq(excess, 1e-6, epsilon0, xtol=1e-9)
    bound = shuffle_epsilon_numerical(epsilon0, n, delta)
    assert exact <= bound < epsilon0


def test_single_report_gets_no_amplification():
    epsilon = shuffle_epsilon_numerical(3.0, 1, 1e-9)
    assert 3.0 - 1e-6 < epsilon <= 3.0


def test_reshetova_2024_setting_numerical_bound_runs_fast_and_brackets_the_quoted_value():
    start = time.perf_counter()
    numerical = shuffle_epsilon_numerical(5.0, 400_000, 1e-6)
    elapsed = time.perf_counter() - start
    assert elapsed < 30.0
    assert numerical == pytest.approx(0.14143, abs=1e-4)
    # Reshetova et al. 2024 quote 0.353 (citing a 2023 follow-up); the two bounds of Feldman,
    # McMillan, Talwar 2021 bracket it.
    assert numerical < 0.353 < shuffle_epsilon_closed_form(5.0, 400_000, 1e-6)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"epsilon0": 0.0}, "epsilon0"),
        ({"epsilon0": -1.0}, "epsilon0"),
        ({"epsilon0": math.inf}, "epsilon0"),
        ({"epsilon0": math.nan}, "epsilon0"),
        ({"n": 0}, "n"),
        ({"n": -5}, "n"),
        ({"n": 2.5}, "n"),
        ({"n": True}, "n"),
        ({"delta": 0.0}, "delta"),
        ({"delta": 1.0}, "delta"),
        ({"delta": -1e-6}, "delta"),
        ({"delta": math.nan}, "delta"),
    ],
)
@pytest.mark.parametrize("bound", [shuffle_epsilon_closed_form, shuffle_epsilon_numerical])
def test_invalid_parameters_are_refused_naming_the_parameter(bound, kwargs, name):
    arguments = {"epsilon0": 1.0, "n": 100_000, "delta": 1e-6, **kwargs}
    with pytest.raises(ValueError, match=name):
        bound(**arguments)


def test_invalid_numerical_options_are_refused():
    with pytest.raises(ValueError, match="tolerance"):
        shuffle_epsilon_numerical(1.0, 1_000, 1e-6, tolerance=0.0)
    with pytest.raises(ValueError, match="epsilon"):
        shuffle_delta_numerical(1.0, 1_000, -0.1)
    with pytest.raises(ValueError, match="tail_mass"):
        shuffle_delta_numerical(1.0, 1_000, 0.1, tail_mass=-1.0)


def _account(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    build_parser(parser)
    args = parser.parse_args(argv)
    return args.func(args)


def test_account_shuffle_subcommand_reports_both_bounds():
    result = _account(["shuffle", "--epsilon0", "2", "--n", "10000", "--delta", "1e-6"])
    assert result["epsilon_closed_form"] == pytest.approx(
        shuffle_epsilon_closed_form(2.0, 10_000, 1e-6)
    )
    assert result["epsilon_numerical"] == pytest.approx(
        shuffle_epsilon_numerical(2.0, 10_000, 1e-6)
    )
    assert "replace-one" in result["guarantee"]


def test_account_shuffle_subcommand_explains_a_closed_form_out_of_range():
    result = _account(["shuffle", "--epsilon0", "8", "--n", "400000", "--delta", "1e-6"])
    assert result["epsilon_closed_form"] is None
    assert "validity range" in result["closed_form_error"]
    assert 0 < result["epsilon_numerical"] < 1
