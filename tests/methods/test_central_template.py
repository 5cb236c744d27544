"""A new central-DP method on ``SanitizedGradientModule`` writes its loss and nothing else: the
template binds the Poisson data, calibrates σ, sanitizes the generated rows' gradient and is
accounted like DP-Sinkhorn."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from torch import Tensor

from lightning_dpot.callbacks.privacy_accountant import PrivacyAccountantCallback
from lightning_dpot.data import CentralDPDataModule, Digits
from lightning_dpot.methods.central import SanitizedGradientModule
from lightning_dpot.nn import MLPGenerator
from lightning_dpot.privacy.accounting.analysis.epsilon import subsampled_gaussian_epsilon


class MomentMatching(SanitizedGradientModule):
    """Match the mean and second moment of the private records (a new method, in full)."""

    method_description = "moment matching with sanitized gradients"

    def build_central_loss(self, datamodule, shape: tuple[int, ...]) -> None:
        self.dims = tuple(range(1, 1 + len(shape)))

    def central_loss(self, fake: Tensor, labels, real: Tensor, real_labels) -> Tensor:
        fake = fake.flatten(1)
        if len(real) == 0:  # an empty Poisson batch: still a step, with zero signal
            return 0.0 * fake.sum()
        real = real.flatten(1)
        mean = (fake.mean(0) - real.mean(0)).pow(2).sum()
        second = (fake.pow(2).mean(0) - real.pow(2).mean(0)).pow(2).sum()
        return mean + second


def _module(**kwargs) -> MomentMatching:
    generator = MLPGenerator(latent_dim=4, output_shape=(1, 8, 8), hidden=(32,))
    return MomentMatching(generator, conditional=False, clip_norm=1.0, lr=1e-2, **kwargs)


def _trainer(root: Path, accountant: PrivacyAccountantCallback, steps: int) -> L.Trainer:
    return L.Trainer(
        default_root_dir=root, accelerator="cpu", devices=1, max_steps=steps, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[accountant],
    )  # fmt: skip


def test_a_new_central_method_is_calibrated_sanitized_and_accounted(tmp_path, monkeypatch):
    monkeypatch.setenv("DPOT_LEDGER_DIR", str(tmp_path / "ledger"))
    module = _module(noise_multiplier=None, target_epsilon=2.0, delta=1e-5)
    accountant = PrivacyAccountantCallback(2.0, 1e-5)
    data = CentralDPDataModule(Digits(), expected_batch_size=64)
    _trainer(tmp_path, accountant, steps=20).fit(module, data)
    sigma, q = module.sanitizer.noise_multiplier, data.sample_rate
    assert sigma > 0 and module.sanitizer.sample_rate == q  # calibrated, secret Poisson seed
    assert accountant.releases == module.releases_emitted() == 20
    assert accountant.epsilon() == pytest.approx(subsampled_gaussian_epsilon(sigma, q, 20, 1e-5))
    assert accountant.epsilon() <= 2.0
    assert module.privacy_context()["method"] == "moment matching with sanitized gradients"


def test_the_template_refuses_what_dp_sinkhorn_refuses(tmp_path):
    with pytest.raises(ValueError, match="target_epsilon needs delta"):
        _module(noise_multiplier=None, target_epsilon=2.0)
    module = _module(noise_multiplier=1.0, delta=1e-5)
    records = torch.utils.data.DataLoader(torch.zeros(8, 1, 8, 8), batch_size=4)
    trainer = _trainer(tmp_path, PrivacyAccountantCallback(2.0, 1e-5), steps=1)
    with pytest.raises(ValueError, match="trains on a datamodule implementing CentralPrivateData"):
        trainer.fit(module, train_dataloaders=records)
