"""A new central-DP method on ``ReleasedStatisticModule`` names its release and writes its
statistic and its loss: the template calibrates σ, draws the release once, accounts it, keeps it
through a resume and refuses a fit that would not account it."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import Tensor

from lightning_dpot.callbacks.privacy_accountant import PrivacyAccountantCallback
from lightning_dpot.data import CentralDPDataModule, Digits
from lightning_dpot.methods.released_statistic import ReleasedStatisticModule
from lightning_dpot.nn import MLPGenerator
from lightning_dpot.privacy.mechanisms.clipped_sum import ClippedSumRelease
from lightning_dpot.privacy.mechanisms.gaussian import analytic_gaussian_epsilon, gaussian_sigma


class MeanMatching(ReleasedStatisticModule):
    """Release the records' mean once; fit the generated mean to it (a new method, in full)."""

    method_description = "mean matching on one release"

    def __init__(self, generator, dim: int, clip_norm: float, delta: float, **kwargs) -> None:
        release = ClippedSumRelease(clip_norm, delta, kwargs.pop("noise_seed", None))
        super().__init__(generator, release, (1, dim), conditional=False, **kwargs)

    def prepare_release(self, datamodule, shape: tuple[int, ...]) -> None:
        self.num_records = int(datamodule.num_private)  # public: the dataset's size

    def release_statistic(self, datamodule, source) -> Tensor:
        bounds = (float(datamodule.source.low), float(datamodule.source.high))
        total = self.release(datamodule.train_records, None, lambda x: x, 1, bounds, source)
        return total / self.num_records

    def statistic_loss(self, fake: Tensor, labels) -> Tensor:
        return (fake.flatten(1).mean(0) - self.statistic[0]).pow(2).sum()


def _fit(root: Path, steps: int, ckpt_path: str | None = None, **kwargs) -> tuple:
    generator = MLPGenerator(latent_dim=4, output_shape=(1, 8, 8), hidden=(32,))
    module = MeanMatching(generator, 64, clip_norm=8.0, delta=1e-5, lr=1e-2, **kwargs)
    data = CentralDPDataModule(Digits(), expected_batch_size=1, steps_per_epoch=100, seed=0)
    trainer = L.Trainer(
        default_root_dir=root, accelerator="cpu", devices=1, max_steps=steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[PrivacyAccountantCallback()],
    )  # fmt: skip
    trainer.fit(module, data, ckpt_path=ckpt_path)
    return module, data, trainer


def test_a_new_one_release_method_is_calibrated_released_once_and_accounted(tmp_path):
    module, data, trainer = _fit(tmp_path, 30, target_epsilon=1.0)
    sigma = gaussian_sigma(1.0, 1e-5, 16.0)  # Δ = 2C: every record is inside the ball of 8
    assert module.release.noise_scale == sigma and module.release.events.total == 1
    report = json.loads((tmp_path / "privacy_report.json").read_text())
    assert report["epsilon"] == pytest.approx(analytic_gaussian_epsilon(sigma, 1e-5, 16.0))
    assert report["module"]["method"] == "mean matching on one release"
    # what is kept is the noisy mean: σ/n from the records' mean per coordinate
    mean = data.train_records.flatten(1).double().mean(0)
    gap = (module.statistic[0].double() - mean).std()
    assert gap == pytest.approx(sigma / data.num_private, rel=0.2)
    # a resume trains on the checkpoint's release and draws nothing
    ckpt = tmp_path / "step30.ckpt"
    trainer.save_checkpoint(ckpt)
    resumed, _, _ = _fit(tmp_path / "resumed", 40, str(ckpt), target_epsilon=1.0)
    assert resumed.release.events.total == 1
    torch.testing.assert_close(resumed.statistic, module.statistic)


def test_the_template_refuses_an_unaccounted_release_and_a_double_setting(tmp_path):
    with pytest.raises(ValueError, match="exactly one of noise_scale"):
        _fit(tmp_path, 1, noise_scale=1.0, target_epsilon=1.0)
    with pytest.raises(ValueError, match="trains no batch"):
        _fit(tmp_path, 0, target_epsilon=1.0)
