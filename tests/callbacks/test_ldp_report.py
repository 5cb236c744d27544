"""The local-DP report reaches the loggers only as it may leave the machine: a W&B run (offline,
its log uploaded later by ``wandb sync``) holds the release's guarantee but neither the privacy
ledger's total nor its path, which ``report.json`` in the run directory keeps."""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import pytest

from lightning_dpot.callbacks import LDPPrivacyReport
from lightning_dpot.data import HalfCircle, PrivatizedDataModule
from lightning_dpot.data.ledger import LEDGER_ENV
from lightning_dpot.loggers import WandbRunLogger
from lightning_dpot.methods import EntropicWGAN
from lightning_dpot.nn import MLPGenerator


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B offline, its staging, cache and settings folders in the test's temporary folder."""
    monkeypatch.delenv("DPOT_WANDB_ONLINE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb" / name.lower()))


def test_the_wandb_run_holds_the_shareable_report_without_the_ledger(tmp_path, offline_wandb):
    import wandb

    ledger = Path(os.environ[LEDGER_ENV])  # this test's own ledger (tests/conftest.py)
    data = PrivatizedDataModule(
        HalfCircle(n=200, n_test=10), mechanism="laplace", epsilon=2.5, batch_size=100,
        cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    model = EntropicWGAN(MLPGenerator(2, (2,), (8,)), generated_batch_size=100)
    logger = WandbRunLogger(name="ldp", save_dir=str(tmp_path / "runs"))
    trainer = L.Trainer(
        max_steps=1, logger=logger, callbacks=[LDPPrivacyReport()], limit_val_batches=0,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, data)
    wandb.teardown()  # the W&B service writes the run's log out

    (log,) = Path(logger.save_dir).glob("wandb/offline-run-*/run-*.wandb")
    logged = log.read_bytes()
    assert b"privacy/epsilon" in logged and b"privacy/mechanism" in logged  # it was logged
    ledger_section = data.privacy_report()["ledger"]
    assert ledger_section["path"] == str(ledger / "ledger.jsonl")  # what the run dir keeps
    secrets = (str(ledger), "privacy/ledger", "all_releases_of_these_records")
    for secret in (*secrets, ledger_section["keying"]):
        assert secret.encode() not in logged, secret
