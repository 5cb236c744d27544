"""PrivatizedDataModule: privatize once, reuse the cache, never redraw, refuse bad data."""

import math
import subprocess
import sys
import textwrap

import lightning as L
import pytest
import torch

from lightning_dpot.data import (
    Digits,
    Ellipse,
    GaussianMixture2D,
    HalfCircle,
    PrivatizedDataModule,
    Rectangle,
    TensorFile,
)
from lightning_dpot.data.release import Release, keyed_digest, tensor_sha256
from lightning_dpot.methods import EntropicWGAN
from lightning_dpot.nn import MLPGenerator
from lightning_dpot.rng import seeded_generator


def _dm(tmp_path, **kw):
    args = dict(
        source=HalfCircle(n=500, n_test=100),
        mechanism="gaussian",
        epsilon=5.0,
        delta=1e-4,
        batch_size=100,
        cache_dir=str(tmp_path / "cache"),
    )
    args.update(kw)
    return PrivatizedDataModule(**args)


def test_second_setup_loads_the_cache_and_never_redraws(tmp_path):
    # seed=None: a secret seed, so identical data can only come from the cache.
    first = _dm(tmp_path)
    first.setup("fit")
    second = _dm(tmp_path)
    second.setup("fit")
    assert torch.equal(first.release, second.release)
    assert len(list((tmp_path / "cache").glob("release-*.pt"))) == 1


