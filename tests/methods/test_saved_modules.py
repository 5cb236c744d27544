"""A saved module holds no private record: each method trains a few steps on records of seeded
random float32 values, then its ``pickle`` and ``torch.save`` bytes (after fit, and from inside
the run) are searched for the records; a saved flow or generator still samples."""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from torch import Tensor

import lightning_dpot.privacy.mechanisms.gradient_sanitizer as gradient_sanitizer
from lightning_dpot.data import (
    CentralDPDataModule,
    DataSource,
    DataSplits,
    PrivateLatentDataModule,
    PrivatizedDataModule,
)
from lightning_dpot.data.public_split import PublicSplitDataModule
from lightning_dpot.methods import (
    DPMERF,
    AutoencoderModule,
    DPSinkhorn,
    DPSWFlow,
    DPSWFlowR,
    DPSWGen,
    EntropicWGAN,
    NoisyWGAN,
)
from lightning_dpot.nn import ConditionalDCGANGenerator, ConvAutoencoder32, MLPGenerator

pytestmark = pytest.mark.filterwarnings("ignore:.*no PrivacyAccountantCallback is attached")


class Records(DataSource):
    """``n`` training and ``n // 4`` held-out records of seeded random float32 values in
    (−0.7, 0.7) (2-D rows lie in the unit ball), labels in 0..9."""

    low, high = -1.0, 1.0
    num_classes = 10

    def __init__(self, sample_shape: tuple[int, ...] = (2,), n: int = 120, seed: int = 0) -> None:
        self.sample_shape = tuple(sample_shape)
        self.n, self.seed = n, seed

    def load(self) -> DataSplits:
        g = torch.Generator().manual_seed(self.seed)
        n_test = self.n // 4
        x = torch.rand(self.n + n_test, *self.sample_shape, generator=g, dtype=torch.float64)
        x = (1.4 * x - 0.7).float()
        y = torch.randint(10, (self.n + n_test,), generator=g)
        return DataSplits(x[: self.n], y[: self.n], x[self.n :], y[self.n :])


class SaveEveryStep(L.Callback):
    """``torch.save(pl_module)`` after every training batch, as a user callback would."""

    def __init__(self) -> None:
        self.saved: list[bytes] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        buffer = io.BytesIO()
        torch.save(pl_module, buffer)
        self.saved.append(buffer.getvalue())


def _trainer(root: Path, steps: int = 2, callbacks: tuple = ()) -> L.Trainer:
    return L.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        callbacks=list(callbacks),
    )


def _saved(model: L.LightningModule) -> list[bytes]:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    return [pickle.dumps(model), buffer.getvalue()]


def assert_holds_no_record(blobs: list[bytes], records: Tensor, what: str) -> None:
    """No row of ``records`` (its bytes), and none of its three largest values (as float32 and
    float64; larger than a fresh network's weights), occurs in any of ``blobs``."""
    rows = records.detach().cpu().reshape(records.shape[0], -1).numpy()
    flat = rows.reshape(-1)
    largest = flat[np.argsort(-np.abs(flat))[:3]]
    needles = [row.tobytes() for row in rows]
    needles += [np.float32(v).tobytes() for v in largest]
    needles += [np.float64(v).tobytes() for v in largest]
    for blob in blobs:
        found = sum(needle in blob for needle in needles)
        assert found == 0, f"{found} of the {what} occur in a saved module"


def _toy(batch_size: int | None = None) -> PrivateLatentDataModule:
    return PrivateLatentDataModule(
        Records(), normalize="ball", batch_size=batch_size, steps_per_epoch=10, seed=0
    )


def _flow() -> tuple[L.LightningModule, L.LightningDataModule]:
    model = DPSWFlow(num_particles=32, num_directions=10, directions_per_step=5, noise_scale=0.5)
    return model, _toy()


def _flow_r() -> tuple[L.LightningModule, L.LightningDataModule]:
    return DPSWFlowR(num_particles=32, num_directions=10, noise_scale=0.5), _toy(batch_size=30)


def _gen() -> tuple[L.LightningModule, L.LightningDataModule]:
    generator = MLPGenerator(latent_dim=2, output_shape=[2], hidden=[16])
    model = DPSWGen(generator, num_directions=12, noise_scale=2.0, generated_batch_size=32)
    return model, _toy(batch_size=30)


