"""The accountants run on dp-accounting's public API: the steps are its DpEvents, composed by
its RdpAccountant / PLDAccountant and calibrated by its calibrate_dp_mechanism, with no private
name of the library anywhere in the package, and the numbers are those computed before."""

from __future__ import annotations

import ast
from pathlib import Path

import dp_accounting
import pytest

from lightning_dpot.privacy.accounting.analysis.dp_events import history_event, step_event
from lightning_dpot.privacy.accounting.analysis.epsilon import (
    epsilon_of_history,
    subsampled_gaussian_epsilon,
)
from lightning_dpot.privacy.accounting.analysis.rdp_poisson import poisson_gaussian_rdp
from lightning_dpot.privacy.accounting.analysis.rdp_swor import swor_gaussian_rdp
from lightning_dpot.privacy.accounting.analysis.schemes import (
    DEFAULT_PLD_VALUE_DISCRETIZATION,
    DEFAULT_RDP_ORDERS,
    POISSON,
    WITHOUT_REPLACEMENT,
)
from lightning_dpot.privacy.accounting.calibration import min_noise_multiplier

PACKAGE = Path(__file__).resolve().parents[2] / "lightning_dpot"
MNIST_Q = 1 / 1200
MIXED = [(1.5, MNIST_Q, 500), (2.0, 0.01, 20), (1.5, MNIST_Q, 1)]
RELATIONS = {
    POISSON: dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    WITHOUT_REPLACEMENT: dp_accounting.NeighboringRelation.REPLACE_ONE,
}


# --------------------------------------------------------------------------------------------
# Only public names
# --------------------------------------------------------------------------------------------


def _root(node: ast.AST) -> ast.AST:
    """The name an attribute chain, call or subscript starts from (``a`` of ``a.b(c)[d].e``)."""
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node


def private_dp_accounting_names(source: str) -> list[str]:
    """``_``-prefixed names reached from dp-accounting in ``source``: imported, read as an
    attribute of something imported from it, or of a value assigned from such an expression."""
    tree = ast.parse(source)
    bound: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "dp_accounting":
                    found += [part for part in alias.name.split(".") if part.startswith("_")]
                    bound.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dp_accounting"):
            found += [part for part in node.module.split(".") if part.startswith("_")]
            found += [alias.name for alias in node.names if alias.name.startswith("_")]
            bound |= {alias.asname or alias.name for alias in node.names}
    grown = True
    while grown:  # values assigned from dp-accounting expressions carry its objects
        before = len(bound)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                root = _root(node.value)
                if isinstance(root, ast.Name) and root.id in bound:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    bound |= {t.id for t in targets if isinstance(t, ast.Name)}
        grown = len(bound) > before
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            root = _root(node.value)
            if isinstance(root, ast.Name) and root.id in bound:
                found.append(f"{root.id}…{node.attr}")
    return found


def test_the_scan_finds_private_names_however_they_are_reached():
    source = """
import dp_accounting
from dp_accounting.rdp import rdp_privacy_accountant as module
from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_sample_wor_gaussian
accountant = dp_accounting.rdp.RdpAccountant()
curve = module._compute_rdp_poisson_subsampled_gaussian(0.1, 1.0, [2.0])
state = accountant._rdp
chained = dp_accounting.pld.PLDAccountant().compose(event)._pld
"""
    assert sorted(private_dp_accounting_names(source)) == [
        "_compute_rdp_sample_wor_gaussian",
        "accountant…_rdp",
        "dp_accounting…_pld",
        "module…_compute_rdp_poisson_subsampled_gaussian",
    ]
    assert private_dp_accounting_names("import dp_accounting\nx = dp_accounting.rdp.rdp") == []


def test_the_package_reaches_no_private_dp_accounting_name():
    offenders = {
        str(path.relative_to(PACKAGE)): names
        for path in sorted(PACKAGE.rglob("*.py"))
        if (names := private_dp_accounting_names(path.read_text()))
    }
    assert offenders == {}


# --------------------------------------------------------------------------------------------
# The public path is the one taken
# --------------------------------------------------------------------------------------------


class _RecordingRdpAccountant(dp_accounting.rdp.RdpAccountant):
    """dp-accounting's RdpAccountant, recording the relation and every event it composes."""

    composed: list[tuple[dp_accounting.NeighboringRelation, dp_accounting.DpEvent]] = []

    def compose(self, event, count=1):
        type(self).composed.append((self.neighboring_relation, event))
        return super().compose(event, count)


