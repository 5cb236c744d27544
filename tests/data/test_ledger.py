"""The privacy ledger: every release of the same raw records is recorded,
whatever the configuration, preprocessing or cache directory, central-DP runs included; the
report states the total, and a declared budget is enforced before any noise is drawn; one
release per multi-node run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import lightning_dpot.data.local_release as local_release
import lightning_dpot.data.privatized as privatized
from lightning_dpot.data import (
    MNIST,
    CentralDPDataModule,
    HalfCircle,
    LedgerSettings,
    PrivateLatentDataModule,
    PrivatizedDataModule,
    TensorFile,
)
from lightning_dpot.data.ledger import LedgerTotal, PrivacyBudgetError, PrivacyLedger
from lightning_dpot.data.split import make_public_private_split


def _module(tmp_path, cache: str, epsilon: float, **ledger) -> PrivatizedDataModule:
    return PrivatizedDataModule(
        HalfCircle(n=200),
        mechanism="laplace",
        epsilon=epsilon,
        cache_dir=str(tmp_path / cache),
        ledger=LedgerSettings(str(tmp_path / "ledger"), **ledger),
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
    _module(tmp_path, "a", 4.0, budget=6.0).setup()
    refused = _module(tmp_path, "b", 4.0, budget=6.0)
    with pytest.raises(PrivacyBudgetError, match="ledger.budget=6.0.*1 time.*epsilon=4"):
        refused.setup()
    assert not (tmp_path / "b").exists() or not list((tmp_path / "b").glob("release-*.pt"))
    lines = (tmp_path / "ledger" / "ledger.jsonl").read_text().splitlines()
    assert len(lines) == 1  # the refused release was never drawn nor recorded
    spent = _module(tmp_path, "b", 4.0, budget=6.0, exceed_budget=True)
    spent.setup()
    report = spent.privacy_report()["ledger"]
    assert report["all_releases_of_these_records"]["epsilon"] == 8.0
    assert report["privacy_budget"] == 6.0


def test_only_rank_zero_releases_and_another_node_without_the_cache_refuses(tmp_path, monkeypatch):
    module = _module(tmp_path, "node1", 2.0)
    assert module.prepare_data_per_node is False  # prepare_data on global rank 0 only
    for module_of_rank in (privatized, local_release):
        monkeypatch.setattr(module_of_rank, "rank_world", lambda: (1, 2))
    with pytest.raises(RuntimeError, match="rank 1 of 2 cannot see the release"):
        module.setup()
    assert not (tmp_path / "ledger" / "ledger.jsonl").exists()


def test_another_split_of_the_same_people_is_charged_per_record(tmp_path):
    """A new subset, order or split keeps most records: the ledger charges each record for every
    release that contains it, so the budget cannot be dodged by re-splitting."""
    people = torch.rand(100, 3) * 2 - 1
    newcomers = torch.rand(20, 3) * 2 - 1

    def release(name: str, rows: torch.Tensor, **ledger) -> PrivatizedDataModule:
        torch.save(rows, tmp_path / f"{name}.pt")
        dm = PrivatizedDataModule(
            TensorFile(str(tmp_path / f"{name}.pt"), -1.0, 1.0), mechanism="laplace",
            epsilon=1.0, cache_dir=str(tmp_path / name),
            ledger=LedgerSettings(str(tmp_path / "ledger"), **ledger),
        )  # fmt: skip
        dm.setup()
        return dm

    release("all", people, budget=1.5)
    resplit = torch.cat([people[torch.randperm(100)[:90]], newcomers])  # 90 of the same
    with pytest.raises(PrivacyBudgetError, match="already released 1 time"):
        release("resplit", resplit, budget=1.5)
    fresh = release("fresh", newcomers, budget=1.5)  # nobody released before
    assert fresh.privacy_report()["ledger"]["all_releases_of_these_records"]["epsilon"] == 1.0


# -- keying by record identity: preprocessing does not make records new -------------------------
def _idx_folder(root: Path, n: int = 40) -> Path:
    """``n`` random 28×28 uint8 images in the IDX format of the MNIST test split."""
    gen = np.random.default_rng(0)
    folder = root / "idx"
    folder.mkdir()
    images = gen.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = gen.integers(0, 10, size=n, dtype=np.uint8)
    (folder / "t10k-images-idx3-ubyte").write_bytes(
        bytes([0, 0, 8, 3]) + np.array([n, 28, 28], dtype=">i4").tobytes() + images.tobytes()
    )
    (folder / "t10k-labels-idx1-ubyte").write_bytes(
        bytes([0, 0, 8, 1]) + np.array([n], dtype=">i4").tobytes() + labels.tobytes()
    )
    return folder


def _mnist(folder: Path, **kwargs) -> MNIST:
    return MNIST(idx_dir=folder, split="test-only", test_size=8, **kwargs)


def _release(tmp_path, source, cache: str, epsilon: float, **ledger) -> PrivatizedDataModule:
    dm = PrivatizedDataModule(
        source, mechanism="laplace", epsilon=epsilon, batch_size=None,
        cache_dir=str(tmp_path / cache), ledger=LedgerSettings(str(tmp_path / "ledger"), **ledger),
    )  # fmt: skip
    dm.setup()
    return dm


def test_padding_or_resplitting_the_same_images_is_charged_to_the_same_records(tmp_path):
    folder = _idx_folder(tmp_path)
    _release(tmp_path, _mnist(folder), "a", 1.0, budget=3.5)
    _release(tmp_path, _mnist(folder), "b", 2.0, budget=3.5)
    with pytest.raises(PrivacyBudgetError, match="ledger.budget=3.5.*2 time.*epsilon=3"):
        _release(tmp_path, _mnist(folder, image_size=32), "c", 1.0, budget=3.5)
    resplit = _mnist(folder, image_size=32, split_seed=1)  # another split keeps most records
    with pytest.raises(PrivacyBudgetError, match="2 time"):
        _release(tmp_path, resplit, "d", 1.0, budget=3.5)
    spent = _release(tmp_path, _mnist(folder, image_size=32), "c", 1.0, exceed_budget=True)
    ledger = spent.privacy_report()["ledger"]
    assert ledger["all_releases_of_these_records"] == {"releases": 3, "epsilon": 4.0, "delta": 0.0}
    assert ledger["keying"].startswith("record ids declared by the source")


def test_records_without_ids_are_keyed_by_their_bytes_and_the_report_says_so(tmp_path):
    folder = _idx_folder(tmp_path)
    _release(tmp_path, _mnist(folder), "mnist", 2.0)
    records = _mnist(folder).load().train
    torch.save(records, tmp_path / "same.pt")  # the same float32 records, no ids: same bytes
    with pytest.raises(PrivacyBudgetError, match="1 time.*epsilon=2"):
        _release(tmp_path, TensorFile(str(tmp_path / "same.pt"), -1.0, 1.0), "same", 2.0,
                 budget=3.0)  # fmt: skip
    torch.save(records * 0.5, tmp_path / "rescaled.pt")  # new bytes, no ids: not recognised
    rescaled = _release(
        tmp_path, TensorFile(str(tmp_path / "rescaled.pt"), -1.0, 1.0), "rescaled", 2.0,
        budget=3.0,
    )  # fmt: skip
    ledger = rescaled.privacy_report()["ledger"]
    assert ledger["all_releases_of_these_records"] == {"releases": 1, "epsilon": 2.0, "delta": 0.0}
    assert ledger["keying"] == (
        "record bytes after preprocessing (the source declares no record ids)"
    )


def test_central_runs_are_opened_at_their_target_and_settled_at_what_they_spent(tmp_path):
    folder = _idx_folder(tmp_path)
    options = {"sample_rate": 0.5, "ledger": LedgerSettings(str(tmp_path / "ledger"), 4.0)}
    central = CentralDPDataModule(_mnist(folder), **options)
    entry = central.run_ledger.open(3.0, 1e-5, {"accountant": "rdp"})
    assert central.run_ledger.total() == LedgerTotal(1, 3.0, 1e-5)
    central.run_ledger.settle(entry, 1.25, 1e-5)
    assert central.run_ledger.total() == LedgerTotal(1, 1.25, 1e-5)
    local = _release(tmp_path, _mnist(folder, image_size=32), "local", 2.0, budget=4.0)
    assert local.privacy_report()["ledger"]["all_releases_of_these_records"] == {
        "releases": 2, "epsilon": 3.25, "delta": 1e-5,
    }  # fmt: skip
    again = CentralDPDataModule(_mnist(folder), **options)
    with pytest.raises(PrivacyBudgetError, match="ledger.budget=4.0.*lower the run's target"):
        again.run_ledger.open(1.0, None, {})
    lines = [json.loads(line) for line in (tmp_path / "ledger" / "ledger.jsonl").open()]
    assert [line.get("settles") for line in lines] == [None, entry, None]  # append-only
    assert lines[0]["epsilon"] == 3.0 and lines[0]["notion"] == "central"
    assert lines[0]["accountant"] == "rdp" and lines[0]["n"] == 32
    with pytest.raises(ValueError, match="entry_id='unknown' is no entry"):
        central.run_ledger.settle("unknown", 1.0, None)


def test_latent_runs_charge_the_private_part_and_a_crash_keeps_the_opening_epsilon(tmp_path):
    records = torch.rand(40, 3) * 2 - 1
    torch.save(records, tmp_path / "all.pt")
    split = make_public_private_split(records, 0.5, 0)
    latent = PrivateLatentDataModule(
        TensorFile(str(tmp_path / "all.pt"), -1.0, 1.0), autoencoder=torch.nn.Linear(3, 2),
        autoencoder_checkpoint=str(tmp_path / "stage1.ckpt"),
        ledger=LedgerSettings(str(tmp_path / "ledger")),
    )  # fmt: skip
    latent.run_ledger.open(2.0, 1e-5, {})  # never settled: the run crashed
    for part, indices in (("public", split.public), ("private", split.private)):
        torch.save(records[indices], tmp_path / f"{part}.pt")
    public = _release(tmp_path, TensorFile(str(tmp_path / "public.pt"), -1.0, 1.0), "p", 1.0)
    assert public.privacy_report()["ledger"]["all_releases_of_these_records"]["epsilon"] == 1.0
    private = _release(tmp_path, TensorFile(str(tmp_path / "private.pt"), -1.0, 1.0), "q", 1.0)
    assert private.privacy_report()["ledger"]["all_releases_of_these_records"] == {
        "releases": 2, "epsilon": 3.0, "delta": 1e-5,
    }  # fmt: skip
    toy = PrivateLatentDataModule(
        TensorFile(str(tmp_path / "all.pt"), -1.0, 1.0),
        ledger=LedgerSettings(str(tmp_path / "ledger")),
    )
    assert toy.run_ledger.total() == LedgerTotal(2, 3.0, 1e-5)  # without autoencoder: every record


def test_declared_ids_must_be_one_int64_per_record(tmp_path):
    ledger = PrivacyLedger(tmp_path / "ledger")
    with pytest.raises(ValueError, match=r"train_ids must be an int64 tensor of shape \(3,\)"):
        ledger.record_keys(torch.zeros(3, 2), torch.arange(3, dtype=torch.int32), "rows")
    with pytest.raises(ValueError, match="id_namespace must be a non-empty string"):
        ledger.record_keys(torch.zeros(3, 2), torch.arange(3), None)


def test_a_resumed_run_sets_its_entry_back_within_the_budget_and_only_for_its_records(tmp_path):
    """A run settled low by an exception lets another run in under the budget; setting the
    first run's entry back to its target (its resume) is then refused past the budget. An
    entry is kept by a resume only on the same records of the same ledger."""
    folder = _idx_folder(tmp_path)
    options = {"sample_rate": 0.5, "ledger": LedgerSettings(str(tmp_path / "ledger"), 10.0)}
    first = CentralDPDataModule(_mnist(folder), **options)
    entry = first.run_ledger.open(8.0, 1e-5, {})
    first.run_ledger.settle(entry, 4.34, 1e-5)  # what it spent before its exception
    CentralDPDataModule(_mnist(folder), **options).run_ledger.open(5.0, 1e-5, {})
    assert first.run_ledger.holds(entry)
    with pytest.raises(PrivacyBudgetError, match="ledger.budget=10.0"):
        first.run_ledger.reopen(entry, 8.0, 1e-5)
    assert first.run_ledger.total().epsilon == pytest.approx(9.34)
    other = CentralDPDataModule(_mnist(folder, limit=16), **options)
    assert not other.run_ledger.holds(entry)
    elsewhere = {**options, "ledger": LedgerSettings(str(tmp_path / "other"), 10.0)}
    assert not CentralDPDataModule(_mnist(folder), **elsewhere).run_ledger.holds(entry)


def test_generated_points_are_keyed_apart_from_real_records_and_other_draws(tmp_path):
    tutorial = _module(tmp_path, "a", 2.0)  # a seeded half-circle, as the tutorials draw
    tutorial.setup()
    points = HalfCircle(n=200).load().train
    torch.save(points, tmp_path / "same_points.pt")  # a user's file with the same bytes
    real = PrivatizedDataModule(
        TensorFile(str(tmp_path / "same_points.pt"), low=-1.5, high=1.5),
        mechanism="laplace", epsilon=1.0, cache_dir=str(tmp_path / "b"),
        ledger=LedgerSettings(str(tmp_path / "ledger")),
    )  # fmt: skip
    real.setup()
    total = real.privacy_report()["ledger"]["all_releases_of_these_records"]
    assert total == {"releases": 1, "epsilon": 1.0, "delta": 0.0}  # not the tutorial's
    other_draw = PrivatizedDataModule(
        HalfCircle(n=200, data_seed=7), mechanism="laplace", epsilon=3.0,
        cache_dir=str(tmp_path / "c"), ledger=LedgerSettings(str(tmp_path / "ledger")),
    )  # fmt: skip
    other_draw.setup()
    total = other_draw.privacy_report()["ledger"]["all_releases_of_these_records"]
    assert total["releases"] == 1  # another draw shares no identity with the first
    again = _module(tmp_path, "d", 1.0)  # the same draw again: the same records
    again.setup()
    assert again.privacy_report()["ledger"]["all_releases_of_these_records"]["releases"] == 2


def test_ledger_settings_refuse_what_is_not_a_budget_and_read_a_mapping(tmp_path):
    with pytest.raises(ValueError, match="ledger.budget must be a finite number > 0, got True"):
        LedgerSettings(budget=True)
    with pytest.raises(ValueError, match="ledger.exceed_budget must be true or false"):
        LedgerSettings(exceed_budget="yes")
    with pytest.raises(ValueError, match=r"ledger: unknown key\(s\) \['budgett'\]"):
        LedgerSettings.of({"budgett": 1.0})
    with pytest.raises(ValueError, match="ledger must be a LedgerSettings or a mapping"):
        LedgerSettings.of(3.0)
    dm = _module(tmp_path, "a", 1.0)
    assert dm.ledger_settings == LedgerSettings(str(tmp_path / "ledger"))
    as_mapping = PrivatizedDataModule(
        HalfCircle(n=200), mechanism="laplace", epsilon=1.0, cache_dir=str(tmp_path / "b"),
        ledger={"dir": str(tmp_path / "ledger"), "budget": 2.0},
    )  # fmt: skip
    assert as_mapping.ledger_settings.budget == 2.0
