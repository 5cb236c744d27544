"""Release files and their cache: one release per cache under concurrency, no record values in
the metadata, and a release file's privatization settings are not silently overridden."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from lightning_dpot.data import (
    DataSource,
    DataSplits,
    HalfCircle,
    LedgerSettings,
    PrivatizedDataModule,
)
from lightning_dpot.data.release import Release

RACER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    import torch
    from lightning_dpot.data import HalfCircle, LedgerSettings, PrivatizedDataModule
    from lightning_dpot.data.release import tensor_sha256

    torch.set_num_threads(1)
    cache_dir, ledger_dir, ready, go, out = sys.argv[1:]
    dm = PrivatizedDataModule(
        HalfCircle(n=20_000, n_test=10), mechanism="laplace", epsilon=2.0, batch_size=None,
        cache_dir=cache_dir, ledger=LedgerSettings(ledger_dir),
    )
    Path(ready).touch()
    while not Path(go).exists():
        time.sleep(0.001)
    dm.prepare_data()
    dm.setup("fit")
    ledger = dm.privacy_report()["ledger"]["all_releases_of_these_records"]
    Path(out).write_text(json.dumps({"release": tensor_sha256(dm.release), "ledger": ledger}))
    """
)


def test_two_runs_started_together_on_one_cache_make_one_release(tmp_path):
    cache, ledger, go = tmp_path / "cache", tmp_path / "ledger", tmp_path / "go"
    runs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RACER,
                str(cache),
                str(ledger),
                str(tmp_path / f"ready{i}"),
                str(go),
                str(tmp_path / f"out{i}.json"),
            ]
        )  # fmt: skip
        for i in range(2)
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and all(run.poll() is None for run in runs)
        time.sleep(0.01)
    go.touch()  # both processes are imported and waiting: release them at once
    assert [run.wait(timeout=120) for run in runs] == [0, 0]
    assert len(list(cache.glob("release-*.pt"))) == 1
    assert len((ledger / "ledger.jsonl").read_text().splitlines()) == 1
    first, second = (json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2))
    assert first == second
    assert first["ledger"] == {"releases": 1, "epsilon": 2.0, "delta": 0.0}


class RecordsAsAttributes(DataSource):
    """A user source that keeps its records, a list of their values, and scalars derived from
    them (a maximum, the first record as text) as attributes."""

    low, high = -1.0, 1.0
    sample_shape = (3,)

    def __init__(self, records: torch.Tensor, name: str = "clinic") -> None:
        self.records = records
        self.first_record = records[0].tolist()
        self.largest = float(records.abs().max())
        self.first_as_text = f"first record {records[0].tolist()}"
        self.name = name

    def load(self) -> DataSplits:
        return DataSplits(self.records)


def test_no_record_value_reaches_the_release_file(tmp_path):
    records = torch.tensor([[0.8765, -0.4321, 0.5678], [0.2468, -0.1357, 0.9753]] * 10)
    source = RecordsAsAttributes(records)
    assert source.describe() == {"source": "RecordsAsAttributes", "name": "clinic"}
    dm = PrivatizedDataModule(
        source, mechanism="laplace", epsilon=1.0, batch_size=None, cache_dir=str(tmp_path / "c")
    )
    path = dm.write_release(tmp_path / "release.pt")
    metadata = json.dumps(Release.load(path).metadata)
    blob = path.read_bytes()
    for value in records.unique().tolist():
        for text in (f"{value:.4f}", repr(value)):
            assert text not in metadata and text.encode() not in blob


@pytest.fixture(scope="module")
def laplace_release(tmp_path_factory) -> Path:
    """A Laplace ε = 10 release with ℓ1 radius 0.9 and a secret seed."""
    root = tmp_path_factory.mktemp("release")
    dm = PrivatizedDataModule(
        HalfCircle(n=200, n_test=10),
        mechanism="laplace",
        epsilon=10.0,
        l1_radius=0.9,
        batch_size=None,
        cache_dir=str(root / "cache"),
        ledger=LedgerSettings(
            str(root / "ledger")
        ),  # module scope: before the per-test ledger is set
    )
    return dm.write_release(root / "release.pt")


@pytest.mark.parametrize(
    ("name", "value", "recorded"),
    [
        ("mechanism", "gaussian", "'laplace'"),
        ("epsilon", 0.5, "10.0"),
        ("delta", 1e-5, "0.0"),
        ("noise_scale", 1.0, "0.18"),
        ("calibration", "zhao", "None"),
        ("l1_radius", 0.5, "0.9"),
        ("l2_radius", 0.5, "None"),
        ("transform", "dct", "'identity'"),
        ("dct_keep", 2, "None"),
        ("seed", 3, "'secret (not recorded)'"),
        ("secure_rng", True, "False"),
    ],
)
def test_a_given_setting_that_differs_from_the_release_file_is_refused(
    laplace_release, name, value, recorded
):
    with pytest.raises(ValueError) as refused:
        PrivatizedDataModule(release_path=str(laplace_release), **{name: value})
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"release_path={str(laplace_release)!r}")
    assert f"{name}={value!r} is given but the release file has {name}={recorded}" in message


def test_a_gaussian_config_on_a_laplace_release_names_every_difference(laplace_release):
    with pytest.raises(ValueError, match=r"mechanism='gaussian' .* epsilon=0\.5 .* delta=1e-05"):
        PrivatizedDataModule(
            release_path=str(laplace_release), mechanism="gaussian", epsilon=0.5, delta=1e-5
        )


def test_settings_equal_to_the_release_file_are_accepted(laplace_release):
    dm = PrivatizedDataModule(
        release_path=str(laplace_release),
        mechanism="laplace",
        epsilon=10.0,
        noise_scale=0.18,  # b = Δ1/ε with Δ1 = 2·0.9 (the ℓ1 projection)
        l1_radius=0.9,
        transform="identity",
        secure_rng=False,
        batch_size=None,
    )
    assert dm.mechanism.name == "laplace" and dm.mechanism.epsilon == 10.0
