"""Every image method generates images that differ from each other after a short real run: the
per-pixel spread across samples stays well above that of a constant image (a generator stuck at
one output has a spread near 0 whatever its loss says)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import lightning as L
import pytest
import torch

from lightning_dpot import methods
from lightning_dpot.data import (
    MNIST,
    CentralDPDataModule,
    Digits,
    PrivateLatentDataModule,
    PrivatizedDataModule,
    PublicSplitDataModule,
)
from lightning_dpot.nn import (
    ConditionalDCGANGenerator,
    ConvAutoencoder32,
    DCGANGenerator,
    DecoderGenerator,
)

# On [-1, 1] pixels: 5-20x a fresh generator's spread (0.001-0.004); the data's is about 0.5.
SPREAD_FLOOR = 0.02


def per_pixel_spread(images: torch.Tensor) -> float:
    """Mean over pixels of the standard deviation across samples."""
    return float(images.flatten(1).std(dim=0).mean())


def _fit(model: L.LightningModule, data: L.LightningDataModule, root: Path, steps: int) -> None:
    L.Trainer(
        max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(root),
    ).fit(model, data)  # fmt: skip


@pytest.fixture(scope="module")
def public_autoencoder(tmp_path_factory, digit_idx_dir) -> tuple[Path, Path]:
    """Stage 1 on the public half of 400 generated digits at 32×32 (200 steps): its checkpoint
    and split file."""
    root = tmp_path_factory.mktemp("stage1")
    source = MNIST(idx_dir=str(digit_idx_dir), split="test-only", image_size=32, limit=400)
    data = PublicSplitDataModule(source, split_file=str(root / "split.json"), batch_size=32)
    module = methods.AutoencoderModule(ConvAutoencoder32(8, 1), loss="bce", lr=3e-3)
    trainer = L.Trainer(
        max_steps=200, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(root),
    )  # fmt: skip
    trainer.fit(module, data)
    trainer.save_checkpoint(root / "autoencoder.ckpt")
    return root / "autoencoder.ckpt", root / "split.json"


def _latents(digit_idx_dir: Path, autoencoder: tuple[Path, Path]) -> PrivateLatentDataModule:
    checkpoint, split = autoencoder
    return PrivateLatentDataModule(
        MNIST(idx_dir=str(digit_idx_dir), split="test-only", image_size=32, limit=400),
        autoencoder=ConvAutoencoder32(8, 1), autoencoder_checkpoint=str(checkpoint),
        split_file=str(split), batch_size=50, steps_per_epoch=4,
    )  # fmt: skip


def _local(model_cls: Callable[..., L.LightningModule], root: Path):
    generator = DCGANGenerator(latent_dim=4, image_size=8, hidden_channels=8)
    data = PrivatizedDataModule(
        Digits(), mechanism="gaussian", noise_scale=0.5, delta=1e-4, batch_size=64,
        cache_dir=str(root / "cache"),
    )  # fmt: skip
    return model_cls(generator, latent_range=(0.0, 1.0), lr=1e-2), data


def _central(model_cls: Callable[..., L.LightningModule], **kwargs):
    generator = ConditionalDCGANGenerator(10, latent_dim=4, image_size=8, hidden_channels=(8, 8, 8))
    data = CentralDPDataModule(Digits(), expected_batch_size=50, steps_per_epoch=4)
    return model_cls(generator, **kwargs), data


CASES = {
    "entropic_wgan": lambda root, **_: _local(methods.EntropicWGAN, root),
    "noisy_wgan": lambda root, **_: _local(methods.NoisyWGAN, root),
    "dp_sinkhorn": lambda root, **_: _central(methods.DPSinkhorn, noise_multiplier=1.0, lr=1e-2),
    "dp_merf": lambda root, **_: _central(
        methods.DPMERF, noise_scale=1.0, num_frequencies=200, lr=1e-2
    ),
    "dpswflow": lambda root, latents: (
        methods.DPSWFlow(
            num_particles=64, num_directions=12, directions_per_step=8, noise_scale=0.5
        ),
        latents(),
    ),  # fmt: skip
    "dpswflow_r": lambda root, latents: (
        methods.DPSWFlowR(num_particles=64, num_directions=12, noise_scale=0.5),
        latents(),
    ),
    "dpswgen": lambda root, latents: (
        methods.DPSWGen(
            DecoderGenerator("conv32", 8, 1),
            num_directions=12,
            noise_scale=0.5,
            generated_batch_size=32,
            init_from_decoder=True,
        ),
        latents(),
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", list(CASES))
def test_samples_vary_after_a_short_run(name, tmp_path, request, digit_idx_dir):
    def latents() -> PrivateLatentDataModule:
        return _latents(digit_idx_dir, request.getfixturevalue("public_autoencoder"))

    torch.manual_seed(0)
    model, data = CASES[name](tmp_path, latents=latents)
    _fit(model, data, tmp_path, steps=40)
    samples = model.sample(64, generator=torch.Generator().manual_seed(1))
    assert torch.isfinite(samples).all()
    assert per_pixel_spread(samples) > SPREAD_FLOOR, name
    if name == "dpswgen":  # it trained from the decoder's start: its weights moved
        decoder = data.autoencoder.decoder_body.state_dict()
        moved = model.generator.body.state_dict()
        assert any(not torch.equal(moved[k], decoder[k].to(moved[k].device)) for k in decoder)


def test_a_fresh_decoder_shaped_generator_draws_one_image(tmp_path, digit_idx_dir, request):
    """Why DPSWgen starts from the public decoder: a fresh generator of the decoder's shape
    outputs an almost constant grey image, so its samples would not vary after a short run."""
    data = _latents(digit_idx_dir, request.getfixturevalue("public_autoencoder"))
    torch.manual_seed(0)
    model = methods.DPSWGen(
        DecoderGenerator("conv32", 8, 1), num_directions=12, noise_scale=0.5,
        generated_batch_size=32,
    )  # fmt: skip
    _fit(model, data, tmp_path, steps=8)
    assert per_pixel_spread(model.sample(64)) < 0.5 * SPREAD_FLOOR


def test_the_decoder_start_is_kept_by_a_reloaded_generator(tmp_path, digit_idx_dir, request):
    checkpoint = request.getfixturevalue("public_autoencoder")
    torch.manual_seed(0)
    model = methods.DPSWGen(
        DecoderGenerator("conv32", 8, 1), num_directions=12, noise_scale=0.5,
        generated_batch_size=32, init_from_decoder=True,
    )  # fmt: skip
    trainer = L.Trainer(
        max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
    )  # fmt: skip
    trainer.fit(model, _latents(digit_idx_dir, checkpoint))
    trainer.save_checkpoint(tmp_path / "trained.ckpt")
    trained = {k: v.clone() for k, v in model.generator.state_dict().items()}

    reloaded = methods.DPSWGen(
        DecoderGenerator("conv32", 8, 1), num_directions=12, noise_scale=0.5,
        generated_batch_size=32, init_from_decoder=True,
    )  # fmt: skip
    state = torch.load(tmp_path / "trained.ckpt", weights_only=False)["state_dict"]
    reloaded.load_state_dict(state)
    assert bool(reloaded.generator_started)
    _fit(reloaded, _latents(digit_idx_dir, checkpoint), tmp_path / "again", steps=0)
    for key, value in reloaded.generator.state_dict().items():
        torch.testing.assert_close(value, trained[key], msg=key)


def test_the_decoder_start_needs_the_generators_shape(tmp_path, digit_idx_dir, request):
    data = _latents(digit_idx_dir, request.getfixturevalue("public_autoencoder"))
    model = methods.DPSWGen(
        DecoderGenerator("conv32", 4, 1), num_directions=12, noise_scale=0.5,
        init_from_decoder=True,
    )  # fmt: skip
    with pytest.raises(ValueError, match="init_from_decoder=True: the generator's architecture"):
        _fit(model, data, tmp_path, steps=1)
