"""Every check that can refuse a run runs before its first release: a run that the module (record
shape, data protocol) or Lightning's tuners would refuse draws no local release, writes nothing to
the privacy ledger and makes no central release."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import BatchSizeFinder, LearningRateFinder
from lightning.pytorch.tuner import Tuner

from lightning_dpot.callbacks.privacy_accountant import PrivacyAccountantCallback
from lightning_dpot.cli import main
from lightning_dpot.data import (
    CentralDPDataModule,
    GaussianMixture2D,
    HalfCircle,
    PrivateLatentDataModule,
    PrivatizedDataModule,
)
from lightning_dpot.data.ledger import PrivacyLedger
from lightning_dpot.methods import DPSinkhorn, DPSWFlowR, EntropicWGAN
from lightning_dpot.nn import MLPGenerator

REPO = Path(__file__).resolve().parents[1]


def _ledger_lines() -> list[str]:
    """The entries of this test's privacy ledger (``$DPOT_LEDGER_DIR``, tests/conftest.py)."""
    path = PrivacyLedger().path
    return path.read_text().splitlines() if path.is_file() else []


def _releases(folder: Path) -> list[Path]:
    return sorted(folder.rglob("release-*.pt"))  # a lock file may stay, empty


def _fit_line(args: list[str], capsys) -> str:
    """``dpot fit`` with ``args``: it must end in one error line, which is returned."""
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def _trainer(root: Path, callbacks: list, **kwargs) -> L.Trainer:
    return L.Trainer(
        default_root_dir=root,
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
        **kwargs,
    )


def _local_data(tmp_path: Path) -> PrivatizedDataModule:
    return PrivatizedDataModule(
        HalfCircle(n=100, n_test=10), "laplace", 1.0, batch_size=20, cache_dir=str(tmp_path / "c")
    )


# -- the module's checks -----------------------------------------------------------------------


def test_the_quickstart_on_four_columns_is_refused_before_its_release(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    records = tmp_path / "records.pt"
    torch.save(torch.rand(200, 4) * 2 - 1, records)
    line = _fit_line(
        [
            "--config", str(REPO / "configs/quickstart.yaml"),
            "--data.init_args.source=lightning_dpot.data.TensorFile",
            f"--data.init_args.source.init_args.path={records}",
            "--data.init_args.source.init_args.low=-1",
            "--data.init_args.source.init_args.high=1",
            "--data.init_args.batch_size=100",
            "--model.init_args.generated_batch_size=100",
            f"--data.init_args.cache_dir={tmp_path / 'cache'}",
            f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        ],
        capsys,
    )  # fmt: skip
    assert line.startswith(
        "dpot fit: error: the generator outputs records of shape (2,), but the data has shape "
        "(4,); set the generator's output shape to match"
    ), line
    assert _releases(tmp_path) == []
    assert _ledger_lines() == []


def test_dp_sinkhorn_on_a_local_release_is_refused_before_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = {
        "trainer": {"max_steps": 1, "logger": False, "enable_checkpointing": False},
        "model": {
            "class_path": "lightning_dpot.methods.DPSinkhorn",
            "init_args": {
                "generator": {
                    "class_path": "lightning_dpot.nn.MLPGenerator",
                    "init_args": {"latent_dim": 2, "output_shape": [2], "hidden": [4]},
                },
                "conditional": False,
                "noise_multiplier": 1.0,
                "delta": 1.0e-5,
                "num_cross": 10,
            },
        },
        "data": {
            "class_path": "lightning_dpot.data.PrivatizedDataModule",
            "init_args": {
                "source": {"class_path": "lightning_dpot.data.HalfCircle", "init_args": {"n": 100}},
                "mechanism": "laplace",
                "epsilon": 1.0,
                "batch_size": 20,
                "cache_dir": str(tmp_path / "cache"),
            },
        },
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    line = _fit_line(["--config", str(path)], capsys)
    assert line.startswith(
        "dpot fit: error: DPSinkhorn needs a datamodule implementing "
        "lightning_dpot.data.protocols.CentralPrivateData; PrivatizedDataModule lacks "
    ), line
    assert _releases(tmp_path) == []
    assert _ledger_lines() == []


def test_a_loss_the_mechanism_refuses_is_refused_before_the_release(tmp_path):
    """What the module builds from the data's public facts (here the cost against the
    mechanism, Reshetova et al. 2024, Theorem 1) is checked before the release too."""
    data = _local_data(tmp_path)
    with pytest.raises(ValueError, match="p=2 does not match the laplace mechanism"):
        _trainer(tmp_path, []).fit(EntropicWGAN(MLPGenerator(2, (2,), (4,)), p=2), data)
    assert _releases(tmp_path) == [] and _ledger_lines() == []


# -- Lightning's tuners ------------------------------------------------------------------------


def test_the_learning_rate_finder_is_refused_before_a_local_release(tmp_path):
    data = _local_data(tmp_path)
    model = EntropicWGAN(MLPGenerator(2, (2,), (4,)))
    trainer = _trainer(tmp_path, [LearningRateFinder(num_training_steps=2)])
    with pytest.raises(
        ValueError,
        match=r"^LearningRateFinder \(Lightning's tuner\) is refused on the private run of "
        r"PrivatizedDataModule",
    ):
        trainer.fit(model, data)
    assert _releases(tmp_path) == [] and _ledger_lines() == []
    _trainer(tmp_path, []).fit(model, data)  # the same run without the tuner releases, once
    assert len(_releases(tmp_path)) == 1
    ledger = PrivacyLedger()
    spent = ledger.total(ledger.training_keys(data.source.load()))
    assert (spent.releases, spent.epsilon) == (1, 1.0)


def test_lr_find_is_refused_before_dp_sinkhorn_releases_anything(tmp_path):
    model = DPSinkhorn(
        MLPGenerator(2, (2,), (4,)), noise_multiplier=1.0, delta=1e-5, conditional=False,
        num_cross=10,
    )  # fmt: skip
    data = CentralDPDataModule(HalfCircle(n=100, n_test=10), sample_rate=0.2)
    trainer = _trainer(tmp_path, [PrivacyAccountantCallback()])
    with pytest.raises(ValueError, match=r"^LearningRateFinder \(Lightning's tuner\).* DPSinkhorn"):
        Tuner(trainer).lr_find(model, datamodule=data, num_training=2)
    assert model.sanitizer.events.total == 0
    assert _ledger_lines() == []


def test_the_batch_size_finder_is_refused_before_dpsw_releases_anything(tmp_path):
    model = DPSWFlowR(num_particles=32, num_directions=8, noise_scale=6.0)
    data = PrivateLatentDataModule(
        GaussianMixture2D(n=100, n_test=10), normalize="ball", batch_size=20, steps_per_epoch=5
    )
    trainer = _trainer(tmp_path, [BatchSizeFinder(max_trials=1), PrivacyAccountantCallback()])
    with pytest.raises(ValueError, match=r"^BatchSizeFinder \(Lightning's tuner\).* DPSWFlowR"):
        trainer.fit(model, data)
    assert model.mechanism_calls == 0
    assert _ledger_lines() == []
