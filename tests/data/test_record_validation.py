"""Every private input is validated once, at setup, before anything is released: non-finite
records, records outside the declared bounds, labels outside ``[0, num_classes)`` and latents
off the unit ball are refused with the number of failing records and the first one's index."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from lightning_dpot.data.central import CentralDPDataModule
from lightning_dpot.data.latent import PrivateLatentDataModule
from lightning_dpot.data.sources import DataSource, DataSplits
from lightning_dpot.data.split import SPLIT_CHECKPOINT_KEY, make_public_private_split
from lightning_dpot.methods.dpsw.sliced_release import SlicedGaussianRelease

BAD_VALUES = {"nan": math.nan, "+inf": math.inf, "1e20": 1e20}
BAD_MESSAGES = {
    "nan": "contain NaN or Inf values",
    "+inf": "contain NaN or Inf values",
    "1e20": r"lie outside the declared bounds \[low, high\] = \[-1\.0, 1\.0\]",
}


class _Records(DataSource):
    """Given records in the declared box ``[-1, 1]^2``, with optional labels and test split."""

    low, high = -1.0, 1.0
    sample_shape = (2,)

    def __init__(
        self,
        train: Tensor,
        labels: Tensor | None = None,
        num_classes: int | None = None,
        test: Tensor | None = None,
    ) -> None:
        self.train, self.labels, self.num_classes, self.test = train, labels, num_classes, test

    def load(self) -> DataSplits:
        return DataSplits(self.train.clone(), self.labels, self.test)


def _records(n: int = 8, seed: int = 0) -> Tensor:
    return torch.rand(n, 2, generator=torch.Generator().manual_seed(seed)) - 0.5


def _with_bad_rows(value: float, rows: tuple[int, ...] = (2, 5)) -> Tensor:
    x = _records()
    for row in rows:
        x[row, 1] = value
    return x


def _refusal(call, match: str) -> str:
    with pytest.raises(ValueError, match=match) as error:
        call()
    return str(error.value)


@pytest.mark.parametrize("bad", list(BAD_VALUES))
def test_central_setup_refuses_bad_records_naming_count_and_first_index(bad):
    dm = CentralDPDataModule(_Records(_with_bad_rows(BAD_VALUES[bad])), sample_rate=0.5, seed=0)
    message = _refusal(
        dm.setup,
        rf"_Records training records: 2 record\(s\) {BAD_MESSAGES[bad]}, the first at index 2",
    )
    assert "e+20" not in message and "e20" not in message  # no value of the data
    assert dm.train_records is None  # nothing was kept for a module to use


def test_central_setup_refuses_a_bad_test_record():
    dm = CentralDPDataModule(
        _Records(_records(), test=_with_bad_rows(math.nan, (3,))), sample_rate=0.5, seed=0
    )
    _refusal(
        dm.setup,
        r"_Records test records: 1 record\(s\) contain NaN or Inf values, the first at index 3",
    )


@pytest.mark.parametrize(
    "labels", [[0, 1, 2, -1, 0, 3, 1, 2], [0, 1, 2, 0.5, 0, 2.5, 1, 2]], ids=["range", "integer"]
)
def test_central_setup_refuses_labels_outside_num_classes(labels):
    source = _Records(_records(), torch.tensor(labels), num_classes=3)
    dm = CentralDPDataModule(source, sample_rate=0.5, seed=0)
    _refusal(
        dm.setup,
        r"_Records training labels: 2 label\(s\) are not integers in \[0, num_classes\) = "
        r"\[0, 3\), the first at index 3",
    )


def test_central_setup_refuses_labels_that_are_not_one_per_record():
    source = _Records(_records(), torch.zeros(7, dtype=torch.long), num_classes=3)
    dm = CentralDPDataModule(source, sample_rate=0.5, seed=0)
    _refusal(dm.setup, r"_Records training labels must have shape \(8,\) \(one per record\)")


@pytest.mark.parametrize("bad", list(BAD_VALUES))
def test_toy_latent_setup_refuses_bad_records_before_encoding(bad):
    dm = PrivateLatentDataModule(_Records(_with_bad_rows(BAD_VALUES[bad])), normalize="ball")
    _refusal(
        dm.setup,
        rf"_Records training records: 2 record\(s\) {BAD_MESSAGES[bad]}, the first at index 2",
    )
    assert dm.latents is None


class _MarkedEncoder(nn.Module):
    """Identity autoencoder on R^2 whose encoder outputs NaN for records with ``x_0 > 0.9``."""

    latent_dim = 2

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))

    def encode(self, x: Tensor) -> Tensor:
        z = self.scale * x.reshape(len(x), -1)
        return torch.where(x[:, :1] > 0.9, torch.full_like(z, math.nan), z)

    def decode(self, z: Tensor) -> Tensor:
        return z / self.scale


def _autoencoder_checkpoint(tmp_path: Path, records: Tensor) -> str:
    """A stage-1 checkpoint of :class:`_MarkedEncoder` with the split of ``records``."""
    split = make_public_private_split(records, 0.5, 0)
    state = {f"autoencoder.{k}": v for k, v in _MarkedEncoder().state_dict().items()}
    path = tmp_path / "autoencoder.ckpt"
    torch.save({"state_dict": state, SPLIT_CHECKPOINT_KEY: split.to_dict()}, path)
    return str(path)


def test_latent_setup_refuses_an_encoder_that_outputs_nan(tmp_path):
    records = _records(12)
    private = make_public_private_split(records, 0.5, 0).private
    for i in (1, 3):  # the split hashes the public part only: marking private rows keeps it
        records[private[i]] = torch.tensor([0.95, 0.0])
    dm = PrivateLatentDataModule(
        _Records(records),
        autoencoder=_MarkedEncoder(),
        autoencoder_checkpoint=_autoencoder_checkpoint(tmp_path, records),
    )
    _refusal(
        dm.setup,
        r"encoded private latents: 2 record\(s\) contain NaN or Inf values, the first at index 1",
    )
    assert dm.latents is None


def test_valid_records_pass_setup_unchanged(tmp_path):
    records, labels = _records(), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    central = CentralDPDataModule(_Records(records, labels, 3, _records(4, 1)), sample_rate=0.5)
    central.setup("fit")
    torch.testing.assert_close(central.train_records, records)
    toy = PrivateLatentDataModule(_Records(records), normalize="ball")
    toy.setup("fit")
    torch.testing.assert_close(toy.private_records(), records)
    encoded = PrivateLatentDataModule(
        _Records(records),
        autoencoder=_MarkedEncoder(),
        autoencoder_checkpoint=_autoencoder_checkpoint(tmp_path, records),
    )
    encoded.setup("fit")
    norms = torch.linalg.vector_norm(encoded.private_records(), dim=1)
    torch.testing.assert_close(norms, torch.ones_like(norms))


def test_check_records_reports_count_and_first_index_of_image_records():
    from lightning_dpot.checks import check_records

    images = torch.zeros(5, 1, 4, 4, dtype=torch.uint8)
    check_records(images, 0.0, 255.0)
    x = torch.zeros(5, 3, 4, 4)
    x[4, 2, 3, 3], x[1, 0, 0, 1] = -math.inf, 7.0
    with pytest.raises(ValueError, match=r"^records: 1 record\(s\) contain NaN .* at index 4; "):
        check_records(x, -1.0, 1.0)
    x[4] = 0.0
    with pytest.raises(ValueError, match=r"^pixels: 1 record\(s\) lie outside .* at index 1; "):
        check_records(x, -1.0, 1.0, "pixels")


def _calibrated_release() -> tuple[SlicedGaussianRelease, Tensor]:
    release = SlicedGaussianRelease(num_directions=5, delta=1e-5, noise_seed=0)
    release.calibrate(1.0, 4)
    return release, release.directions(4, torch.Generator().manual_seed(0))


def _unit_records(n: int = 6) -> Tensor:
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(2))
    return x / torch.linalg.vector_norm(x, dim=1, keepdim=True)


@pytest.mark.parametrize(
    "row, match",
    [
        ([0.0, 2.0, 0.0, 0.0], r"1 record\(s\) have ℓ2 norm > 1 .* first at index 3"),
        ([math.nan, 0.0, 0.0, 0.0], r"1 record\(s\) contain NaN or Inf values, .* index 3"),
        ([0.0, 0.0, math.inf, 0.0], r"1 record\(s\) contain NaN or Inf values, .* index 3"),
    ],
    ids=["norm2", "nan", "inf"],
)
def test_sliced_release_refuses_a_bad_record_before_emitting_its_event(row, match):
    release, theta = _calibrated_release()
    records = _unit_records()
    records[3] = torch.tensor(row)
    with pytest.raises(ValueError) as error:
        release(records, theta, torch.Generator().manual_seed(1))
    assert release.events.total == 0 and release.events.pending == []
    assert re.search(match, str(error.value))


def test_sliced_release_of_valid_records_emits_one_event():
    release, theta = _calibrated_release()
    released = release(_unit_records(), theta, torch.Generator().manual_seed(1))
    assert released.shape == (6, 5) and bool(torch.isfinite(released).all())
    assert release.events.total == 1


def test_a_local_release_refuses_a_bad_record_before_charging_the_ledger(tmp_path: Path):
    from lightning_dpot.data import LedgerSettings
    from lightning_dpot.data.privatized import PrivatizedDataModule

    ledger = tmp_path / "ledger"
    dm = PrivatizedDataModule(
        _Records(_with_bad_rows(math.nan)), mechanism="laplace", epsilon=1.0, batch_size=None,
        cache_dir=str(tmp_path / "cache"), ledger=LedgerSettings(str(ledger)),
    )  # fmt: skip
    with pytest.raises(ValueError, match="contain NaN or Inf values"):
        dm.prepare_data()
    assert not (ledger / "ledger.jsonl").exists() or not (ledger / "ledger.jsonl").read_text()
    assert not list((tmp_path / "cache").glob("release-*.pt"))