@pytest.fixture
def recording_rdp(monkeypatch):
    _RecordingRdpAccountant.composed = []
    monkeypatch.setattr(dp_accounting.rdp, "RdpAccountant", _RecordingRdpAccountant)
    return _RecordingRdpAccountant.composed


def test_one_step_rdp_curves_are_dp_accountings_accountant_on_the_steps_events(recording_rdp):
    poisson_gaussian_rdp(1.5, MNIST_Q)
    assert recording_rdp == [
        (
            dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
            dp_accounting.PoissonSampledDpEvent(MNIST_Q, dp_accounting.GaussianDpEvent(1.5)),
        )
    ]
    recording_rdp.clear()
    swor_gaussian_rdp(1.3, 250 / 4000)
    gaussian = dp_accounting.GaussianDpEvent(1.3)
    assert recording_rdp == [
        (
            dp_accounting.NeighboringRelation.REPLACE_ONE,
            dp_accounting.SampledWithoutReplacementDpEvent(16, 1, gaussian),  # 250/4000 = 1/16
        ),
        (dp_accounting.NeighboringRelation.REPLACE_ONE, gaussian),  # the cap
    ]


def test_the_noise_search_is_dp_accountings_calibration(monkeypatch):
    calls = []
    calibrate = dp_accounting.calibrate_dp_mechanism

    def recording(make_accountant, make_event, *args, **kwargs):
        sigma = calibrate(make_accountant, make_event, *args, **kwargs)
        calls.append((type(make_accountant()), make_event(sigma), sigma))
        return sigma

    monkeypatch.setattr(dp_accounting, "calibrate_dp_mechanism", recording)
    sigma = min_noise_multiplier(0.01, 200, 2.0, 1e-5)
    ((accountant, event, calibrated),) = calls
    assert accountant is dp_accounting.rdp.RdpAccountant and calibrated == sigma
    step = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(sigma))
    assert event == dp_accounting.SelfComposedDpEvent(step, 200)


@pytest.mark.parametrize(
    ("accountant", "sampling", "runs"),
    [
        ("rdp", POISSON, MIXED),
        ("pld", POISSON, MIXED),
        ("rdp", WITHOUT_REPLACEMENT, [(1.3, 250 / 4000, 300), (2.0, 64 / 1000, 50)]),
    ],
)
def test_epsilon_of_history_is_dp_accountings_accountant_on_the_history_event(
    accountant, sampling, runs
):
    """Where the cap of the without-replacement curve is inactive (γ ≤ 1/16 here)."""
    relation = RELATIONS[sampling]
    if accountant == "rdp":
        dpa = dp_accounting.rdp.RdpAccountant(list(DEFAULT_RDP_ORDERS), relation)
    else:
        dpa = dp_accounting.pld.PLDAccountant(relation, DEFAULT_PLD_VALUE_DISCRETIZATION)
    dpa.compose(history_event(runs, sampling))
    assert epsilon_of_history(runs, 1e-5, accountant, sampling) == pytest.approx(
        dpa.get_epsilon(1e-5), rel=1e-12
    )


@pytest.mark.parametrize(("sigma", "batch", "steps"), [(1.2, 300, 200), (3.0, 900, 10)])
def test_one_capped_run_is_the_smaller_of_two_dp_accounting_bounds(sigma, batch, steps):
    """What the noise search without replacement relies on: for one run, ε of the capped curve
    is the smaller ε of the subsampled and the plain Gaussian event (each bound wins once here)."""

    def epsilon(event):
        dpa = dp_accounting.rdp.RdpAccountant(
            list(DEFAULT_RDP_ORDERS), RELATIONS[WITHOUT_REPLACEMENT]
        )
        return dpa.compose(dp_accounting.SelfComposedDpEvent(event, steps)).get_epsilon(1e-5)

    gaussian = dp_accounting.GaussianDpEvent(sigma)
    subsampled = epsilon(dp_accounting.SampledWithoutReplacementDpEvent(1000, batch, gaussian))
    plain = epsilon(gaussian)
    capped = subsampled_gaussian_epsilon(
        sigma, batch / 1000, steps, 1e-5, "rdp", WITHOUT_REPLACEMENT
    )
    assert capped == min(subsampled, plain)
    assert capped < max(subsampled, plain)


