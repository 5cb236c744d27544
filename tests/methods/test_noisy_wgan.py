"""NoisyWGAN (Reshetova et al. 2024, eq. 23): generated records pass through the data's
randomizer with fresh noise every step, and the loss is the unregularized (exact) OT with the
mechanism's cost."""

import math

import lightning as L
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from lightning_dpot.data import Digits, PrivatizedDataModule
from lightning_dpot.methods import NoisyWGAN
from lightning_dpot.methods.noisy_wgan import fresh_mechanism_noise
from lightning_dpot.nn import DCGANGenerator
from lightning_dpot.ot import ExactOT, l1_cost
from lightning_dpot.privacy.mechanisms.projections import project_l1_ball


def _dm(tmp_path, **kw):
    args = dict(
        source=Digits(),
        mechanism="laplace",
        noise_scale=0.5,
        batch_size=32,
        cache_dir=str(tmp_path / "cache"),
    )
    args.update(kw)
    dm = PrivatizedDataModule(**args)
    dm.setup("fit")
    return dm


def _module(dm, **kw):
    module = NoisyWGAN(
        DCGANGenerator(latent_dim=4, image_size=8, hidden_channels=4),
        latent_range=(0.0, 1.0),
        **kw,
    )
    module.transform = dm.transform
    module.loss_fn = module.build_loss(dm)
    return module


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_release_view_adds_fresh_noise_with_the_mechanisms_scale(tmp_path, mechanism):
    extra = {"delta": 1e-4} if mechanism == "gaussian" else {}
    dm = _dm(tmp_path, mechanism=mechanism, noise_scale=0.5, **extra)
    module = _module(dm)
    x = torch.zeros(2000, 1, 8, 8)
    first, second = module.release_view(x), module.release_view(x)
    assert first.shape == (2000, 64)
    assert not torch.equal(first, second)  # fresh noise at every call (every step)
    noise = first.flatten().double()
    assert abs(noise.mean().item()) < 0.02
    assert noise.std().item() == pytest.approx(dm.mechanism.noise_std, rel=0.03)
    if mechanism == "laplace":  # E|Z| = b for Laplace(0, b)
        assert noise.abs().mean().item() == pytest.approx(0.5, rel=0.02)


def test_noise_comes_from_torchs_default_rng_not_the_release_generator(tmp_path):
    dm = _dm(tmp_path)
    release_before = dm.release.clone()
    module = _module(dm)
    x = torch.rand(16, 1, 8, 8) * 2 - 1
    torch.manual_seed(123)
    first = module.release_view(x)
    torch.manual_seed(123)
    second = module.release_view(x)
    assert torch.equal(first, second)
    assert torch.equal(dm.release, release_before)  # the data are never re-noised


def test_laplace_noise_stays_finite_in_float32():
    from lightning_dpot.privacy.mechanisms.additive import LaplaceMechanism

    mech = LaplaceMechanism.from_scale(3.0, 1568.0)
    noise = fresh_mechanism_noise(mech, torch.empty(2000, 784))
    assert bool(torch.isfinite(noise).all())


def test_generated_records_are_projected_like_the_data_before_noise(tmp_path):
    dm = _dm(tmp_path, noise_scale=1e-6, l1_radius=3.0)
    module = _module(dm)
    x = torch.rand(8, 1, 8, 8) * 2 - 1
    expected = project_l1_ball(x.reshape(8, -1), 3.0)
    assert torch.allclose(module.release_view(x), expected, atol=1e-4)


def test_release_view_lives_in_the_dct_domain_for_dct_releases(tmp_path):
    dm = _dm(tmp_path, transform="dct", dct_keep=4)
    module = _module(dm)
    assert module.release_view(torch.zeros(3, 1, 8, 8)).shape == (3, 16)


def test_loss_is_the_exact_unregularized_ot_with_the_mechanisms_cost(tmp_path):
    dm = _dm(tmp_path)  # Laplace → p = 1, ℓ1 cost
    module = _module(dm)
    assert module.regularization == "none" and module.p == 1
    assert isinstance(module.loss_fn, ExactOT)
    assert module.loss_description()["entropic_reg"] is None
    fake = module.release_view(module(module.sample_latent(32)))
    real = dm.release[:32]
    cost = l1_cost(fake, real).detach().double().numpy()
    rows, cols = linear_sum_assignment(cost)
    expected = cost[rows, cols].mean()
    assert module.compute_loss(fake, real).item() == pytest.approx(expected, rel=1e-5)


def test_noisy_wgan_trains_through_the_trainer_and_samples_images(tmp_path):
    dm = PrivatizedDataModule(
        Digits(), "laplace", noise_scale=0.5, batch_size=64, cache_dir=str(tmp_path / "c")
    )
    module = NoisyWGAN(
        DCGANGenerator(latent_dim=4, image_size=8, hidden_channels=4), latent_range=(0.0, 1.0)
    )
    before = [p.detach().clone() for p in module.parameters()]
    trainer = L.Trainer(
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module, datamodule=dm)
    assert math.isfinite(trainer.callback_metrics["train/loss"].item())
    assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))
    samples = module.sample(5)  # images G(z), no noise
    assert samples.shape == (5, 1, 8, 8) and samples.abs().max() <= 1.0
