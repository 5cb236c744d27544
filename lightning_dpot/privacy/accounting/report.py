"""The central-DP privacy report: what a run released and the (ε, δ) it spent, as plain JSON.

``PrivacyAccountantCallback`` is the only writer of
``privacy_report.json`` and of the ``privacy`` section of ``report.json``; it calls
``privacy_report`` with what it composed and ``write_privacy_report`` at the end of
training. This module only formats those facts.

The report states the adjacency, the assumption that the dataset size N is public
(``DATASET_SIZE_ASSUMPTION``), ε under the driving accountant and under each further one
that can analyse the sampling scheme, the accountants' settings and library, the module's facts
(sensitivity, noise source, whether any seed is public, the events each release object emitted),
the run's release journal, what lies outside the guarantee, and the exception that ended the run
if one did.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from lightning_dpot.privacy.accounting.accountants import PrivacyAccountant, make_accountant
from lightning_dpot.privacy.accounting.analysis.schemes import (
    DEFAULT_PLD_VALUE_DISCRETIZATION,
    DEFAULT_RDP_ORDERS,
)
from lightning_dpot.privacy.events import GaussianRelease

DATASET_SIZE_ASSUMPTION = (
    "the dataset size N is public: the sample rate q, the batch sizes and the checkpoints "
    "reveal it; the guarantee covers the records, not their number"
)


def _library() -> str:
    try:
        return f"dp-accounting {version('dp-accounting')}"
    except PackageNotFoundError:  # pragma: no cover - installed with the package
        return "dp-accounting"


def privacy_report(
    accountant: PrivacyAccountant,
    one_shot: Sequence[GaussianRelease],
    *,
    epsilon: float | None,
    delta: float | None,
    target_epsilon: float | None,
    also_report: Sequence[str],
    swor_sizes: tuple[int | None, int | None],
    releases: int,
    stopped_by_budget: bool,
    module_facts: dict[str, Any],
    journal: str | None = None,
    outside_the_guarantee: Sequence[str] = (),
    ended_by: str | None = None,
    ledger: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The privacy section of ``report.json`` and ``privacy_report.json`` (plain JSON).

    Args:
        accountant: the driving accountant, holding the composed subsampled steps.
        one_shot: the composed one-shot ``GaussianRelease``
            (at most one, and then ``accountant`` is empty).
        epsilon: ε spent at ``delta`` (the analytic Gaussian mechanism's for a one-shot
            release); ``None`` when δ is unknown.
        also_report: further accountants whose ε is reported as ``epsilon_<name>`` (``None``
            where it cannot analyse the scheme).
        swor_sizes: ``(dataset_size, batch_size)`` of sampling without replacement, else
            ``(None, None)``.
        releases: events composed; ``stopped_by_budget``: whether training stopped at the
            target; ``module_facts``: the module's
            ``privacy_facts``.
        journal: the run's release journal (``lightning_dpot.privacy.accounting.journal``).
        outside_the_guarantee: what the run used or produced that the (ε, δ) does not cover.
        ended_by: the exception that ended the run, ``None`` when it ended normally.
        ledger: the run's entry in its data module's privacy ledger and the total of every
            release of the same records (``None`` where the data module keeps no ledger).

    ``history`` lists the subsampled runs ``[noise_multiplier, sample_rate, count]``, and
    ``noise_multiplier`` / ``sample_rate`` are ``None`` when they changed; ``events`` counts
    the composed events by kind.
    """
    history = accountant.history
    settings = {(sigma, q) for sigma, q, _ in history}
    sigma, q = next(iter(settings)) if len(settings) == 1 else (None, None)
    if one_shot:
        (event,) = one_shot
        mechanism, adjacency = "gaussian, once (analytic; Balle & Wang 2018)", event.adjacency
        sigma, epsilons = event.noise_multiplier, {"epsilon_analytic": epsilon}
    else:
        mechanism, adjacency = accountant.mechanism, accountant.adjacency
        epsilons = {f"epsilon_{accountant.name}": epsilon}
        for name in also_report:
            other = make_accountant(name)
            if delta is None or accountant.sampling not in other.samplings:
                epsilons[f"epsilon_{name}"] = None  # e.g. no PLD for sampling w/o replacement
                continue
            other.load_state_dict(accountant.state_dict())
            epsilons[f"epsilon_{name}"] = other.get_epsilon(delta)
    kinds = Counter(type(e).__name__ for e in one_shot)
    if history:
        kinds["SubsampledGaussianStep"] = accountant.steps
    return {
        "notion": "central",
        "mechanism": mechanism,
        "adjacency": adjacency,
        "assumptions": [DATASET_SIZE_ASSUMPTION],
        "sampling": None if one_shot else accountant.sampling,
        "dataset_size": swor_sizes[0],
        "batch_size": swor_sizes[1],
        "noise_multiplier": sigma,
        "sample_rate": q,
        "releases": releases,
        "events": dict(kinds),
        "history": [list(run) for run in history],
        "delta": delta,
        "target_epsilon": target_epsilon,
        "accountant": "analytic" if one_shot else accountant.name,
        "epsilon": epsilon if epsilon is None or math.isfinite(epsilon) else str(epsilon),
        **epsilons,
        "stopped_by_privacy_budget": stopped_by_budget,
        "accountant_settings": {
            "rdp_orders": {
                "min": min(DEFAULT_RDP_ORDERS),
                "max": max(DEFAULT_RDP_ORDERS),
                "count": len(DEFAULT_RDP_ORDERS),
            },
            "pld_value_discretization_interval": DEFAULT_PLD_VALUE_DISCRETIZATION,
        },
        "library": _library(),
        "module": module_facts,
        "journal": journal,
        "outside_the_guarantee": list(outside_the_guarantee),
        "ended_by": ended_by,
        "ledger": ledger,
    }


def write_privacy_report(path: Path, report: dict[str, Any]) -> None:
    """Write ``report`` as indented, key-sorted JSON to ``path`` (parents created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True, default=str))


#: Report keys that describe this machine rather than the guarantee: the privacy ledger (its
#: total over every release of the same records is a function of which records other releases
#: held, without noise) and the release journal. They stay in the run directory.
LOCAL_KEYS = ("ledger", "journal")
LOCAL_PATH = "<local path>"


def shareable_report(report: Any) -> Any:
    """``report`` (a privacy report, or a run's ``report.json``, at any depth) as it may leave
    the machine — embedded in an exported generator or uploaded as an artifact: without the
    ``LOCAL_KEYS`` and with every absolute path replaced by ``LOCAL_PATH``."""
    if isinstance(report, dict):
        return {k: shareable_report(v) for k, v in report.items() if k not in LOCAL_KEYS}
    if isinstance(report, list):
        return [shareable_report(v) for v in report]
    if isinstance(report, str) and (report.startswith(("/", "~")) or Path(report).is_absolute()):
        return LOCAL_PATH
    return report