@pytest.mark.parametrize(
    "sample_rate", [250 / 4000, 1 / 3, 999 / 1000, 12_345 / 6_789_012, 0.1234567891234, 1.0]
)
def test_a_without_replacement_step_event_keeps_the_batch_fraction_exactly(sample_rate):
    event = step_event(1.0, sample_rate, WITHOUT_REPLACEMENT)
    assert 1 <= event.sample_size <= event.source_dataset_size
    assert event.sample_size / event.source_dataset_size == sample_rate


# --------------------------------------------------------------------------------------------
# The numbers before the public API
# --------------------------------------------------------------------------------------------

# ε computed by the package before it used dp-accounting's public API only: its private
# _compute_rdp_poisson_subsampled_gaussian / _compute_rdp_sample_wor_gaussian (capped at α/(2σ²))
# over DEFAULT_RDP_ORDERS and compute_epsilon, or from_gaussian_mechanism PLDs (interval 1e-4),
# dp-accounting 0.6.0. The public path reproduced every one to the last bit; rel=1e-12 leaves room
# for libm differences between machines.
BEFORE = [
    # (accountant, sampling, runs, delta, epsilon)
    ("rdp", POISSON, [(1.5, MNIST_Q, 160_000)], 1e-5, 1.0146905804197286),
    ("pld", POISSON, [(1.5, MNIST_Q, 160_000)], 1e-5, 0.9296463328714183),
    ("rdp", POISSON, [(1.0, 0.01, 1_000)], 1e-5, 2.101366525420273),
    ("pld", POISSON, [(1.0, 0.01, 1_000)], 1e-5, 1.828243645591767),
    ("rdp", POISSON, [(0.8, 256 / 60_000, 10_000)], 1e-6, 4.761919666274063),
    ("rdp", POISSON, [(4.0, 0.25, 50)], 1e-5, 2.031575835359912),
    ("pld", POISSON, [(4.0, 0.25, 50)], 1e-5, 1.8526873223129852),
    ("rdp", POISSON, MIXED, 1e-5, 0.24931826517928452),
    ("pld", POISSON, MIXED, 1e-5, 0.09801994240323475),
    ("rdp", WITHOUT_REPLACEMENT, [(1.3, 250 / 4000, 300)], 1e-5, 10.787687780990591),
    ("rdp", WITHOUT_REPLACEMENT, [(2.0, 64 / 1000, 2_000)], 1e-6, 20.283694757486604),
    # the cap decides: the plain Gaussian's ε, as for b = n
    ("rdp", WITHOUT_REPLACEMENT, [(1.2, 999 / 1000, 200)], 1e-5, 123.91059232459939),
    ("rdp", WITHOUT_REPLACEMENT, [(1.2, 600 / 1000, 200)], 1e-5, 123.91059232459939),
    ("rdp", WITHOUT_REPLACEMENT, [(1.2, 0.999, 100), (1.5, 0.0625, 300)], 1e-5, 75.59142865781934),
]


@pytest.mark.parametrize(("accountant", "sampling", "runs", "delta", "epsilon"), BEFORE)
def test_epsilon_is_the_value_computed_before(accountant, sampling, runs, delta, epsilon):
    # PLD composes by FFT, whose last bits move with the numpy/scipy versions installed (5e-9
    # relative from the recorded values with numpy 2.4.6, scipy 1.17.1); RDP keeps rel=1e-12.
    rel = 1e-12 if accountant == "rdp" else 1e-7
    assert epsilon_of_history(runs, delta, accountant, sampling) == pytest.approx(epsilon, rel=rel)


@pytest.mark.parametrize(
    ("arguments", "tolerance", "before"),
    [
        # before: the upper end of the final bisection bracket (dp-accounting 0.6.0, same ε);
        # measured |new − before| = 1.4e-4 and 3.7e-4: both lie within tolerance of the optimum
        ((MNIST_Q, 160_000, 1.0, 1e-5, "rdp", POISSON), 1e-3, 1.5166015625),
        ((0.999, 200, 50.0, 1e-5, "rdp", WITHOUT_REPLACEMENT), 1e-3, 2.1982421875),
    ],
)
def test_the_smallest_noise_is_the_one_found_before_to_within_the_tolerance(
    arguments, tolerance, before
):
    q, steps, target, delta, accountant, sampling = arguments
    sigma = min_noise_multiplier(*arguments, tolerance=tolerance)
    assert sigma == pytest.approx(before, abs=tolerance)
    assert subsampled_gaussian_epsilon(sigma, q, steps, delta, accountant, sampling) <= target
    after = subsampled_gaussian_epsilon(sigma - tolerance, q, steps, delta, accountant, sampling)
    assert after > target
