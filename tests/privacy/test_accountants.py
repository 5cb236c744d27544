"""Accountants of the Poisson-subsampled Gaussian: against independent computations, searches
round-trip, the stateful interface is exact and cheap, bad inputs are refused."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from lightning_dpot.commands.account import build_parser
from lightning_dpot.privacy.accounting.accountants import (
    PLDAccountant,
    RDPAccountant,
    make_accountant,
)
from lightning_dpot.privacy.accounting.analysis.epsilon import (
    epsilon_of_history,
    subsampled_gaussian_epsilon,
)
from lightning_dpot.privacy.accounting.analysis.rdp_poisson import poisson_gaussian_rdp
from lightning_dpot.privacy.accounting.analysis.rdp_swor import swor_gaussian_rdp
from lightning_dpot.privacy.accounting.analysis.schemes import (
    DEFAULT_PLD_VALUE_DISCRETIZATION,
    DEFAULT_RDP_ORDERS,
    WITHOUT_REPLACEMENT,
    compress_history,
    swor_sample_rate,
)
from lightning_dpot.privacy.accounting.calibration import (
    max_steps,
    min_noise_multiplier,
)

MNIST_Q = 1 / 1200  # batch 50 of 60,000 (Cao et al. 2021, App. D)

# --------------------------------------------------------------------------------------------
# Independent computations (written from the papers, no dp-accounting)
# --------------------------------------------------------------------------------------------


def independent_poisson_gaussian_rdp(q: float, sigma: float, alpha: int) -> float:
    """Mironov, Talwar, Zhang 2019, Sec. 3.3, integer α:
    ρ_α = log Σ_k C(α,k) (1-q)^(α-k) q^k exp((k²-k)/(2σ²)) / (α-1), summed in log space."""
    terms = [
        math.lgamma(alpha + 1)
        - math.lgamma(k + 1)
        - math.lgamma(alpha - k + 1)
        + (alpha - k) * math.log1p(-q)
        + k * math.log(q)
        + (k * k - k) / (2 * sigma**2)
        for k in range(alpha + 1)
    ]
    top = max(terms)
    return (top + math.log(sum(math.exp(t - top) for t in terms))) / (alpha - 1)


def independent_subsampled_gaussian_epsilon(
    q: float, sigma: float, steps: int, delta: float
) -> float:
    """min over integer α in [2, 256] of T·ρ_α + log(1 - 1/α) - (log δ + log α)/(α - 1)
    (Canonne, Kamath, Steinke 2020, Prop. 12)."""
    return min(
        steps * independent_poisson_gaussian_rdp(q, sigma, a)
        + math.log1p(-1 / a)
        - (math.log(delta) + math.log(a)) / (a - 1)
        for a in range(2, 257)
    )


def exact_gaussian_epsilon(sigma: float, delta: float) -> float:
    """Exact ε(δ) of one Gaussian mechanism with sensitivity 1 (Balle & Wang 2018, Thm. 8):
    δ(ε) = Φ(1/(2σ) - εσ) - e^ε Φ(-1/(2σ) - εσ)."""

    def gap(eps: float) -> float:
        return (
            norm.cdf(0.5 / sigma - eps * sigma)
            - math.exp(eps) * norm.cdf(-0.5 / sigma - eps * sigma)
            - delta
        )

    return brentq(gap, 0.0, 100.0, xtol=1e-12)


# --------------------------------------------------------------------------------------------
# Settings of Cao et al. 2021
# --------------------------------------------------------------------------------------------

PAPER_TRIPLES = [
    # (sigma, q, steps, delta): MNIST σ = 1.5 and Fashion-MNIST σ = 1.9, batch 50 of 60,000;
    # 160,000 / 280,000 are the step counts the paper says reach ε = 10; CelebA q = 0.00038.
    (1.5, MNIST_Q, 1_200, 1e-5),
    (1.5, MNIST_Q, 16_000, 1e-5),
    (1.5, MNIST_Q, 160_000, 1e-5),
    (1.9, MNIST_Q, 1_200, 1e-5),
    (1.9, MNIST_Q, 280_000, 1e-5),
    (1.9, 0.00038, 1_700_000, 1e-6),
]


@pytest.mark.parametrize(("sigma", "q", "steps", "delta"), PAPER_TRIPLES)
def test_rdp_epsilon_matches_independent_binomial_expansion(sigma, q, steps, delta):
    assert subsampled_gaussian_epsilon(sigma, q, steps, delta, "rdp") == pytest.approx(
        independent_subsampled_gaussian_epsilon(q, sigma, steps, delta), abs=1e-3
    )


def test_paper_settings_reach_epsilon_about_one_not_ten():
    # The paper's σ, q and step counts give ε ≈ 1 at δ = 1e-5, not the reported 10
    # (docs/dp_sinkhorn.md).
    mnist = independent_subsampled_gaussian_epsilon(MNIST_Q, 1.5, 160_000, 1e-5)
    fashion = independent_subsampled_gaussian_epsilon(MNIST_Q, 1.9, 280_000, 1e-5)
    assert 0.95 < mnist < 1.05 and 0.95 < fashion < 1.05
    assert subsampled_gaussian_epsilon(1.5, MNIST_Q, 160_000, 1e-5, "pld") < mnist
    # ε = 10 would need ~57x the paper's MNIST step count.
    assert max_steps(1.5, MNIST_Q, 10.0, 1e-5) > 50 * 160_000


def test_rdp_curve_matches_independent_formula_at_integer_orders():
    # pins the curve dp-accounting's RdpAccountant gives the step's PoissonSampledDpEvent
    curve = poisson_gaussian_rdp(1.5, MNIST_Q)
    for index, alpha in enumerate(DEFAULT_RDP_ORDERS):
        if alpha.is_integer() and alpha <= 256:
            assert curve[index] == pytest.approx(
                independent_poisson_gaussian_rdp(MNIST_Q, 1.5, int(alpha)), rel=1e-9
            )


def test_pld_matches_exact_gaussian_without_subsampling():
    # q = 1: T steps of σ compose to one Gaussian with σ / sqrt(T), whose ε(δ) is exact.
    sigma, steps, delta = 4.0, 16, 1e-5
    exact = exact_gaussian_epsilon(sigma / math.sqrt(steps), delta)
    pld = subsampled_gaussian_epsilon(sigma, 1.0, steps, delta, "pld")
    assert exact <= pld <= exact + 1e-3
    assert subsampled_gaussian_epsilon(sigma, 1.0, steps, delta, "rdp") >= exact


@pytest.mark.parametrize(("sigma", "q", "steps", "delta"), PAPER_TRIPLES[:5])
def test_pld_is_tighter_than_rdp(sigma, q, steps, delta):
    rdp = subsampled_gaussian_epsilon(sigma, q, steps, delta, "rdp")
    pld = subsampled_gaussian_epsilon(sigma, q, steps, delta, "pld")
    assert pld < rdp
    if steps >= 100_000:  # many compositions: RDP is nearly tight, within ~10 %
        assert pld > 0.85 * rdp


def test_zero_steps_spend_nothing():
    assert subsampled_gaussian_epsilon(1.0, 0.1, 0, 1e-5) == 0.0
    assert subsampled_gaussian_epsilon(1.0, 0.1, 0, 1e-5, "pld") == 0.0
    assert make_accountant("pld").get_epsilon(1e-5) == 0.0


# --------------------------------------------------------------------------------------------
# Searches
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sigma", "q", "target", "accountant"),
    [(1.5, MNIST_Q, 1.0, "rdp"), (2.0, 0.1, 1.5, "rdp"), (1.5, MNIST_Q, 0.5, "pld")],
)
def test_max_steps_is_the_last_step_within_target(sigma, q, target, accountant):
    steps = max_steps(sigma, q, target, 1e-5, accountant)
    assert steps > 0
    assert subsampled_gaussian_epsilon(sigma, q, steps, 1e-5, accountant) <= target
    assert subsampled_gaussian_epsilon(sigma, q, steps + 1, 1e-5, accountant) > target


def test_max_steps_is_zero_when_one_step_exceeds_and_capped_by_search_limit():
    assert max_steps(0.5, 1.0, 1.0, 1e-5) == 0
    assert max_steps(50.0, 1e-4, 10.0, 1e-5, search_limit=1000) == 1000


@pytest.mark.parametrize(
    ("accountant", "steps", "target", "tolerance"),
    [("rdp", 160_000, 1.0, 1e-3), ("pld", 1_200, 0.1, 1e-2)],
)
def test_min_noise_multiplier_is_the_smallest_within_tolerance(
    accountant, steps, target, tolerance
):
    sigma = min_noise_multiplier(MNIST_Q, steps, target, 1e-5, accountant, tolerance=tolerance)
    assert subsampled_gaussian_epsilon(sigma, MNIST_Q, steps, 1e-5, accountant) <= target
    assert subsampled_gaussian_epsilon(sigma - tolerance, MNIST_Q, steps, 1e-5, accountant) > target


def test_max_steps_and_min_noise_round_trip():
    steps = max_steps(1.5, MNIST_Q, 1.0, 1e-5)
    sigma = min_noise_multiplier(MNIST_Q, steps, 1.0, 1e-5, tolerance=1e-4)
    assert 1.5 - 1e-3 < sigma <= 1.5 + 1e-4


def test_min_noise_multiplier_refuses_an_unreachable_target():
    with pytest.raises(ValueError, match="target_epsilon"):
        min_noise_multiplier(1.0, 10, 1e-3, 1e-5, max_noise_multiplier=10.0)


# --------------------------------------------------------------------------------------------
# Stateful accountants
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rdp", "pld"])
def test_accountant_equals_pure_function_on_a_mixed_history(name):
    accountant = make_accountant(name)
    accountant.step(1.5, MNIST_Q, 500)
    accountant.step(2.0, 0.01, 20)
    accountant.step(1.5, MNIST_Q)
    expected = epsilon_of_history(
        [(1.5, MNIST_Q, 500), (2.0, 0.01, 20), (1.5, MNIST_Q, 1)], 1e-5, name
    )
    assert accountant.get_epsilon(1e-5) == pytest.approx(expected, rel=1e-9)
    assert accountant.steps == 521
    assert accountant.mechanism == "poisson_subsampled_gaussian"
    assert accountant.adjacency == "add_or_remove_one"


@pytest.mark.parametrize("name", ["rdp", "pld"])
def test_epsilon_of_history_is_dp_accountings_public_accountant(name):
    """Pins the cached one-step analyses composed here (Poisson) against dp-accounting's
    RdpAccountant / PLDAccountant composing the whole mixed history."""
    import dp_accounting

    runs = [(1.5, MNIST_Q, 500), (2.0, 0.01, 20), (1.5, MNIST_Q, 1)]
    relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
    if name == "rdp":
        dpa = dp_accounting.rdp.RdpAccountant(list(DEFAULT_RDP_ORDERS), relation)
    else:
        dpa = dp_accounting.pld.PLDAccountant(relation, DEFAULT_PLD_VALUE_DISCRETIZATION)
    gaussian = dp_accounting.GaussianDpEvent
    events = [
        dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, gaussian(s)), c)
        for s, q, c in runs
    ]
    dpa.compose(dp_accounting.ComposedDpEvent(events))
    assert epsilon_of_history(runs, 1e-5, name) == pytest.approx(dpa.get_epsilon(1e-5), rel=1e-9)


def test_identical_steps_are_stored_as_one_run():
    accountant = RDPAccountant()
    for _ in range(5_000):
        accountant.step(1.5, MNIST_Q)
    assert accountant.history == [(1.5, MNIST_Q, 5_000)]
    assert accountant.get_epsilon(1e-5) == pytest.approx(
        subsampled_gaussian_epsilon(1.5, MNIST_Q, 5_000, 1e-5)
    )


def test_epsilon_if_does_not_record():
    accountant = RDPAccountant()
    accountant.step(1.5, MNIST_Q, 100)
    after_one_more = accountant.epsilon_if(1e-5, 1.5, MNIST_Q)
    assert accountant.steps == 100
    accountant.step(1.5, MNIST_Q)
    assert accountant.get_epsilon(1e-5) == after_one_more


def test_max_additional_steps_counts_from_the_history():
    accountant = RDPAccountant()
    accountant.step(1.5, MNIST_Q, 1_000)
    total = max_steps(1.5, MNIST_Q, 1.0, 1e-5)
    assert accountant.max_additional_steps(1.5, MNIST_Q, 1.0, 1e-5) == total - 1_000


def test_state_dict_is_json_and_resumes_exactly_even_across_accountants():
    accountant = RDPAccountant()
    accountant.step(1.5, MNIST_Q, 1_000)
    accountant.step(2.0, 0.01, 3)
    state = json.loads(json.dumps(accountant.state_dict()))
    restored = RDPAccountant()
    restored.load_state_dict(state)
    assert restored.history == accountant.history
    assert restored.get_epsilon(1e-5) == accountant.get_epsilon(1e-5)
    as_pld = PLDAccountant()
    as_pld.load_state_dict(state)
    assert as_pld.get_epsilon(1e-5) == pytest.approx(
        epsilon_of_history(accountant.history, 1e-5, "pld")
    )


def test_compress_history_merges_neighbours_and_drops_empty_runs():
    assert compress_history([(1.0, 0.1, 2), (1.0, 0.1, 0), (1.0, 0.1, 3), (2.0, 0.1, 1)]) == [
        (1.0, 0.1, 5),
        (2.0, 0.1, 1),
    ]


# --------------------------------------------------------------------------------------------
# Errors name the parameter, the value and the range
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"noise_multiplier": 0.0}, r"noise_multiplier must be a finite number > 0, got 0\.0"),
        ({"noise_multiplier": math.nan}, "noise_multiplier"),
        ({"sample_rate": 1.5}, r"sample_rate must lie in \(0, 1\], got 1\.5"),
        ({"sample_rate": 0.0}, "sample_rate"),
        ({"steps": -1}, r"num_steps must be an integer >= 0, got -1"),
        ({"steps": 2.5}, "num_steps"),
        ({"delta": 0.0}, r"delta must lie in the open interval \(0, 1\), got 0\.0"),
        ({"accountant": "prv"}, r"accountant must be one of \['rdp', 'pld'\], got 'prv'"),
    ],
)
def test_bad_inputs_are_refused_with_a_message(kwargs, match):
    arguments = {"noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 10, "delta": 1e-5}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=match):
        subsampled_gaussian_epsilon(**arguments)


def test_bad_search_and_factory_inputs_are_refused():
    with pytest.raises(ValueError, match="target_epsilon"):
        max_steps(1.0, 0.1, -1.0, 1e-5)
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        min_noise_multiplier(0.1, 0, 1.0, 1e-5)
    with pytest.raises(ValueError, match="accountant must be one of"):
        make_accountant("moments")
    with pytest.raises(ValueError, match="orders"):
        RDPAccountant(orders=[0.5, 2.0])
    with pytest.raises(ValueError, match="history run"):
        RDPAccountant().load_state_dict({"history": [[1.0, 0.1]]})
    accountant = RDPAccountant()
    with pytest.raises(ValueError, match="sample_rate"):
        accountant.step(1.0, 2.0)
    assert accountant.steps == 0


def test_rdp_accountant_caches_one_curve_per_setting():
    accountant = RDPAccountant()
    accountant.step(1.5, MNIST_Q, 10)
    accountant.get_epsilon(1e-5)
    accountant.epsilon_if(1e-5, 1.5, MNIST_Q, 5)
    assert list(accountant._curves) == [(1.5, MNIST_Q)]
    assert np.all(np.isfinite(accountant._curves[(1.5, MNIST_Q)]))


# --------------------------------------------------------------------------------------------
# dpot account sgm
# --------------------------------------------------------------------------------------------


def _account(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    build_parser(parser)
    args = parser.parse_args(["sgm", *argv])
    return args.func(args)


def test_account_sgm_prints_epsilon_under_both_accountants():
    result = _account(
        ["--noise_multiplier", "1.5", "--sample_rate", str(MNIST_Q), "--steps", "16000"]
        + ["--delta", "1e-5"]
    )
    assert result["epsilon_rdp"] == subsampled_gaussian_epsilon(1.5, MNIST_Q, 16_000, 1e-5, "rdp")
    assert result["epsilon_pld"] == subsampled_gaussian_epsilon(1.5, MNIST_Q, 16_000, 1e-5, "pld")
    assert result["adjacency"] == "add_or_remove_one"
    json.dumps(result)


def test_account_sgm_target_gives_largest_steps_or_smallest_noise():
    common = ["--sample_rate", str(MNIST_Q), "--delta", "1e-5", "--target_epsilon", "1"]
    steps = _account([*common, "--noise_multiplier", "1.5"])
    assert steps["steps"] == max_steps(1.5, MNIST_Q, 1.0, 1e-5)
    assert steps["epsilon_rdp"] <= 1.0 and steps["within_target"]
    noise = _account([*common, "--steps", "160000", "--tolerance", "0.01"])
    assert noise["noise_multiplier"] == min_noise_multiplier(
        MNIST_Q, 160_000, 1.0, 1e-5, tolerance=0.01
    )
    assert noise["epsilon_rdp"] <= 1.0


def test_account_sgm_refuses_an_incomplete_question():
    with pytest.raises(ValueError, match="give --noise_multiplier and --steps"):
        _account(["--sample_rate", "0.01", "--delta", "1e-5", "--steps", "10"])
    with pytest.raises(ValueError, match="sample_rate"):
        _account(
            ["--noise_multiplier", "1", "--sample_rate", "2", "--steps", "1"] + ["--delta", "1e-5"]
        )


# --------------------------------------------------------------------------------------------
# Fixed-size sampling without replacement (replace-one; Wang, Balle, Kasiviswanathan 2019)
# --------------------------------------------------------------------------------------------


def independent_gaussian_epsilon(z: float, steps: int, delta: float) -> float:
    """T steps of the plain Gaussian (multiplier z): ρ_α = T·α/(2z²), converted to ε at δ by
    ε = min_α ρ_α + log(1-1/α) - (log δ + log α)/(α-1) (Canonne, Kamath, Steinke 2020, Prop. 12),
    over the same orders. Written by hand, no dp-accounting."""
    orders = np.asarray(DEFAULT_RDP_ORDERS)
    rho = steps * orders / (2.0 * z**2)
    eps = rho + np.log1p(-1.0 / orders) - (math.log(delta) + np.log(orders)) / (orders - 1.0)
    return float(max(0.0, eps.min()))


@pytest.mark.parametrize(
    ("z", "steps", "delta"), [(1.0, 1, 1e-5), (2.5, 40, 1e-6), (8.0, 500, 1e-5)]
)
def test_swor_with_full_batch_is_the_plain_gaussian(z, steps, delta):
    full = swor_sample_rate(137, 137)  # b = n: the whole dataset at every step
    assert subsampled_gaussian_epsilon(
        z, full, steps, delta, sampling=WITHOUT_REPLACEMENT
    ) == pytest.approx(independent_gaussian_epsilon(z, steps, delta), rel=1e-9)
    curve = swor_gaussian_rdp(z, 1.0)
    np.testing.assert_allclose(curve, np.asarray(DEFAULT_RDP_ORDERS) / (2 * z**2), rtol=1e-9)


def test_swor_epsilon_is_monotone_in_the_batch_fraction_and_the_steps():
    n, z, steps, delta = 1000, 1.2, 200, 1e-5
    sizes = (1, 10, 50, 250, 600, 999, 1000)
    eps = [
        subsampled_gaussian_epsilon(z, b / n, steps, delta, sampling=WITHOUT_REPLACEMENT)
        for b in sizes
    ]
    assert all(a <= b for a, b in zip(eps, eps[1:], strict=False))
    assert eps[0] < eps[1] < eps[2] < eps[3]
    assert eps[-1] == pytest.approx(independent_gaussian_epsilon(z, steps, delta), rel=1e-9)
    assert (
        subsampled_gaussian_epsilon(z, 50 / n, steps // 2, delta, sampling=WITHOUT_REPLACEMENT)
        < eps[2]
    )
    assert subsampled_gaussian_epsilon(z, 50 / n, 0, delta, sampling=WITHOUT_REPLACEMENT) == 0.0
    # replace-one subsampling never beats the add/remove Poisson figure at the same rate
    assert eps[2] >= subsampled_gaussian_epsilon(z, 50 / n, steps, delta)


def test_min_noise_multiplier_without_replacement_is_the_smallest_within_tolerance():
    n, b, steps, target, delta = 4000, 250, 560, 10.0, 1e-5
    sigma = min_noise_multiplier(
        b / n, steps, target, delta, sampling=WITHOUT_REPLACEMENT, tolerance=1e-3
    )
    assert (
        subsampled_gaussian_epsilon(sigma, b / n, steps, delta, sampling=WITHOUT_REPLACEMENT)
        <= target
    )
    assert (
        subsampled_gaussian_epsilon(sigma - 1e-3, b / n, steps, delta, sampling=WITHOUT_REPLACEMENT)
        > target
    )


def test_swor_accountant_records_the_scheme_and_refuses_mixing_and_pld():
    accountant = RDPAccountant(sampling="without_replacement")
    assert accountant.adjacency == "replace_one"
    accountant.step(1.5, 250 / 4000, 30)
    assert accountant.get_epsilon(1e-5) == pytest.approx(
        subsampled_gaussian_epsilon(1.5, 250 / 4000, 30, 1e-5, sampling=WITHOUT_REPLACEMENT),
        rel=1e-9,
    )
    state = json.loads(json.dumps(accountant.state_dict()))
    assert state["sampling"] == "without_replacement" and state["adjacency"] == "replace_one"
    resumed = RDPAccountant()
    resumed.load_state_dict(state)
    assert resumed.sampling == "without_replacement"
    assert resumed.get_epsilon(1e-5) == accountant.get_epsilon(1e-5)
    with pytest.raises(ValueError, match="cannot be composed"):
        accountant.sampling = "poisson"
    with pytest.raises(ValueError, match="not supported by the 'pld'"):
        PLDAccountant(sampling="without_replacement")
    with pytest.raises(ValueError, match="not supported by the 'pld'"):
        PLDAccountant().load_state_dict(state)
    with pytest.raises(ValueError, match="accountant must be one of"):
        subsampled_gaussian_epsilon(1.5, 250 / 4000, 30, 1e-5, "pld", WITHOUT_REPLACEMENT)
    with pytest.raises(ValueError, match="batch_size must be in"):
        swor_sample_rate(10, 11)
    with pytest.raises(ValueError, match="sampling must be one of"):
        RDPAccountant(sampling="shuffle")
    legacy = {"history": [[1.5, MNIST_Q, 3]]}  # a state that does not record its sampling
    old = RDPAccountant()
    old.load_state_dict(legacy)
    assert old.sampling == "poisson" and old.adjacency == "add_or_remove_one"


def test_swor_curve_is_dp_accountings_replace_one_accountant_where_not_capped():
    """Pins the capped curve against dp-accounting's RdpAccountant where the cap is inactive."""
    import dp_accounting

    n, b, z, steps, delta = 4000, 250, 1.3, 300, 1e-5
    dpa = dp_accounting.rdp.RdpAccountant(
        orders=list(DEFAULT_RDP_ORDERS),
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE,
    )
    event = dp_accounting.SampledWithoutReplacementDpEvent(n, b, dp_accounting.GaussianDpEvent(z))
    dpa.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    assert subsampled_gaussian_epsilon(
        z, b / n, steps, delta, sampling=WITHOUT_REPLACEMENT
    ) == pytest.approx(dpa.get_epsilon(delta), rel=1e-9)


def test_an_optimal_order_at_the_edge_of_the_grid_warns():
    """As Opacus: when the best α is the first or last order, ε may be loose."""
    import warnings

    from lightning_dpot.privacy.accounting.analysis.conversions import rdp_to_epsilon

    orders = [2.0, 3.0]
    with pytest.warns(UserWarning, match=r"α=3 is the largest of the grid \[2, 3\]"):
        rdp_to_epsilon(poisson_gaussian_rdp(0.5, 1.0, orders), 1e-5, orders)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Cao et al. 2021's setting: inside the default grid
        assert subsampled_gaussian_epsilon(1.5, 1 / 1200, 160_000, 1e-5) == pytest.approx(
            1.0147, abs=1e-4
        )
