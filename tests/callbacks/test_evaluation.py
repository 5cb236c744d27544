"""Evaluation callbacks in a real (tiny) training run: classifier FD, W₂ and their report.json
sections; utility refused for an unconditional method before the first step; the offline
Inception error path."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import lightning as L
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from threadpoolctl import threadpool_limits

from lightning_dpot.callbacks import (
    FIDEvaluation,
    RunReport,
    UtilityEvaluation,
    W2Evaluation,
)
from lightning_dpot.data import Digits, PrivatizedDataModule
from lightning_dpot.generative import draw
from lightning_dpot.methods import EntropicWGAN
from lightning_dpot.metrics.evaluators import rank_share
from lightning_dpot.metrics.fid import INCEPTION_WEIGHTS_FILENAME, ClassifierFrechetDistance
from lightning_dpot.nn import ConditionalDCGANGenerator, DCGANGenerator


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(limits=1):
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def evaluated_run(tmp_path_factory):
    """Two epochs of EntropicWGAN on privatized 8×8 digits with the FD and W₂ callbacks (every
    epoch and at the end); returns (trainer, callbacks, run dir)."""
    root = tmp_path_factory.mktemp("eval_run")
    fid = FIDEvaluation(
        feature_extractor="classifier",
        num_samples=300,
        every_n_epochs=1,
        classifier_path=str(root / "feature_classifier.pt"),
        classifier_epochs=1,
    )
    w2 = W2Evaluation(num_samples=100, subsample=50, repeats=3, every_n_epochs=1)
    model = EntropicWGAN(
        DCGANGenerator(latent_dim=4, image_size=8, hidden_channels=4), latent_range=(0.0, 1.0)
    )
    data = PrivatizedDataModule(
        source=Digits(),
        mechanism="gaussian",
        noise_scale=0.5,
        delta=1e-4,
        batch_size=64,
        seed=0,
        cache_dir=str(root / "cache"),
    )
    trainer = L.Trainer(
        max_epochs=2,
        limit_train_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        callbacks=[fid, w2, RunReport()],
    )
    torch.manual_seed(0)
    trainer.fit(model, datamodule=data)
    return trainer, (fid, w2), root


def test_classifier_fd_is_logged_every_epoch_and_reported_never_as_fid(evaluated_run) -> None:
    trainer, (fid, _), root = evaluated_run
    report = json.loads((root / "report.json").read_text())
    assert "fid" not in report and "fid" not in trainer.callback_metrics
    section = report["fd_classifier"]
    assert section["metric"] == "fd_classifier" and "not FID" in section["feature_extractor"]
    assert [h["epoch"] for h in section["history"]] == [0, 1]  # end of fit: same step, not redone
    assert section["final"]["fd_classifier"] > 0 and section["num_real"] == 359
    assert "fd_classifier" in trainer.progress_bar_metrics
    assert float(trainer.callback_metrics["fd_classifier"]) == pytest.approx(
        section["final"]["fd_classifier"]
    )
    assert (root / "feature_classifier.pt").is_file()  # trained on demand, cached


def test_w2_section_has_mean_and_standard_error(evaluated_run) -> None:
    trainer, _, root = evaluated_run
    section = json.loads((root / "report.json").read_text())["w2"]
    final = section["final"]
    assert final["w2"] > 0 and math.isfinite(final["w2_stderr"]) and final["w2_stderr"] >= 0
    assert section["subsample"] == 50 and section["repeats"] == 3 and len(section["history"]) == 2
    assert float(trainer.callback_metrics["w2"]) == pytest.approx(final["w2"])


def test_utility_refuses_an_unconditional_method_before_the_first_step(tmp_path) -> None:
    model = EntropicWGAN(
        DCGANGenerator(latent_dim=4, image_size=8, hidden_channels=4), latent_range=(0.0, 1.0)
    )
    data = PrivatizedDataModule(
        Digits(), noise_scale=0.5, delta=1e-4, batch_size=64, cache_dir=str(tmp_path / "cache")
    )
    trainer = L.Trainer(
        max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=str(tmp_path),
        callbacks=[UtilityEvaluation(num_samples=300, classifiers=("logreg",))],
    )  # fmt: skip
    with pytest.raises(ValueError, match="labelled samples of a class-conditional method; "):
        trainer.fit(model, datamodule=data)
    assert trainer.global_step == 0


def test_inception_fid_without_weights_fails_at_construction_naming_the_parameter(
    tmp_path, monkeypatch
) -> None:
    missing = tmp_path / "nowhere" / INCEPTION_WEIGHTS_FILENAME
    with pytest.raises(FileNotFoundError) as err:
        FIDEvaluation(feature_extractor="inception", feature_extractor_weights_path=str(missing))
    assert "feature_extractor_weights_path" in str(err.value) and str(missing) in str(err.value)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty_torch_home"))
    with pytest.raises(FileNotFoundError) as err:
        FIDEvaluation(feature_extractor="inception")
    assert "feature_extractor_weights_path" in str(err.value)
    assert INCEPTION_WEIGHTS_FILENAME in str(err.value)


def test_rank_shares_add_up_to_the_requested_number_of_samples() -> None:
    for total, world in ((60_000, 3), (7, 4), (1, 2)):
        shares = [rank_share(total, r, world) for r in range(world)]
        assert sum(shares) == total and max(shares) - min(shares) <= 1


def test_invalid_settings_name_the_parameter_and_range() -> None:
    with pytest.raises(ValueError, match="feature_extractor must be 'inception' or 'classifier'"):
        FIDEvaluation(feature_extractor="vgg")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"subsample must lie in \[1, num_samples\] = \[1, 10\]"):
        W2Evaluation(num_samples=10, subsample=20)
    with pytest.raises(ValueError, match="classifiers must be a non-empty subset"):
        UtilityEvaluation(classifiers=("svm",))


def _ddp_fd_worker(
    rank: int, world_size: int, store: str, model, datamodule, classifier: str, out: str
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        callback = FIDEvaluation("classifier", num_samples=301, classifier_path=classifier)
        torch.manual_seed(100 + rank)
        state = torch.get_rng_state()
        value = callback.compute_value(model, datamodule, rank, world_size, barrier=dist.barrier)
        torch.set_rng_state(state)  # regenerate exactly this rank's samples, to check the union
        fake, _ = draw(model, rank_share(301, rank, world_size))
        gathered: list = [None] * world_size
        dist.all_gather_object(gathered, fake)
        if rank == 0:
            torch.save({"value": value, "fake": torch.cat(gathered)}, out)
    finally:
        dist.destroy_process_group()


def test_fd_callback_under_two_process_cpu_ddp_equals_single_process_on_the_union(
    tmp_path,
) -> None:
    torch.manual_seed(0)
    model = EntropicWGAN(
        DCGANGenerator(latent_dim=4, image_size=8, hidden_channels=4), latent_range=(0.0, 1.0)
    )
    data = PrivatizedDataModule(
        source=Digits(), noise_scale=0.5, delta=1e-4, seed=0, cache_dir=str(tmp_path / "cache")
    )
    data.setup("fit")
    classifier, out = tmp_path / "classifier.pt", tmp_path / "ddp.pt"
    # Rank 0 trains the feature classifier (the other rank waits at the barrier), each rank
    # generates ⌊301/2⌋ or ⌈301/2⌉ images and adds its shard of the 359 held-out images.
    args = (str(tmp_path / "store"), model, data, str(classifier), str(out))
    mp.start_processes(_ddp_fd_worker, args=(2, *args), nprocs=2, join=True, start_method="fork")
    result = torch.load(out, weights_only=True)
    assert result["fake"].shape[0] == 301
    single = ClassifierFrechetDistance.from_classifier_file(classifier)
    single.update(data.test_records, real=True)
    single.update(result["fake"], real=False)
    # float32 features of different batch compositions differ in the last bits (observed
    # ~2e-5 relative); adding the whole real split on each rank would scale Σ_r by
    # 1 − 1/(2·359 − 1), a 1.4e-3 change.
    assert result["value"] == pytest.approx(float(single.compute()), rel=1e-4)


def test_utility_trains_on_the_labelled_samples_of_a_class_conditional_method() -> None:
    dp_sinkhorn = pytest.importorskip("lightning_dpot.methods.dp_sinkhorn")
    central = pytest.importorskip("lightning_dpot.data.central")
    torch.manual_seed(0)
    generator = ConditionalDCGANGenerator(
        10, latent_dim=4, embed_dim=2, image_size=8, hidden_channels=(8, 8, 8)
    )
    model = dp_sinkhorn.DPSinkhorn(generator, noise_multiplier=None, conditional=True)
    data = central.CentralDPDataModule(Digits(), expected_batch_size=50)
    x, y = draw(model, 200, labelled=True)
    assert x.shape == (200, 1, 8, 8) and y is not None and y.shape == (200,)
    assert 0 <= int(y.min()) and int(y.max()) < 10
    callback = UtilityEvaluation(num_samples=200, classifiers=("logreg",))
    result = callback.compute_value(model, data, final=False)
    assert result is not None and result["mode"] == "quick" and 0.0 <= result["logreg"] <= 1.0
