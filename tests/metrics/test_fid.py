"""Fréchet distances: the classifier-feature FD (offline, DDP) and the Inception FID wrapper."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor
from torchmetrics.image.fid import FrechetInceptionDistance

from lightning_dpot.metrics.evaluators import FrechetEvaluator
from lightning_dpot.metrics.fid import (
    INCEPTION_WEIGHTS_FILENAME,
    ClassifierFrechetDistance,
    InceptionFID,
    classifier_weights_sha256,
    frechet_distance,
    load_or_train_feature_classifier,
    to_inception_input,
)


@pytest.fixture(scope="module")
def classifier_file(tmp_path_factory: pytest.TempPathFactory, digit_tensors) -> Path:
    """Feature classifier trained on demand (3,000 generated digits, ≤ 2 epochs) and cached."""
    images, labels = digit_tensors
    path = tmp_path_factory.mktemp("fd") / "feature_classifier.pt"
    load_or_train_feature_classifier(path, images[:3000], labels[:3000], epochs=2, seed=0)
    return path


def test_the_classifier_fd_names_its_weights_and_other_weights_rescale_it(
    classifier_file: Path, digit_tensors, tmp_path: Path
) -> None:
    """The FD's scale belongs to one classifier: the evaluator reports the weights' digest (the
    same for a copy of the file, another for a classifier trained with another seed), and the
    same samples score differently on the other weights."""
    images, labels = digit_tensors
    copy = tmp_path / "copy.pt"
    copy.write_bytes(classifier_file.read_bytes())
    other = tmp_path / "seed1.pt"
    load_or_train_feature_classifier(other, images[:3000], labels[:3000], epochs=2, seed=1)
    real, fake = images[3000:3500], images[4000:4500].flip(-1)
    described = {}
    for path in (classifier_file, copy, other):
        evaluator = FrechetEvaluator("classifier", classifier_path=str(path))
        evaluator.set_reference(real, labels[3000:3500])
        described[path] = {**evaluator.score(fake), **evaluator.describe()}
    first, same, seed1 = (described[p] for p in (classifier_file, copy, other))
    assert first["features_sha256"] == classifier_weights_sha256(classifier_file)
    assert same["features_sha256"] == first["features_sha256"]
    assert same["fd_classifier"] == pytest.approx(first["fd_classifier"], rel=1e-6)
    assert seed1["features_sha256"] != first["features_sha256"]
    assert seed1["fd_classifier"] != pytest.approx(first["fd_classifier"], rel=1e-3)


def _fd(path: Path, real: Tensor, fake: Tensor) -> float:
    metric = ClassifierFrechetDistance.from_classifier_file(path)
    metric.update(real, real=True)
    metric.update(fake, real=False)
    return float(metric.compute())


def test_frechet_distance_of_known_gaussians() -> None:
    # N(0, diag(1, 1)) vs N((1, 0), diag(4, 1)): 1 + (1 + 4 − 2·2) + (1 + 1 − 2·1) = 2.
    d2 = frechet_distance(
        torch.zeros(2), torch.eye(2), torch.tensor([1.0, 0.0]), torch.diag(torch.tensor([4.0, 1.0]))
    )
    assert float(d2) == pytest.approx(2.0, abs=1e-12)


def test_classifier_fd_of_a_set_with_itself_is_zero_and_grows_with_noise(
    classifier_file: Path, digit_tensors
) -> None:
    images = digit_tensors[0]
    real, other_real = images[2000:2500], images[3000:3500]
    noise = torch.randn(real.shape, generator=torch.Generator().manual_seed(0))
    metric = ClassifierFrechetDistance.from_classifier_file(classifier_file)
    metric.update(real, real=True)  # real statistics once, reused after each reset()

    def fd_to(fake: Tensor) -> float:
        metric.reset()
        metric.update(fake, real=False)
        return float(metric.compute())

    assert fd_to(real) == pytest.approx(0.0, abs=1e-6)
    noisy = [fd_to((real + s * noise).clamp(-1, 1)) for s in (0.1, 0.3, 1.0)]
    assert 0 < noisy[0] < noisy[1] < noisy[2]
    assert fd_to(other_real) < noisy[2]


def test_classifier_fd_is_torchmetrics_fid_on_the_classifier_features(
    classifier_file: Path, digit_tensors
) -> None:
    """torchmetrics' FrechetInceptionDistance with ``feature=`` the classifier's features: its
    value is the Fréchet distance between Gaussian fits of those features, fitted here by hand."""
    images = digit_tensors[0]
    real, fake = images[:300], (images[300:500] + 0.2).clamp(-1, 1)
    metric = ClassifierFrechetDistance.from_classifier_file(classifier_file)
    assert isinstance(metric, FrechetInceptionDistance)
    metric.update(real[:1], real=True)
    metric.update(fake, real=False)
    with pytest.raises(
        RuntimeError, match="at least 2 real and 2 generated samples, got 1 and 200"
    ):
        metric.compute()
    metric.update(real[1:], real=True)
    with torch.no_grad():
        real_features, fake_features = (metric.feature_extractor(x).double() for x in (real, fake))
    expected = frechet_distance(
        real_features.mean(0),
        torch.cov(real_features.T),
        fake_features.mean(0),
        torch.cov(fake_features.T),
    )
    value = metric.compute()
    assert value.dtype == torch.float32
    assert float(value) == pytest.approx(float(expected), rel=1e-5)


def test_classifier_fd_keeps_real_statistics_across_reset(
    classifier_file: Path, digit_tensors
) -> None:
    images = digit_tensors[0]
    metric = ClassifierFrechetDistance.from_classifier_file(classifier_file)
    metric.update(images[:500], real=True)
    metric.update(images[500:800], real=False)
    first = float(metric.compute())
    metric.reset()
    assert int(metric.real_features_num_samples) == 500
    assert int(metric.fake_features_num_samples) == 0
    metric.update(images[500:800], real=False)
    assert float(metric.compute()) == pytest.approx(first, rel=1e-6)

    resetting = ClassifierFrechetDistance.from_classifier_file(
        classifier_file, reset_real_features=True
    )
    resetting.update(images[:10], real=True)
    resetting.reset()
    assert int(resetting.real_features_num_samples) == 0


def test_classifier_fd_feature_net_stays_in_eval_mode(classifier_file: Path) -> None:
    metric = ClassifierFrechetDistance.from_classifier_file(classifier_file)
    metric.train()
    assert not metric.feature_extractor.training
    assert not any(p.requires_grad for p in metric.feature_extractor.parameters())


def test_feature_classifier_is_cached_and_reloaded(
    classifier_file: Path, digit_tensors, tmp_path: Path
) -> None:
    images, labels = digit_tensors
    first = load_or_train_feature_classifier(classifier_file)
    second = load_or_train_feature_classifier(classifier_file)
    batch = images[5000:5100]
    assert torch.equal(first.features(batch), second.features(batch))
    with torch.no_grad():
        accuracy = (first(images[5000:6000]).argmax(1) == labels[5000:6000]).float().mean()
    assert accuracy > 0.7  # a trained classifier (chance is 0.1), not random features
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        load_or_train_feature_classifier(tmp_path / "missing.pt")


def _ddp_worker(
    rank: int, world_size: int, store: str, classifier: str, data: str, out: str
) -> None:
    torch.set_num_threads(1)  # two ranks share the CPU
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        real, fake = torch.load(data)
        metric = ClassifierFrechetDistance.from_classifier_file(classifier)
        # Uneven shards on purpose: rank 0 sees more real and fewer fake images.
        real_shard = real[:250] if rank == 0 else real[250:]
        fake_shard = fake[:100] if rank == 0 else fake[100:]
        metric.update(real_shard, real=True)
        metric.update(fake_shard, real=False)
        value = metric.compute()
        if rank == 0:
            torch.save(value, out)
    finally:
        dist.destroy_process_group()


def test_classifier_fd_under_two_process_cpu_ddp_equals_single_process(
    classifier_file: Path, digit_tensors, tmp_path: Path
) -> None:
    images = digit_tensors[0]
    real = images[6000:6400]
    noise = torch.randn(real.shape, generator=torch.Generator().manual_seed(1))
    fake = (images[7000:7300] + 0.3 * noise[:300]).clamp(-1, 1)
    data, out = tmp_path / "data.pt", tmp_path / "out.pt"
    torch.save((real, fake), data)
    args = (str(tmp_path / "store"), str(classifier_file), str(data), str(out))
    # fork (as Lightning's "ddp_fork"): the ranks start without re-importing torch/torchmetrics.
    mp.start_processes(_ddp_worker, args=(2, *args), nprocs=2, join=True, start_method="fork")
    assert float(torch.load(out)) == pytest.approx(_fd(classifier_file, real, fake), rel=1e-5)


# ------------------------------------------------------------------ Inception FID (torchmetrics)


def test_inception_fid_offline_without_weights_names_the_parameter_and_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))  # an empty hub cache
    with pytest.raises(FileNotFoundError) as missing:
        InceptionFID()
    assert "feature_extractor_weights_path" in str(missing.value)
    assert INCEPTION_WEIGHTS_FILENAME in str(missing.value)
    assert str(tmp_path / "torch_home") in str(missing.value)  # where the cache was searched
    with pytest.raises(FileNotFoundError) as wrong_path:
        InceptionFID(feature_extractor_weights_path=tmp_path / "nope.pth")
    assert "feature_extractor_weights_path" in str(wrong_path.value)
    assert "nope.pth" in str(wrong_path.value)
    assert INCEPTION_WEIGHTS_FILENAME in str(wrong_path.value)


def test_to_inception_input_repeats_gray_to_rgb_and_maps_minus_one_one_to_unit_interval() -> None:
    images = torch.tensor([-1.0, 0.0, 1.0, 3.0]).reshape(1, 1, 2, 2)
    mapped = to_inception_input(images)
    assert mapped.shape == (1, 3, 2, 2)
    assert torch.equal(mapped[0, 2].flatten(), torch.tensor([0.0, 0.5, 1.0, 1.0]))


@pytest.fixture(scope="module")
def random_inception_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file in the torch-fidelity InceptionV3 format with random weights (no download)."""
    fidelity = pytest.importorskip("torch_fidelity.feature_extractor_inceptionv3")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fidelity, "load_state_dict_from_url", lambda *a, **k: {})
        patch.setattr(fidelity.FeatureExtractorInceptionV3, "load_state_dict", lambda *a, **k: None)
        net = fidelity.FeatureExtractorInceptionV3("inception-v3-compat", ["64"])
    path = tmp_path_factory.mktemp("inception") / INCEPTION_WEIGHTS_FILENAME
    torch.save(net.state_dict(), path)
    return path


def test_inception_fid_loads_weights_from_a_local_path_or_the_hub_cache(
    random_inception_weights: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    g = torch.Generator().manual_seed(0)
    real = torch.rand(4, 1, 28, 28, generator=g) * 2 - 1  # grayscale in [−1, 1]
    fid = InceptionFID(feature_extractor_weights_path=random_inception_weights, feature=64)
    assert fid.reset_real_features is False and fid.normalize is True
    fid.update(real, real=True)
    fid.update(real, real=False)
    assert float(fid.compute()) == pytest.approx(0.0, abs=1e-2)

    cache = tmp_path / "torch_home" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    os.symlink(random_inception_weights, cache / INCEPTION_WEIGHTS_FILENAME)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    InceptionFID(feature=64)  # found in the cache, no path and no download
