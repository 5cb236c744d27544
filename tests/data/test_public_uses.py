"""Records a data module hands to the process without noise (a DPSW public split, a held-out
split in a fit) are entered in the privacy ledger as public uses: a private release of such
records, and a public use of privately released records, are refused before anything is
released unless the data module says ``public_reuse="allow"``; the ledger says which records
and why, and a total says how many were used so."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn

from lightning_dpot.callbacks import PrivacyAccountantCallback
from lightning_dpot.data import (
    CentralDPDataModule,
    Digits,
    LedgerSettings,
    PrivateLatentDataModule,
    PrivatizedDataModule,
    PublicSplitDataModule,
    TensorFile,
)
from lightning_dpot.data.ledger import LedgerTotal, PrivacyLedger, PublicReuseError
from lightning_dpot.data.split import make_public_private_split
from lightning_dpot.methods import DPMERF, AutoencoderModule
from lightning_dpot.nn import ConditionalDCGANGenerator
from lightning_dpot.nn.autoencoder import Autoencoder

QUIET = {
    "accelerator": "cpu",
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
}


class TinyAutoencoder(Autoencoder):
    """8×8 images ↔ 2-D latents, one linear layer each way."""

    def __init__(self) -> None:
        super().__init__()
        self.latent_dim, self.image_shape = 2, (1, 8, 8)
        self.encoder_body = nn.Flatten()
        self.to_latent = nn.Linear(64, 2)
        self.decoder_body = nn.Sequential(nn.Linear(2, 64), nn.Unflatten(1, (1, 8, 8)))


def _merf(root: Path, ledger: Path) -> tuple[DPMERF, L.Trainer, CentralDPDataModule]:
    """A DP-MERF run on the digits at target ε 2, one step, not fitted yet."""
    generator = ConditionalDCGANGenerator(10, latent_dim=4, image_size=8, hidden_channels=(4, 4, 4))
    model = DPMERF(
        generator, target_epsilon=2.0, delta=1e-5, num_frequencies=20, length_scale=6.0,
        generated_batch_size=10,
    )  # fmt: skip
    dm = CentralDPDataModule(
        Digits(), expected_batch_size=10, steps_per_epoch=2, seed=0,
        ledger=LedgerSettings(str(ledger)),
    )  # fmt: skip
    trainer = L.Trainer(
        max_steps=1, default_root_dir=str(root), callbacks=[PrivacyAccountantCallback()], **QUIET
    )
    return model, trainer, dm


def _stage1(root: Path, datamodule: PublicSplitDataModule) -> L.Trainer:
    trainer = L.Trainer(max_steps=1, default_root_dir=str(root), **QUIET)
    trainer.fit(AutoencoderModule(TinyAutoencoder()), datamodule)
    return trainer


def _lines(ledger: Path) -> list[dict]:
    return [json.loads(line) for line in (ledger / "ledger.jsonl").read_text().splitlines()]


def test_a_public_split_of_released_records_is_refused_unless_allowed_and_then_counted(tmp_path):
    """DP-MERF at ε 2 on the digits, then a DPSW stage 1 on another split trains raw on half of
    the same records: refused before it trains; allowed, it is entered as a public use, and the
    next private run on those records is refused before it releases anything."""
    ledger = tmp_path / "ledger"
    model, trainer, dm = _merf(tmp_path / "merf", ledger)
    trainer.fit(model, dm)
    n_train = len(Digits().load().train)
    n_public = round(n_train * 0.5)
    before = (ledger / "ledger.jsonl").read_text()

    refused = PublicSplitDataModule(
        Digits(), split_seed=1, batch_size=64, ledger=LedgerSettings(str(ledger))
    )
    with pytest.raises(
        PublicReuseError,
        match=rf"ledger.public_reuse='refuse': {n_public} of the {n_public} records of the "
        r"public split of Digits \(public_fraction=0.5, split_seed=1\) were released privately "
        r"before \(entry \w+: a central release at epsilon=2",
    ):
        _stage1(tmp_path / "refused", refused)
    assert (ledger / "ledger.jsonl").read_text() == before  # nothing entered
    assert refused.public_records is None  # nothing served

    allowed = PublicSplitDataModule(
        Digits(),
        split_seed=1,
        batch_size=64,
        ledger=LedgerSettings(str(ledger), public_reuse="allow"),
    )
    assert _stage1(tmp_path / "allowed", allowed).global_step == 1
    public = [line for line in _lines(ledger) if line.get("use") == "public"]
    assert [line["which_records"] for line in public] == [
        "the held-out split of Digits",  # entered by the DP-MERF run, which evaluated on it
        "the public split of Digits (public_fraction=0.5, split_seed=1)",
    ]  # the stage-1 fit's held-out split is the same: no second line
    split_use = public[1]
    assert split_use["n"] == n_public and "train the autoencoder" in split_use["why"]
    assert split_use["epsilon"] is None and split_use["public_reuse"] == "allow"
    assert split_use["data_module"] == "PublicSplitDataModule"

    # The ε total is unchanged (a public use is no release), and says how many were public.
    dm = CentralDPDataModule(Digits(), sample_rate=0.5, ledger=LedgerSettings(str(ledger)))
    total = dm.run_ledger.total()
    assert (total.releases, total.used_without_noise) == (1, n_public)
    assert 0 < total.epsilon <= 2.0
    assert total.as_dict()["records_used_without_noise"] == n_public

    again, trainer, dm = _merf(tmp_path / "again", ledger)
    with pytest.raises(
        PublicReuseError,
        match=rf"{n_public} of the {n_train} records of this release were used without noise "
        r"before \(entry \w+: the public split of Digits .*train the autoencoder",
    ):
        trainer.fit(again, dm)
    assert again.release.events.total == 0  # refused before the release
    assert len([line for line in _lines(ledger) if line.get("notion") == "central"]) == 1


def test_a_held_out_split_evaluated_in_a_fit_is_refused_as_training_records(tmp_path):
    """The held-out split a central run evaluated on is public; a local release of another
    split of the same digits, which trains on most of it, is refused before its noise, and a
    release of the run's own configuration (disjoint from its held-out split) is not."""
    ledger = tmp_path / "ledger"
    model, trainer, dm = _merf(tmp_path / "merf", ledger)
    trainer.fit(model, dm)

    def local(source: Digits, cache: str, **settings) -> PrivatizedDataModule:
        return PrivatizedDataModule(
            source, mechanism="laplace", epsilon=1.0, batch_size=None,
            cache_dir=str(tmp_path / cache), ledger=LedgerSettings(str(ledger), **settings),
        )  # fmt: skip

    resplit = local(Digits(split_seed=1), "resplit")
    with pytest.raises(
        PublicReuseError, match=r"the held-out split of Digits \(\d+ records\), read"
    ):
        resplit.setup()
    assert not list((tmp_path / "resplit").glob("release-*.pt"))
    same = local(Digits(), "same")
    same.setup()
    assert same.privacy_report()["ledger"]["all_releases_of_these_records"]["releases"] == 2
    allowed = local(Digits(split_seed=1), "resplit", public_reuse="allow")
    allowed.setup()
    total = allowed.privacy_report()["ledger"]["all_releases_of_these_records"]
    assert 0 < total["records_used_without_noise"] <= len(Digits().load().test)
    assert _lines(ledger)[-1]["public_reuse"] == "allow"


