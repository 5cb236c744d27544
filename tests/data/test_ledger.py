"""The privacy ledger (issue 13, item 7): every release of the same raw records is recorded,
whatever the configuration or cache directory, the report states the total, and a declared
budget is enforced before any noise is drawn; one release per multi-node run."""

from __future__ import annotations

import json

import pytest
import torch

import lightning_dpot.data.privatized as privatized
from lightning_dpot.data import HalfCircle, PrivatizedDataModule, TensorFile
from lightning_dpot.data.ledger import PrivacyBudgetError


def _module(tmp_path, cache: str, epsilon: float, **kwargs) -> PrivatizedDataModule:
    return PrivatizedDataModule(
        HalfCircle(n=200),
        mechanism="laplace",
        epsilon=epsilon,
        cache_dir=str(tmp_path / cache),
        ledger_dir=str(tmp_path / "ledger"),
        **kwargs,
    )


def test_every_release_of_the_same_records_is_totalled(tmp_path):
    first = _module(tmp_path, "a", 2.0)
    first.setup()
    assert first.privacy_report()["ledger"]["all_releases_of_these_records"] == {
        "releases": 1, "epsilon": 2.0, "delta": 0.0,
    }  # fmt: skip
    again = _module(tmp_path, "a", 2.0)  # same configuration and cache: the cached release
    again.setup()
    assert again.privacy_report()["ledger"]["all_releases_of_these_records"]["releases"] == 1
    other_cache = _module(tmp_path, "b", 3.0)  # a new cache_dir draws fresh noise: counted
    other_cache.setup()
    total = other_cache.privacy_report()["ledger"]["all_releases_of_these_records"]
    assert total == {"releases": 2, "epsilon": 5.0, "delta": 0.0}
    assert other_cache.privacy_report()["epsilon"] == 3.0  # its own release's ε, beside
    lines = (tmp_path / "ledger" / "ledger.jsonl").read_text().splitlines()
    assert [json.loads(line)["epsilon"] for line in lines] == [2.0, 3.0]
    assert [json.loads(line)["n"] for line in lines] == [200, 200]


def test_a_release_past_the_budget_needs_an_explicit_flag(tmp_path):
    _module(tmp_path, "a", 4.0, privacy_budget=6.0).setup()
    refused = _module(tmp_path, "b", 4.0, privacy_budget=6.0)
    with pytest.raises(PrivacyBudgetError, match="privacy_budget=6.0.*1 time.*epsilon=4"):
        refused.setup()
    assert not (tmp_path / "b").exists() or not list((tmp_path / "b").glob("release-*.pt"))
    lines = (tmp_path / "ledger" / "ledger.jsonl").read_text().splitlines()
    assert len(lines) == 1  # the refused release was never drawn nor recorded
    spent = _module(tmp_path, "b", 4.0, privacy_budget=6.0, exceed_privacy_budget=True)
    spent.setup()
    report = spent.privacy_report()["ledger"]
    assert report["all_releases_of_these_records"]["epsilon"] == 8.0
    assert report["privacy_budget"] == 6.0


def test_only_rank_zero_releases_and_another_node_without_the_cache_refuses(tmp_path, monkeypatch):
    module = _module(tmp_path, "node1", 2.0)
    assert module.prepare_data_per_node is False  # prepare_data on global rank 0 only
    monkeypatch.setattr(privatized, "rank_world", lambda: (1, 2))
    with pytest.raises(RuntimeError, match="rank 1 of 2 cannot see the release"):
        module.setup()
    assert not (tmp_path / "ledger" / "ledger.jsonl").exists()


def test_another_split_of_the_same_people_is_charged_per_record(tmp_path):
    """A new subset, order or split keeps most records: the ledger charges each record for every
    release that contains it, so the budget cannot be dodged by re-splitting."""
    people = torch.rand(100, 3) * 2 - 1
    newcomers = torch.rand(20, 3) * 2 - 1

    def release(name: str, rows: torch.Tensor, **kwargs) -> PrivatizedDataModule:
        torch.save(rows, tmp_path / f"{name}.pt")
        dm = PrivatizedDataModule(
            TensorFile(str(tmp_path / f"{name}.pt"), -1.0, 1.0), mechanism="laplace",
            epsilon=1.0, cache_dir=str(tmp_path / name), ledger_dir=str(tmp_path / "ledger"),
            **kwargs,
        )  # fmt: skip
        dm.setup()
        return dm

    release("all", people, privacy_budget=1.5)
    resplit = torch.cat([people[torch.randperm(100)[:90]], newcomers])  # 90 of the same
    with pytest.raises(PrivacyBudgetError, match="already released 1 time"):
        release("resplit", resplit, privacy_budget=1.5)
    fresh = release("fresh", newcomers, privacy_budget=1.5)  # nobody released before
    assert fresh.privacy_report()["ledger"]["all_releases_of_these_records"]["epsilon"] == 1.0
