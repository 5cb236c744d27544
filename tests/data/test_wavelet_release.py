"""``denoise=WaveletDenoising()`` (the baseline of Reshetova et al. 2024, Fig. 3) is
post-processing of the cached release: the release and its cache file are unchanged, no noise is
redrawn, training reads the denoised copy, and the report says so."""

import hashlib

import pytest
import torch

from lightning_dpot.data import Digits, PrivatizedDataModule, WaveletDenoising, wavelet_denoise


def _dm(tmp_path, **kw):
    args = dict(
        source=Digits(),
        mechanism="gaussian",
        noise_scale=0.8,
        delta=1e-4,
        batch_size=50,
        cache_dir=str(tmp_path / "cache"),
    )
    args.update(kw)
    return PrivatizedDataModule(**args)


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_denoising_leaves_the_cached_release_unchanged_and_redraws_nothing(tmp_path):
    # seed=None: a secret seed, so equal releases can only come from the one cached draw.
    plain = _dm(tmp_path)
    plain.setup("fit")
    (cache_file,) = (tmp_path / "cache").glob("release-*.pt")
    digest = _sha(cache_file)

    denoised = _dm(tmp_path, denoise=WaveletDenoising())
    denoised.setup("fit")
    assert denoised.cache_path() == plain.cache_path()
    assert torch.equal(denoised.release, plain.release)
    assert list((tmp_path / "cache").glob("release-*.pt")) == [cache_file]
    assert _sha(cache_file) == digest
    assert not torch.equal(denoised.denoised_release, denoised.release)

    again = _dm(tmp_path)
    again.setup("fit")
    assert torch.equal(again.release, plain.release)


def test_training_reads_the_wavelet_denoised_images(tmp_path):
    dm = _dm(tmp_path, denoise=WaveletDenoising("haar"), batch_size=None)
    dm.setup("fit")
    images = dm.release.reshape(-1, 1, 8, 8)
    expected = wavelet_denoise(images, 0.8, "haar", clip=(-1.0, 1.0)).reshape(len(images), -1)
    assert torch.allclose(dm.denoised_release, expected)
    (batch,) = next(iter(dm.train_dataloader()))
    assert batch.abs().max() <= 1.0  # clipped to the declared bounds; the release is not
    assert dm.release.abs().max() > 1.0
    assert sorted(batch.sum(1).tolist()) == pytest.approx(sorted(expected.sum(1).tolist()))


def test_privacy_report_records_denoising_as_free_post_processing(tmp_path):
    dm = _dm(tmp_path, denoise=WaveletDenoising())
    dm.setup("fit")
    report = dm.privacy_report()
    assert report["epsilon"] == dm.mechanism.epsilon
    assert report["post_processing"]["denoise"] == "wavelet"
    assert report["post_processing"]["wavelet"] == "db4"
    assert "none" in report["post_processing"]["privacy_cost"]
    assert "post_processing" not in _dm(tmp_path).privacy_report()


def test_denoising_a_release_file_is_post_processing_too(tmp_path):
    path = _dm(tmp_path).write_release(tmp_path / "release.pt")
    digest = _sha(path)
    dm = PrivatizedDataModule(release_path=str(path), denoise=WaveletDenoising(), batch_size=10)
    dm.setup("fit")
    assert dm.denoised_release is not None and dm.denoised_release.shape == dm.release.shape
    assert _sha(path) == digest


def test_denoise_refuses_non_image_domains_and_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="transform='identity'.*got transform='dct'"):
        _dm(tmp_path, denoise=WaveletDenoising(), transform="dct")
    with pytest.raises(ValueError, match="denoise takes a WaveletDenoising .*got 'wavelet'"):
        _dm(tmp_path, denoise="wavelet")
    with pytest.raises(ValueError, match="denoise.wavelet .*got 'nope'"):
        WaveletDenoising("nope")


def test_denoise_on_points_is_refused_at_construction_before_any_release(tmp_path):
    from lightning_dpot.data import HalfCircle

    with pytest.raises(ValueError, match=r"needs image records .*got sample_shape=\(2,\)"):
        PrivatizedDataModule(
            HalfCircle(n=50), epsilon=1.0, mechanism="laplace", denoise=WaveletDenoising(),
            cache_dir=str(tmp_path / "cache"),
        )  # fmt: skip
    assert not (tmp_path / "cache").exists()
