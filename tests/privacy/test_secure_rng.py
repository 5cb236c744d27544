"""``secure_rng``: noise from the OS CSPRNG has the right distributions and reaches every
mechanism that draws noise (LDP release, DP-Sinkhorn sanitizer, ``dpot privatize``).

The CSPRNG cannot be seeded, so these checks are random: every threshold is set so that a correct
sampler fails with probability below about 1e-6 (KS / chi-square p-values > 1e-6, moments within
about 5 standard errors), while a wrong law (scale off by a few percent at n = 200,000) fails."""

from __future__ import annotations

import json

import lightning as L
import numpy as np
import pytest
import torch
import yaml
from scipy import stats

from lightning_dpot.cli import main
from lightning_dpot.data import (
    GaussianMixture2D,
    HalfCircle,
    PrivateLatentDataModule,
    PrivatizedDataModule,
)
from lightning_dpot.methods import DPSWFlow
from lightning_dpot.privacy.mechanisms.additive import make_mechanism
from lightning_dpot.privacy.mechanisms.gradient_sanitizer import GradientSanitizer
from lightning_dpot.rng import (
    OSRandom,
    SecretNoise,
    permutation,
    standard_normal,
    uniform,
)

N = 200_000


def test_uniforms_are_in_the_open_interval_and_uniform():
    u = uniform((N,), OSRandom())
    assert u.dtype == torch.float64 and float(u.min()) > 0.0 and float(u.max()) < 1.0
    assert stats.kstest(u.numpy(), "uniform").pvalue > 1e-6
    assert len(np.unique(u.numpy())) > N - 10  # 53 random bits: essentially no repeats


def test_normals_are_standard_normal():
    z = standard_normal((N,), OSRandom())
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-6
    assert abs(float(z.mean())) < 5 / N**0.5 and abs(float(z.std()) - 1) < 0.01
    odd = standard_normal((3, 5), OSRandom())  # odd count: Box–Muller pairs trimmed
    assert odd.shape == (3, 5)


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_mechanism_noise_from_the_csprng_has_the_calibrated_law(mechanism):
    mech = make_mechanism(mechanism, 2.0, 1.0, 1e-5 if mechanism == "gaussian" else None)
    noise = mech.sample_noise((N,), OSRandom()).double().numpy()
    law = (
        stats.laplace(scale=mech.noise_scale)
        if mechanism == "laplace"
        else stats.norm(scale=mech.noise_scale)
    )
    assert stats.kstest(noise, law.cdf).pvalue > 1e-6


def test_permutation_is_a_fresh_uniform_permutation():
    a, b = permutation(1000, OSRandom()), permutation(1000, OSRandom())
    assert sorted(a.tolist()) == list(range(1000)) and not torch.equal(a, b)
    # position of element 0 over many draws is uniform on 10 cells
    cells = [int(permutation(10, OSRandom()).tolist().index(0)) for _ in range(2000)]
    assert stats.chisquare(np.bincount(cells, minlength=10)).pvalue > 1e-6


def _module(tmp_path, **kwargs) -> PrivatizedDataModule:
    return PrivatizedDataModule(
        HalfCircle(n=300, n_test=10), "gaussian", epsilon=5.0, delta=1e-4,
        cache_dir=str(tmp_path), **kwargs,
    )  # fmt: skip


def test_secure_release_is_fresh_recorded_and_excludes_a_seed(tmp_path):
    first, second = (
        _module(tmp_path / "a", secure_rng=True),
        _module(tmp_path / "b", secure_rng=True),
    )
    for dm in (first, second):
        dm.prepare_data()
        dm.setup("fit")
    assert not torch.equal(first.release, second.release)
    assert first.metadata["secure_rng"] is True and first.metadata["seed_is_public"] is False
    # noise std σ plus the half-circle's own spread (coordinates in [-1, 1], variance <= 1)
    sigma = first.mechanism.noise_scale
    assert sigma * 0.9 < float(first.release.std()) < (sigma**2 + 1) ** 0.5 * 1.1
    with pytest.raises(ValueError, match=r"secure_rng=True .* no seed: got seed=3"):
        _module(tmp_path, secure_rng=True, seed=3)


def test_sanitizer_secure_noise_has_the_declared_std_and_excludes_a_seed():
    sanitizer = GradientSanitizer(
        clip_norm=0.5, noise_multiplier=1.5, secure_rng=True, sample_rate=1.0
    )
    grad = torch.zeros(400, 50)
    released = sanitizer(grad, num_cross=400)
    assert float(released.std()) == pytest.approx(sanitizer.noise_std, rel=0.03)
    with pytest.raises(ValueError, match=r"no seed: got noise_seed=1"):
        GradientSanitizer(0.5, 1.5, noise_seed=1, secure_rng=True, sample_rate=1.0)


def test_dpsw_release_with_secure_rng(tmp_path):
    dm = PrivateLatentDataModule(GaussianMixture2D(n=200, n_test=20), normalize="ball")
    model = DPSWFlow(num_particles=16, num_directions=8, directions_per_step=4, noise_scale=1.0,
                     secure_rng=True)  # fmt: skip
    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(model, dm)
    assert model.mechanism_calls == 1 and model.release.facts()["secure_rng"] is True
    assert isinstance(model.release.noise.source(0), OSRandom)  # the source the release used
    with pytest.raises(ValueError, match=r"no seed: got noise_seed=2"):
        DPSWFlow(noise_scale=1.0, noise_seed=2, secure_rng=True)


def test_dpot_privatize_with_secure_rng_from_a_config(tmp_path, capsys):
    config = {
        "data": {
            "class_path": "lightning_dpot.data.PrivatizedDataModule",
            "init_args": {
                "source": {
                    "class_path": "lightning_dpot.data.HalfCircle",
                    "init_args": {"n": 200, "n_test": 10},
                },
                "mechanism": "laplace",
                "epsilon": 3.0,
                "secure_rng": True,
                "cache_dir": str(tmp_path / "cache"),
            },
        }
    }
    path = tmp_path / "privatize.yaml"
    path.write_text(yaml.safe_dump(config))
    main(["privatize", "--config", str(path), "--output", str(tmp_path / "release.pt")])
    out = json.loads(capsys.readouterr().out)
    assert out["privacy"]["secure_rng"] is True


def test_a_pickled_secret_noise_carries_neither_its_seed_nor_its_state():
    import pickle

    noise = SecretNoise()
    generator = noise.source()
    seed, state = generator.initial_seed(), generator.get_state()
    blob = pickle.dumps(noise)
    assert seed.to_bytes(8, "little") not in blob
    assert bytes(state.numpy()[:64]) not in blob
    restored = pickle.loads(blob)
    assert restored.source().initial_seed() != seed