def test_identical_records_in_the_two_halves_of_one_split_are_no_reuse(tmp_path):
    """Duplicates share keys; the public and private halves of one split still share no record,
    so stage 2 runs on its half. Another split's private half holds public records: refused."""
    rows = torch.rand(20, 3) * 2 - 1
    torch.save(torch.cat([rows, rows]), tmp_path / "twice.pt")  # every record twice
    source = TensorFile(str(tmp_path / "twice.pt"), -1.0, 1.0)
    ledger = str(tmp_path / "ledger")
    PublicSplitDataModule(source, split_seed=0, ledger=LedgerSettings(ledger)).setup()

    def stage2(split_seed: int, **settings) -> PrivateLatentDataModule:
        return PrivateLatentDataModule(
            source, autoencoder=nn.Linear(3, 2), split_seed=split_seed,
            ledger=LedgerSettings(ledger, **settings),
            autoencoder_checkpoint=str(tmp_path / "stage1.ckpt"),
        )  # fmt: skip

    split = make_public_private_split(torch.cat([rows, rows]), 0.5, 0)
    twins = sum((index + 20) % 40 in split.public for index in split.private)
    assert twins > 0  # records of the private half whose copy is public
    same_split = stage2(0)
    same_split.run_ledger.open(1.0, 1e-5, {})
    assert same_split.run_ledger.total() == LedgerTotal(1, 1.0, 1e-5, twins)  # shown, not refused
    with pytest.raises(PublicReuseError, match=r"the public split of TensorFile .*split_seed=0"):
        stage2(1).run_ledger.open(1.0, 1e-5, {})
    stage2(1, public_reuse="allow").run_ledger.open(1.0, 1e-5, {})
    assert [line.get("use", "release") for line in _lines(tmp_path / "ledger")] == [
        "public", "release", "release",
    ]  # fmt: skip