DPSW = {"DPSWFlow": _flow, "DPSWFlowR": _flow_r, "DPSWGen": _gen}


def _same_samples(saved: L.LightningModule, live: L.LightningModule) -> None:
    """The loaded module samples as the live one (a seeded draw for a generator)."""
    draws = [m.sample(6, generator=torch.Generator().manual_seed(0)) for m in (saved, live)]
    torch.testing.assert_close(draws[0], draws[1], rtol=0, atol=0)


def assert_holds_no_noise_seed(blobs: list[bytes], model: L.LightningModule) -> None:
    """The secret seeds of the model's noise generators (from which its noise could be
    regenerated and subtracted) occur in none of ``blobs``."""
    seeds = [
        generator.initial_seed().to_bytes(8, "little")
        for release in model.privacy_releases()
        for generator in release.noise._entropy.values()
    ]
    assert seeds, "the run drew no secret noise"
    for blob in blobs:
        assert not any(seed in blob for seed in seeds), "a noise seed occurs in a saved module"


@pytest.mark.parametrize("name", list(DPSW))
def test_saved_dpsw_module_holds_no_private_latent_and_still_samples(name: str, tmp_path):
    model, dm = DPSW[name]()
    during = SaveEveryStep()
    _trainer(tmp_path, callbacks=(during,)).fit(model, dm)
    blobs = _saved(model)
    assert_holds_no_record(blobs + during.saved, dm.private_records(), "private latents")
    assert_holds_no_record(blobs, dm.test_records, "held-out records")
    assert_holds_no_noise_seed(blobs + during.saved, model)
    _same_samples(pickle.loads(blobs[0]), model)
    _same_samples(torch.load(io.BytesIO(blobs[1]), weights_only=False), model)


@pytest.fixture(scope="module")
def autoencoder_checkpoint(tmp_path_factory) -> Path:
    """A stage-1 checkpoint: the autoencoder after one step on the public split."""
    root = tmp_path_factory.mktemp("stage1")
    trainer = _trainer(root, steps=1)
    datamodule = PublicSplitDataModule(Records((1, 32, 32), n=40), batch_size=8)
    trainer.fit(AutoencoderModule(ConvAutoencoder32(8, 1)), datamodule)
    trainer.save_checkpoint(root / "autoencoder.ckpt")
    return root / "autoencoder.ckpt"


def _latent_dm(checkpoint: Path, batch_size: int | None = None) -> PrivateLatentDataModule:
    return PrivateLatentDataModule(
        Records((1, 32, 32), n=40),
        autoencoder=ConvAutoencoder32(8, 1),
        autoencoder_checkpoint=str(checkpoint),
        batch_size=batch_size,
        steps_per_epoch=10,
        seed=0,
    )


@pytest.mark.parametrize("name", ["DPSWFlow", "DPSWGen"])
def test_saved_latent_module_holds_no_private_image_or_latent_and_decodes(
    name: str, tmp_path, autoencoder_checkpoint
):
    if name == "DPSWFlow":
        model = DPSWFlow(num_particles=8, num_directions=10, directions_per_step=5, noise_scale=0.5)
        dm = _latent_dm(autoencoder_checkpoint)
    else:
        generator = MLPGenerator(2, (1, 32, 32), (8,), output_activation="tanh")
        model = DPSWGen(generator, num_directions=12, noise_scale=2.0, generated_batch_size=8)
        dm = _latent_dm(autoencoder_checkpoint, batch_size=8)
    during = SaveEveryStep()
    _trainer(tmp_path, callbacks=(during,)).fit(model, dm)
    blobs = _saved(model)
    images = dm.source.load().train[torch.tensor(dm.split.private, dtype=torch.long)]
    assert_holds_no_record(blobs + during.saved, images, "private images")
    assert_holds_no_record(blobs + during.saved, dm.private_records(), "private latents")
    restored = pickle.loads(blobs[0])
    assert restored.sample(4).shape == (4, 1, 32, 32)  # decoded by the public decoder
    _same_samples(restored, model)


def _dp_sinkhorn() -> tuple[L.LightningModule, L.LightningDataModule]:
    generator = ConditionalDCGANGenerator(
        10, latent_dim=4, embed_dim=2, image_size=8, hidden_channels=(8, 8, 8)
    )
    model = DPSinkhorn(generator, noise_multiplier=1.0, clip_norm=0.5, num_cross=10, lr=1e-3)
    return model, CentralDPDataModule(Records((1, 8, 8), n=100), sample_rate=0.2, seed=0)