def test_a_second_process_sees_bit_identical_data(tmp_path):
    dm = _dm(tmp_path)
    dm.setup("fit")
    script = textwrap.dedent(
        f"""
        import torch
        from lightning_dpot.data import HalfCircle, PrivatizedDataModule
        dm = PrivatizedDataModule(HalfCircle(n=500, n_test=100), "gaussian", epsilon=5.0,
                                  delta=1e-4, batch_size=100, cache_dir={str(tmp_path / "cache")!r})
        dm.setup("fit")
        torch.save(dm.release, {str(tmp_path / "other.pt")!r})
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True)
    assert torch.equal(torch.load(tmp_path / "other.pt"), dm.release)


def test_resumed_fit_sees_the_same_release(tmp_path):
    dm = _dm(tmp_path)
    model = EntropicWGAN(MLPGenerator(2, (2,), (16,)))
    trainer = L.Trainer(
        max_epochs=1,
        logger=False,
        default_root_dir=tmp_path,
        barebones=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, dm)
    ckpt = tmp_path / "last.ckpt"
    trainer.save_checkpoint(ckpt)
    dm2 = _dm(tmp_path)
    trainer2 = L.Trainer(
        max_epochs=2,
        logger=False,
        default_root_dir=tmp_path,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer2.fit(EntropicWGAN(MLPGenerator(2, (2,), (16,))), dm2, ckpt_path=ckpt)
    assert trainer2.global_step == 2 * trainer.global_step
    assert torch.equal(dm.release, dm2.release)


def test_raw_training_records_are_not_retained(tmp_path):
    source = HalfCircle(n=500, n_test=100, data_seed=3)
    raw = source.load().train
    dm = _dm(tmp_path, source=source, seed=1)
    dm.setup("fit")
    for value in vars(dm).values():
        if isinstance(value, torch.Tensor) and value.shape == raw.shape:
            assert not torch.equal(value, raw)
    # keyed digest of the raw records, not a plain hash (which would leak): key in the cache dir
    assert dm.metadata["raw_hmac_sha256"] == keyed_digest(raw, dm.cache_dir)
    assert dm.metadata["raw_hmac_sha256"] != tensor_sha256(raw)
    assert (dm.cache_dir / "digest.key").stat().st_mode & 0o077 == 0
    assert dm.metadata["labels_released"] is False


def test_release_is_raw_plus_one_draw_of_noise_in_a_shuffled_order(tmp_path):
    # Known answer: with a public seed the release is (raw + Z)[perm], Z and perm drawn once
    # in that order from the generator of that seed (SecretNoise: seeded_generator(seed)).
    source = HalfCircle(n=20_000, n_test=10)
    dm = _dm(tmp_path, source=source, seed=7)
    dm.setup("fit")
    gen = seeded_generator(7)
    raw = source.load().train
    noise = dm.mechanism.sample_noise(tuple(raw.shape), gen)
    perm = torch.randperm(len(raw), generator=gen)
    assert torch.equal(dm.release, (raw + noise)[perm])
    assert noise.std().item() == pytest.approx(dm.mechanism.noise_scale, rel=0.02)


def test_changed_raw_data_under_the_same_config_is_refused(tmp_path):
    path = tmp_path / "data.pt"
    torch.save(torch.rand(50, 3) * 2 - 1, path)
    dm = _dm(tmp_path, source=TensorFile(str(path), -1.0, 1.0))
    dm.setup("fit")
    torch.save(torch.rand(50, 3) * 2 - 1, path)
    with pytest.raises(ValueError, match="different raw data"):
        _dm(tmp_path, source=TensorFile(str(path), -1.0, 1.0)).setup("fit")


def test_release_file_round_trip_trains_without_raw_data(tmp_path):
    dm = _dm(tmp_path, mechanism="laplace", delta=None, l1_radius=0.9)
    out = dm.write_release(tmp_path / "release.pt")
    loaded = PrivatizedDataModule(release_path=str(out), batch_size=100)
    loaded.setup("fit")
    assert loaded.source is None
    assert torch.equal(loaded.release, dm.release)
    assert loaded.mechanism.noise_scale == pytest.approx(dm.mechanism.noise_scale)
    assert loaded.mechanism.sensitivity == pytest.approx(1.8)
    assert loaded.support_diameter(1) == pytest.approx(dm.support_diameter(1))
    trainer = L.Trainer(
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(EntropicWGAN(MLPGenerator(2, (2,), (16,))), loaded)
    assert trainer.global_step == 2


def test_refuses_non_finite_data(tmp_path):
    path = tmp_path / "nan.pt"
    x = torch.zeros(10, 2)
    x[3, 1] = math.nan
    torch.save(x, path)
    with pytest.raises(ValueError, match="NaN or Inf"):
        _dm(tmp_path, source=TensorFile(str(path), -1.0, 1.0)).setup("fit")


def test_refuses_data_outside_declared_bounds(tmp_path):
    path = tmp_path / "wide.pt"
    torch.save(torch.full((10, 2), 1.5), path)
    with pytest.raises(ValueError, match="outside the declared bounds"):
        _dm(tmp_path, source=TensorFile(str(path), -1.0, 1.0)).setup("fit")


def test_unbounded_data_needs_a_projection(tmp_path):
    path = tmp_path / "free.pt"
    torch.save(torch.randn(100, 4) * 10, path)
    with pytest.raises(ValueError, match="unbounded"):
        _dm(tmp_path, source=TensorFile(str(path), -math.inf, math.inf))
    dm = _dm(tmp_path, source=TensorFile(str(path), -math.inf, math.inf), l2_radius=2.0)
    dm.setup("fit")
    assert dm.mechanism.sensitivity == 4.0


def test_refuses_empty_dataset(tmp_path):
    path = tmp_path / "empty.pt"
    torch.save(torch.zeros(0, 2), path)
    with pytest.raises(ValueError, match="n >= 1"):
        _dm(tmp_path, source=TensorFile(str(path), -1.0, 1.0)).setup("fit")


def test_batch_size_larger_than_release_is_refused(tmp_path):
    dm = _dm(tmp_path, batch_size=10_000)
    dm.setup("fit")
    with pytest.raises(ValueError, match="batch_size=10000 exceeds"):
        dm.train_dataloader()


def test_an_epoch_of_minibatches_is_the_release_once_in_a_fresh_order(tmp_path):
    # 500 records in batches of 120: four full batches, the last 20 records dropped (drop_last).
    dm = _dm(tmp_path, batch_size=120)
    dm.setup("fit")
    release = {tuple(row) for row in dm.release.tolist()}
    assert len(release) == 500
    epochs = [list(dm.train_dataloader()) for _ in range(2)]
    for batches in epochs:
        assert len(batches) == 4
        assert all(len(batch) == 1 and batch[0].shape == (120, 2) for batch in batches)
        records = {tuple(row) for batch in batches for row in batch[0].tolist()}
        assert len(records) == 480 and records <= release
    assert not torch.equal(epochs[0][0][0], epochs[1][0][0])


def test_release_file_rejects_foreign_files(tmp_path):
    torch.save({"x": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(ValueError, match="not a lightning_dpot release"):
        Release.load(tmp_path / "foreign.pt")
    with pytest.raises(FileNotFoundError, match="release_path"):
        Release.load(tmp_path / "missing.pt")


@pytest.mark.parametrize(
    ("source", "d1", "d2"),
    [
        (HalfCircle(n=10), 1 + math.sqrt(2), 2.0),
        (Ellipse(n=10), 2 * math.hypot(1, 0.5), 2.0),
        (Rectangle(n=10), 3.0, math.sqrt(5)),
        (GaussianMixture2D(n=10), 2 * math.sqrt(2), 2.0),
    ],
)
def test_manifold_diameters_bound_sampled_pairs(source, d1, d2):
    assert source.diameter(1) == pytest.approx(d1)
    assert source.diameter(2) == pytest.approx(d2)
    big = type(source)(n=4000)
    x = big.load().train.double()
    pairs = x[:2000] - x[2000:]
    assert pairs.abs().sum(1).max() <= d1 + 1e-6
    assert pairs.norm(dim=1).max() <= d2 + 1e-6


@pytest.mark.parametrize("cls", [HalfCircle, Ellipse, Rectangle])
def test_samples_lie_on_their_curve(cls):
    source = cls(n=2000, n_test=10)
    assert source.distance_to_support(source.load().train).max() < 1e-3


def test_half_circle_distance_is_exact():
    source = HalfCircle(n=10)
    pts = torch.tensor([[0.0, 2.0], [0.0, 0.0], [2.0, -1.0]])
    expected = torch.tensor([1.0, 1.0, math.sqrt(2.0)])
    assert torch.allclose(source.distance_to_support(pts), expected)
    assert torch.allclose(CurveDistance(source)(pts), expected, atol=1e-3)


class CurveDistance:
    """The generic polyline distance of the base class, for comparison."""

    def __init__(self, source):
        self.source = source

    def __call__(self, pts):
        from lightning_dpot.data.manifolds import distance_to_polyline

        return distance_to_polyline(pts.double(), self.source.polyline()).float()


def test_digits_are_scaled_to_declared_bounds():
    splits = Digits().load()
    assert splits.train.min() == -1.0 and splits.train.max() == 1.0
    assert splits.train.shape[1:] == (1, 8, 8)
    assert len(splits.train) + len(splits.test) == 1797


def test_release_is_stored_in_a_shuffled_order(tmp_path):
    source = HalfCircle(n=2000, n_test=10)
    dm = _dm(tmp_path, source=source, seed=5, epsilon=200.0)
    dm.setup("fit")
    raw = source.load().train
    # In raw order each released row would lie within E‖Z‖ = σ√(π/2) of its raw record.
    in_order = (dm.release - raw).norm(dim=1).mean().item()
    assert in_order > 5 * dm.mechanism.noise_scale * (torch.pi / 2) ** 0.5


def test_shuffled_central_guarantee_for_laplace_release(tmp_path):
    dm = _dm(
        tmp_path,
        mechanism="laplace",
        delta=None,
        shuffle_delta=1e-6,
        source=HalfCircle(n=4000, n_test=10),
    )
    dm.setup("fit")
    report = dm.privacy_report()["central_by_shuffling"]
    assert report["applies"] is True
    assert report["n"] == 4000 and report["epsilon0"] == 5.0
    assert report["epsilon_numerical"] < 5.0


def test_a_public_seed_claims_no_central_guarantee_by_shuffling(tmp_path):
    """Whoever knows the seed recomputes the permutation (and the noise): the release is not
    shuffled for them, so the amplification by shuffling does not apply."""
    dm = _dm(
        tmp_path,
        mechanism="laplace",
        delta=None,
        shuffle_delta=1e-6,
        seed=3,
        source=HalfCircle(n=4000, n_test=10),
    )
    dm.setup("fit")
    report = dm.privacy_report()["central_by_shuffling"]
    assert report["applies"] is False and "seed is public" in report["reason"]
    assert not {"epsilon_numerical", "epsilon_closed_form", "epsilon0"} & set(report)


def test_shuffling_is_refused_for_the_gaussian_mechanism(tmp_path):
    with pytest.raises(ValueError, match="shuffle_delta: amplification by shuffling"):
        _dm(tmp_path, shuffle_delta=1e-6)