def test_a_ledger_written_before_public_uses_still_reads_and_refuses(tmp_path):
    """An entry of the first ledger format (one file of byte keys, no kind, no partition) is a
    release: it is totalled, and a public use of its records is refused."""
    records = torch.rand(30, 3) * 2 - 1
    torch.save(records, tmp_path / "records.pt")
    ledger = PrivacyLedger(tmp_path / "ledger")
    (ledger.directory / "records").mkdir(parents=True)
    np.save(
        ledger.directory / "records" / "old.npy", np.unique(ledger.record_keys(records).content)
    )
    old = {"id": "old", "records": "old.npy", "n": 30, "epsilon": 1.5, "delta": None}
    ledger.path.write_text(json.dumps(old) + "\n")
    source = TensorFile(str(tmp_path / "records.pt"), -1.0, 1.0)
    release = PrivatizedDataModule(
        source, mechanism="laplace", epsilon=1.0, batch_size=None,
        cache_dir=str(tmp_path / "cache"), ledger=LedgerSettings(str(ledger.directory)),
    )  # fmt: skip
    release.setup()
    assert release.ledger_total == LedgerTotal(2, 2.5, 0.0)
    public = PublicSplitDataModule(source, ledger=LedgerSettings(str(ledger.directory)))
    with pytest.raises(PublicReuseError, match=r"entry old: a private release at epsilon=1.5"):
        public.setup()
    with pytest.raises(ValueError, match="public_reuse must be 'refuse' or 'allow', got 'yes'"):
        LedgerSettings(public_reuse="yes")
    with pytest.raises(
        ValueError,
        match="ledger.budget, ledger.exceed_budget: PublicSplitDataModule releases nothing",
    ):
        PublicSplitDataModule(source, ledger=LedgerSettings(budget=1.0))


def test_generated_points_enter_no_public_use():
    """Independent draws of a generated source share byte-identical float32 points by chance
    and belong to no person: their uses without noise are not entered (their releases are)."""
    from lightning_dpot.data import Digits, HalfCircle
    from lightning_dpot.data.ledger_file import PrivacyLedger
    from lightning_dpot.data.ledger_public import held_out_use

    ledger = PrivacyLedger()
    circle = HalfCircle(n=50, n_test=20)
    assert held_out_use(ledger.record_keys, circle, circle.load().test, "X") is None
    digits = Digits()
    assert held_out_use(ledger.record_keys, digits, digits.load().test, "X") is not None
