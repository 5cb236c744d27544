"""DP-MERF (Harder et al. 2021): the random features approximate the Gaussian kernel, the release
has sensitivity 2 under replace-one and refuses bad records before it emits, the accountant
reports the analytic Gaussian ε of the one release, a resume does not release again, nothing
before the noise is saved, and a short private run learns the digits."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import lightning as L
import pytest
import torch
from test_saved_modules import assert_holds_no_record

from lightning_dpot.callbacks import PrivacyAccountantCallback
from lightning_dpot.cli import main
from lightning_dpot.data import CentralDPDataModule, Digits
from lightning_dpot.methods import DPMERF
from lightning_dpot.methods.dp_merf import (
    SENSITIVITY,
    MeanEmbeddingRelease,
    fourier_features,
    random_frequencies,
)
from lightning_dpot.metrics.utility import QUICK, downstream_utility
from lightning_dpot.nn import ConditionalDCGANGenerator
from lightning_dpot.privacy.mechanisms.clipped_sum import block_sum
from lightning_dpot.privacy.mechanisms.gaussian import analytic_gaussian_epsilon, gaussian_sigma
from lightning_dpot.rng import seeded_generator

REPO = Path(__file__).resolve().parents[2]


def test_features_have_unit_norm_and_approximate_the_gaussian_kernel():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 5, generator=g, dtype=torch.float64)
    length_scale = 1.5
    phi = fourier_features(x, random_frequencies(40_000, 5, length_scale, seed=1))
    torch.testing.assert_close(phi.norm(dim=1), torch.ones(6, dtype=torch.float64))
    exact = torch.exp(-(torch.cdist(x, x) ** 2) / (2 * length_scale**2))
    assert (phi @ phi.T - exact).abs().max() < 0.02


def _release(noise_scale: float = 0.0) -> MeanEmbeddingRelease:
    release = MeanEmbeddingRelease(1e-5, noise_seed=3, is_private=noise_scale > 0)
    release.calibrate(noise_scale)
    return release


def test_replacing_one_record_moves_the_sum_by_at_most_the_sensitivity():
    g = torch.Generator().manual_seed(0)
    x = 2 * torch.rand(50, 1, 4, 4, generator=g) - 1
    y = torch.randint(3, (50,), generator=g)
    omega = random_frequencies(300, 16, 0.5, seed=0)
    worst = 0.0
    for label in range(3):
        for sign in (-1.0, 1.0):
            x2, y2 = x.clone(), y.clone()
            x2[7], y2[7] = sign, label  # a far record, of every label
            sums = [_release()(a, b, omega, 3, (-1.0, 1.0), None) for a, b in ((x, y), (x2, y2))]
            worst = max(worst, float((sums[0] - sums[1]).norm()))
    assert 1.0 < worst <= SENSITIVITY + 1e-12
    # the noiseless sum is the class-blocked embedding, computed independently
    phi = fourier_features(x.reshape(50, -1).double(), omega)
    expected = torch.stack([phi[y == c].sum(0) for c in range(3)])
    torch.testing.assert_close(_release()(x, y, omega, 3, (-1.0, 1.0), None), expected)
    torch.testing.assert_close(block_sum(phi, y, 3), expected)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("nan", "NaN or Inf"),
        ("large", "outside the declared bounds"),
        ("label", "labels"),
        ("source", "never from the global RNG"),
    ],
)
def test_a_bad_record_is_refused_before_the_release_is_counted(bad, message):
    x = torch.zeros(10, 4)
    y = torch.zeros(10, dtype=torch.long)
    if bad == "nan":
        x[3, 1] = float("nan")
    elif bad == "large":
        x[3, 1] = 1.5
    elif bad == "label":
        y[3] = 5
    release = _release(1.0)
    source = None if bad == "source" else seeded_generator(0)
    bounds = (-1.0, 1.0)
    if bad == "overflow":  # finite records inside wide bounds whose projections overflow
        x, bounds = x.double(), (-math.inf, math.inf)
        x[3, 1] = 1e308
    labels = None if bad == "unlabelled" else y
    with pytest.raises(ValueError, match=message):
        release(x, labels, random_frequencies(10, 4, 1.0, 0), 3, bounds, source)
    assert release.events.total == 0


def _digits_run(
    root, steps: int, *, ckpt_path=None, num_frequencies: int = 200, length_scale: float = 6.0,
    limit_train_batches: int | float = 1.0, **kwargs,
):  # fmt: skip
    generator = ConditionalDCGANGenerator(10, image_size=8, hidden_channels=(16, 16, 16))
    model = DPMERF(
        generator, num_frequencies=num_frequencies, length_scale=length_scale, delta=1e-5,
        **kwargs,
    )  # fmt: skip
    dm = CentralDPDataModule(Digits(), expected_batch_size=1, steps_per_epoch=1000, seed=0)
    trainer = L.Trainer(
        max_steps=steps, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=str(root),
        callbacks=[PrivacyAccountantCallback()], limit_train_batches=limit_train_batches,
    )  # fmt: skip
    trainer.fit(model, dm, ckpt_path=ckpt_path)
    return model, dm, trainer


def test_the_accountant_reports_the_one_release_at_the_analytic_epsilon(tmp_path):
    model, _, trainer = _digits_run(tmp_path, 4, target_epsilon=2.0)
    sigma = gaussian_sigma(2.0, 1e-5, SENSITIVITY)
    assert model.release.noise_scale == sigma
    assert model.release.events.total == 1
    report = json.loads((tmp_path / "privacy_report.json").read_text())
    assert report["adjacency"] == "replace_one"
    assert report["epsilon"] == pytest.approx(analytic_gaussian_epsilon(sigma, 1e-5, 2.0))
    assert report["epsilon"] <= 2.0
    # a resume trains on the checkpoint's release: nothing is released again
    ckpt = tmp_path / "step4.ckpt"
    trainer.save_checkpoint(ckpt)
    resumed, _, _ = _digits_run(tmp_path / "resumed", 8, ckpt_path=str(ckpt), target_epsilon=2.0)
    assert resumed.release.events.total == 1
    torch.testing.assert_close(resumed.embedding, model.embedding)


def test_a_fit_that_would_not_account_the_release_is_refused_before_it(tmp_path):
    with pytest.raises(ValueError, match="trains no batch"):
        _digits_run(tmp_path, 3, noise_scale=1.0, limit_train_batches=0)


def test_a_resume_with_other_kernel_settings_is_refused(tmp_path):
    _, _, trainer = _digits_run(tmp_path, 2, noise_scale=1.0)
    ckpt = tmp_path / "step2.ckpt"
    trainer.save_checkpoint(ckpt)
    with pytest.raises(ValueError, match="resumes with settings .*length_scale"):
        _digits_run(tmp_path / "b", 4, ckpt_path=str(ckpt), noise_scale=1.0, length_scale=3.0)


def test_no_sum_before_the_noise_is_saved(tmp_path):
    model, dm, _ = _digits_run(tmp_path, 2, noise_scale=1.0, noise_seed=None)
    records = dm.train_records.reshape(dm.num_private, -1).double()
    phi = fourier_features(records, random_frequencies(200, records.shape[1], 6.0, 0))
    noiseless = block_sum(phi, dm.train_labels, 10)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    for candidate in (noiseless, noiseless / dm.num_private):
        assert_holds_no_record([buffer.getvalue()], candidate.float(), "noiseless sums")
        assert_holds_no_record([buffer.getvalue()], candidate, "noiseless sums")
    # what is kept is the noisy mean, σ/n away from the noiseless one per coordinate
    gap = (model.embedding.double() - noiseless / dm.num_private).std()
    assert gap == pytest.approx(1.0 / dm.num_private, rel=0.05)


def test_a_short_private_run_learns_the_digits(tmp_path):
    torch.manual_seed(0)
    model, dm, _ = _digits_run(tmp_path, 300, num_frequencies=1000, target_epsilon=10.0)
    x, y = model.sample_labeled(2000, generator=torch.Generator().manual_seed(0))
    accuracy = downstream_utility(
        x, y, dm.test_records, dm.test_labels, classifiers=["logreg"], settings=QUICK
    )["logreg"]
    assert accuracy > 0.5  # chance: 0.1


def test_exactly_one_of_noise_scale_and_target_is_required():
    generator = ConditionalDCGANGenerator(10, image_size=8, hidden_channels=(8, 8, 8))
    for kwargs in ({}, {"noise_scale": 1.0, "target_epsilon": 1.0}):
        with pytest.raises(ValueError, match="exactly one of noise_scale"):
            DPMERF(generator, **kwargs)
    with pytest.raises(ValueError, match="length_scale"):
        DPMERF(generator, noise_scale=1.0, length_scale=-1.0)
    assert math.isclose(SENSITIVITY, 2.0)


@pytest.mark.parametrize("epsilon", [1, 10])
def test_the_fashion_configs_train_two_steps_at_their_epsilon(epsilon, tmp_path, digit_idx_dir):
    config = REPO / "configs" / "dp_merf" / f"fashion_mnist_eps{epsilon}.yaml"
    out = tmp_path / "run"
    prefix = "--data.init_args.source.init_args"
    main(
        [
            "fit", "--config", str(config), "--trainer.max_steps=2", "--trainer.logger=false",
            "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={out}",
            "--model.init_args.num_frequencies=50", "--model.init_args.generated_batch_size=8",
            "--model.init_args.generator.init_args.hidden=16",
            "--model.init_args.generator.init_args.conv_channels=[4, 4]",
            f"{prefix}.idx_dir={digit_idx_dir}", f"{prefix}.limit=64", f"{prefix}.split=test-only",
        ]
    )  # fmt: skip
    privacy = json.loads((out / "report.json").read_text())["privacy"]
    assert privacy["epsilon"] == pytest.approx(epsilon, rel=1e-6)
    assert privacy["epsilon"] <= epsilon and privacy["releases"] == 1