def _dp_merf() -> tuple[L.LightningModule, L.LightningDataModule]:
    generator = ConditionalDCGANGenerator(
        10, latent_dim=4, embed_dim=2, image_size=8, hidden_channels=(8, 8, 8)
    )
    model = DPMERF(generator, noise_scale=1.0, num_frequencies=50, length_scale=4.0)
    return model, CentralDPDataModule(Records((1, 8, 8), n=100), sample_rate=0.2, seed=0)


def _entropic_wgan(root: Path) -> tuple[L.LightningModule, L.LightningDataModule]:
    dm = PrivatizedDataModule(
        Records(n=200), "gaussian", epsilon=5.0, delta=1e-4, batch_size=50,
        cache_dir=str(root / "cache"),
    )  # fmt: skip
    return EntropicWGAN(MLPGenerator(2, (2,), (16,))), dm


def _noisy_wgan(root: Path) -> tuple[L.LightningModule, L.LightningDataModule]:
    dm = PrivatizedDataModule(
        Records(n=200), "laplace", noise_scale=0.5, batch_size=50, cache_dir=str(root / "cache")
    )
    return NoisyWGAN(MLPGenerator(2, (2,), (16,))), dm


GENERATORS: dict[str, Callable[[Path], tuple[L.LightningModule, L.LightningDataModule]]] = {
    "DPSinkhorn": lambda root: _dp_sinkhorn(),
    "DPMERF": lambda root: _dp_merf(),
    "EntropicWGAN": _entropic_wgan,
    "NoisyWGAN": _noisy_wgan,
}


@pytest.mark.parametrize("name", list(GENERATORS))
def test_saved_generator_module_holds_no_raw_record_and_still_samples(name: str, tmp_path):
    """DP-Sinkhorn trains on the raw records; the WGANs on their local-DP release, so the raw
    records must not reach the module either."""
    model, dm = GENERATORS[name](tmp_path)
    during = SaveEveryStep()
    _trainer(tmp_path, steps=3, callbacks=(during,)).fit(model, dm)
    blobs = _saved(model)
    splits = dm.source.load()
    assert_holds_no_record(blobs + during.saved, splits.train, "raw training records")
    assert_holds_no_record(blobs, splits.test, "held-out records")
    if name == "DPMERF":
        assert_holds_no_noise_seed(blobs + during.saved, model)
    if name == "DPSinkhorn":
        assert_holds_no_noise_seed(blobs + during.saved, model)
        # nor statistics of a private solve (sweeps, marginal error tell batches apart): its
        # solves do fixed work and compute none
        assert model.loss_fn.solver.fixed_budget
        assert model.loss_fn.last_info is None
        assert pickle.loads(blobs[0]).loss_fn.last_info is None
    _same_samples(pickle.loads(blobs[0]), model)


def test_saved_dp_sinkhorn_holds_no_gradient_before_noise(tmp_path, monkeypatch):
    """The clipped cross block is a function of the private batch: only its noisy release is
    post-processing, so no clipped cross block may be saved."""
    cross_blocks: list[Tensor] = []
    real_call = gradient_sanitizer.GradientSanitizer.__call__
    real_clip = gradient_sanitizer.clip_frobenius

    def spy_call(self, grad, num_cross, *args, **kwargs):
        def clip(rows, clip_norm):
            clipped = real_clip(rows, clip_norm)
            if rows.shape[0] == num_cross:
                cross_blocks.append(clipped.detach().clone())
            return clipped

        monkeypatch.setattr(gradient_sanitizer, "clip_frobenius", clip)
        try:
            return real_call(self, grad, num_cross, *args, **kwargs)
        finally:
            monkeypatch.setattr(gradient_sanitizer, "clip_frobenius", real_clip)

    monkeypatch.setattr(gradient_sanitizer.GradientSanitizer, "__call__", spy_call)
    model, dm = _dp_sinkhorn()  # 10 cross rows, 7 debias rows: the cross block is told apart
    during = SaveEveryStep()
    _trainer(tmp_path, steps=3, callbacks=(during,)).fit(model, dm)
    assert len(cross_blocks) == 3
    for block in cross_blocks:
        assert_holds_no_record(_saved(model) + during.saved, block, "clipped cross rows")
