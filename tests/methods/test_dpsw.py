"""DP sliced-Wasserstein flows (Sebag et al. 2023): one release for DPSWFlow, composed releases for
DPSWFlowR that match what the accountant is told, the split check, exact resume, and every
config in configs/dpswflow runs a couple of steps on tiny data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint

import lightning_dpot.methods.dpsw as dpsw
import lightning_dpot.methods.dpsw.sliced_release as sliced_release
from lightning_dpot.callbacks.privacy_accountant import PrivacyAccountantCallback
from lightning_dpot.cli import main
from lightning_dpot.config import compose_config
from lightning_dpot.data import GaussianMixture2D, PrivateLatentDataModule
from lightning_dpot.data.split import SplitMismatchError
from lightning_dpot.methods import DPSWFlow, DPSWFlowR, DPSWGen
from lightning_dpot.methods.dpsw.release import STREAM_DIRECTIONS, STREAM_RELEASE
from lightning_dpot.methods.dpsw.sensitivity import sliced_sensitivity
from lightning_dpot.methods.dpsw.sliced_release import SlicedGaussianRelease
from lightning_dpot.privacy.accounting.analysis.epsilon import subsampled_gaussian_epsilon
from lightning_dpot.privacy.accounting.analysis.schemes import WITHOUT_REPLACEMENT
from lightning_dpot.privacy.mechanisms.gaussian import gaussian_epsilon
from lightning_dpot.rng import seeded_generator

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs" / "dpswflow"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))


def _toy(
    batch_size: int | None = None,
    n: int = 300,
    sample_rate: float | None = None,
    seed: int | None = None,
) -> PrivateLatentDataModule:
    return PrivateLatentDataModule(
        GaussianMixture2D(n=n, n_test=50),
        normalize="ball",
        batch_size=batch_size,
        sample_rate=sample_rate,
        steps_per_epoch=10,
        seed=seed,
    )


def _trainer(
    tmp_path: Path, steps: int, callbacks=(), checkpoint: bool = False, **kwargs
) -> L.Trainer:
    return L.Trainer(
        max_steps=steps,
        logger=False,
        enable_checkpointing=checkpoint,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=list(callbacks),
        accelerator="cpu",
        **kwargs,
    )


@pytest.fixture
def release_spy(monkeypatch):
    """Records (σ, Θ, number of rows) of every call of the Gaussian sliced release."""
    calls: list[tuple[float, torch.Tensor, int]] = []
    real = sliced_release.gaussian_sliced_release

    def spy(x, theta, sigma, generator=None, **kw):
        calls.append((float(sigma), theta.clone(), int(x.shape[0])))
        return real(x, theta, sigma, generator, **kw)

    monkeypatch.setattr(sliced_release, "gaussian_sliced_release", spy)
    return calls


def test_dpswflow_releases_target_exactly_once_and_epsilon_does_not_grow(tmp_path, release_spy):
    accountant = PrivacyAccountantCallback()  # what dpot fit attaches; δ from the release object
    model = DPSWFlow(num_particles=64, num_directions=20, directions_per_step=8, noise_scale=2.0)
    _trainer(tmp_path, 10, [accountant]).fit(model, _toy())
    eps_after_10 = accountant.epsilon()
    assert len(release_spy) == 1 and model.mechanism_calls == 1
    assert release_spy[0][2] == 300  # the whole private set, once
    sens = sliced_sensitivity(20, 2, model.release.delta_s, "chernoff")
    assert eps_after_10 == pytest.approx(gaussian_epsilon(2.0, 1e-5, sens))
    later = PrivacyAccountantCallback()
    model2 = DPSWFlow(num_particles=64, num_directions=20, directions_per_step=8, noise_scale=2.0)
    _trainer(tmp_path, 40, [later]).fit(model2, _toy())
    assert model2.mechanism_calls == 1 and later.epsilon() == eps_after_10
    report = later.report()
    # Θ is checked (‖Θ‖²_op ≤ w), so the sensitivity holds on every draw: δ has no δ_s term
    assert report["delta"] == 1e-5 and report["releases"] == 1
    assert report["events"] == {"GaussianRelease": 1} and report["accountant"] == "analytic"
    assert report["epsilon"] == report["epsilon_analytic"] == eps_after_10
    facts = report["module"]["releases"][0]
    assert facts["sensitivity_l2"] == pytest.approx(sens) and facts["releases"] == 1


def test_dpswflow_generates_more_samples_for_free(tmp_path, release_spy):
    model = DPSWFlow(num_particles=32, num_directions=10, directions_per_step=5, noise_scale=0.0)
    _trainer(tmp_path, 5).fit(model, _toy())
    samples = model.generate(100, num_steps=5)
    assert samples.shape == (100, 2) and len(release_spy) == 1


def test_dpswflowr_epsilon_grows_as_the_accountant_says(tmp_path, release_spy, monkeypatch):
    sigma, steps, n, b = 6.0, 12, 300, 60
    model = DPSWFlowR(num_particles=64, num_directions=16, noise_scale=sigma)
    callback = PrivacyAccountantCallback(target_epsilon=1e4, delta=1e-5, also_report=("pld",))
    dm = _toy(batch_size=b, n=n)
    drawn: list[torch.Tensor] = []
    real_draw = PrivateLatentDataModule.without_replacement_indices

    def spy_draw(self, step):
        indices = real_draw(self, step)
        drawn.append(indices.clone())
        return indices

    monkeypatch.setattr(PrivateLatentDataModule, "without_replacement_indices", spy_draw)
    _trainer(tmp_path, steps, [callback]).fit(model, dm)
    # One release per step, each with the σ, a fresh Θ and exactly b rows; what the accountant
    # composed (the emitted events) matches what the module did.
    assert model.mechanism_calls == steps == len(release_spy) == len(drawn) == callback.releases
    assert len({tuple(c[1].flatten().tolist()) for c in release_spy}) == steps
    told = model.release.event
    assert told.sampling == "without_replacement"
    assert told.dataset_size == n == dm.num_private and told.batch_size == b
    assert told.sample_rate == pytest.approx(b / n)
    assert all(c[2] == told.batch_size for c in release_spy)  # rows released == reported b
    for indices in drawn:  # without replacement, within range(n)
        assert indices.numel() == b and len(set(indices.tolist())) == b
        assert 0 <= int(indices.min()) and int(indices.max()) < n
    assert len({tuple(sorted(i.tolist())) for i in drawn}) == steps  # fresh subset every step
    # the draw is a function of (seed, step) only: identical on every rank and after resume
    torch.testing.assert_close(real_draw(dm, 3), real_draw(dm, 3), rtol=0, atol=0)
    sens = sliced_sensitivity(16, 2, model.release.delta_s, model.release.w_bound)
    assert all(c[0] == sigma for c in release_spy)
    assert told.noise_multiplier == pytest.approx(release_spy[0][0] / sens)
    expected = subsampled_gaussian_epsilon(
        sigma / sens, b / n, steps, 1e-5, sampling=WITHOUT_REPLACEMENT
    )
    assert callback.epsilon() == pytest.approx(expected, rel=1e-6)
    assert (
        subsampled_gaussian_epsilon(
            sigma / sens, b / n, steps // 2, 1e-5, sampling=WITHOUT_REPLACEMENT
        )
        < expected
    )
    privacy = callback.report()
    assert privacy["sampling"] == "without_replacement" and privacy["adjacency"] == "replace_one"
    assert privacy["batch_size"] == b and privacy["dataset_size"] == n
    assert privacy["epsilon_pld"] is None  # no PLD analysis of sampling without replacement
    assert privacy["epsilon_rdp"] == pytest.approx(expected, rel=1e-6)
    assert privacy["delta"] == 1e-5  # every Θ checked: no T·δ_s term (docs/dpswflow.md)


def test_dpswflowr_noise_added_matches_reported_multiplier(tmp_path):
    """The empirical std of the released rows' noise equals σ = multiplier·Δ."""
    sigma = 3.0
    model = DPSWFlowR(num_particles=16, num_directions=200, noise_scale=sigma)
    _trainer(tmp_path, 1).fit(model, _toy(batch_size=300))
    batch = model.batches.batch(0, torch.device("cpu"))
    theta = model.release.directions(2, seeded_generator(0, STREAM_DIRECTIONS, 0))
    g = seeded_generator(0, STREAM_RELEASE, 0, 0)
    noise = model.release(batch, theta, g) - batch @ theta.T
    sens = model.release.sensitivity(2)
    assert float(noise.std()) == pytest.approx(
        model.release.event.noise_multiplier * sens, rel=0.02
    )


@pytest.mark.parametrize("cls", ["DPSWFlow", "DPSWFlowR"])
def test_release_noise_and_subsets_are_secret_by_default(tmp_path, cls):
    """Two runs of one config (same public ``seed``) release different noise and, for DPSWFlowR,
    different subsets: neither can be regenerated from the config. Explicit seeds reproduce
    both and the report says they are public."""

    def run(noise_seed=None, data_seed=None):
        if cls == "DPSWFlow":
            model = DPSWFlow(num_particles=16, num_directions=8, directions_per_step=4,
                             noise_scale=0.5, noise_seed=noise_seed)  # fmt: skip
            dm = _toy(seed=data_seed)
        else:
            model = DPSWFlowR(num_particles=16, num_directions=8, noise_scale=0.5,
                              noise_seed=noise_seed)  # fmt: skip
            dm = _toy(batch_size=40, seed=data_seed)
        accountant = PrivacyAccountantCallback()
        _trainer(tmp_path, 3, [accountant]).fit(model, dm)
        report = {**accountant.report()["module"], **accountant.report()["module"]["releases"][0]}
        if cls == "DPSWFlow":
            return model.release_sorted.clone(), report, dm
        return model.particles.clone(), report, dm

    a, report_a, dm_a = run()
    b, _, dm_b = run()
    assert not torch.equal(a, b)
    assert report_a["noise_seed_is_public"] is False
    c, report_c, dm_c = run(noise_seed=5, data_seed=6)
    d, _, dm_d = run(noise_seed=5, data_seed=6)
    assert torch.equal(c, d)
    assert report_c["noise_seed_is_public"] is True
    if cls == "DPSWFlowR":
        assert report_a["subset_seed_is_public"] is False
        assert report_c["subset_seed_is_public"] is True
        assert not torch.equal(
            dm_a.without_replacement_indices(0), dm_b.without_replacement_indices(0)
        )
        assert torch.equal(dm_c.without_replacement_indices(0), dm_d.without_replacement_indices(0))


def test_dpswflowr_refuses_poisson_sampling(tmp_path):
    model = DPSWFlowR(num_particles=16, num_directions=8, noise_scale=1.0)
    with pytest.raises(ValueError, match="batch_size"):
        _trainer(tmp_path, 1).fit(model, _toy(sample_rate=0.2))


def test_dpswflowr_target_epsilon_calibrates_sigma_within_budget(tmp_path):
    model = DPSWFlowR(num_particles=32, num_directions=16, target_epsilon=3.0)
    callback = PrivacyAccountantCallback(target_epsilon=3.0, delta=1e-5, also_report=())
    _trainer(tmp_path, 8, [callback]).fit(model, _toy(batch_size=30))
    assert model.trainer.global_step == 8
    assert 2.5 < callback.epsilon() <= 3.0


def test_dpswflowr_refuses_more_samples_than_particles(tmp_path):
    model = DPSWFlowR(num_particles=16, num_directions=8, noise_scale=1.0)
    _trainer(tmp_path, 2).fit(model, _toy(batch_size=60))
    assert model.sample(16).shape == (16, 2)
    with pytest.raises(ValueError, match="spends privacy budget"):
        model.sample(17)


@pytest.mark.parametrize("cls", ["DPSWFlow", "DPSWFlowR"])
def test_resumed_flow_continues_from_saved_particles(tmp_path, cls, release_spy):
    # Public noise and subset seeds (research mode): with the secret defaults a resumed DPSWFlowR
    # draws fresh noise and subsets, so its particles could not be compared bit for bit.
    def make():
        if cls == "DPSWFlow":
            return DPSWFlow(num_particles=48, num_directions=12, directions_per_step=6,
                            noise_scale=0.5, diffusion=1e-3, noise_seed=3), _toy()  # fmt: skip
        return DPSWFlowR(num_particles=48, num_directions=12, noise_scale=0.5, diffusion=1e-3,
                         noise_seed=3), _toy(batch_size=90, seed=4)  # fmt: skip

    # Uninterrupted run of 14 steps that also checkpoints at step 7 (mid-epoch).
    full, dm = make()
    checkpoint = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=7, save_top_k=-1, filename="{step}"
    )
    _trainer(tmp_path / "full", 14, [checkpoint], checkpoint=True).fit(full, dm)
    calls_full = full.mechanism_calls

    resumed, dm = make()
    _trainer(tmp_path / "b", 14).fit(resumed, dm, ckpt_path=str(tmp_path / "ckpt" / "step=7.ckpt"))
    torch.testing.assert_close(resumed.particles, full.particles, rtol=0, atol=0)
    assert resumed.mechanism_calls == calls_full
    if cls == "DPSWFlow":
        assert calls_full == 1  # the cached release came back from the checkpoint, not redrawn
        torch.testing.assert_close(resumed.release_sorted, full.release_sorted, rtol=0, atol=0)
    else:
        assert calls_full == 14


def test_toy_config_runs_via_cli_and_sigma0_flow_approaches_target(tmp_path):
    out = tmp_path / "run"
    main(
        [
            "fit",
            "--config",
            str(CONFIG_DIR / "toy_5gaussians_sigma0.yaml"),
            "--trainer.max_steps=40",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_checkpointing=false",
            f"--trainer.default_root_dir={out}",
            "--model.init_args.num_particles=500",
            "--model.init_args.num_directions=50",
            "--model.init_args.directions_per_step=50",
            "--data.init_args.source.init_args.n=500",
        ]
    )
    assert not (out / "privacy_report.json").exists()  # σ = 0: nothing private to account
    particles = torch.load(out / "particles.pt")
    target = GaussianMixture2D(n=500, n_test=50).load().train
    start = torch.randn(500, 2, generator=torch.Generator().manual_seed(0)) / math.sqrt(2)
    assert dpsw.toy_sliced_wasserstein(particles, target) < 0.3 * dpsw.toy_sliced_wasserstein(
        start, target
    )


# -- the split ---------------------------------------------------------------------------------


def _shrink(config: dict, tmp_path: Path, idx_dir: str, ae_dir: Path) -> dict:
    """Tiny data (MNIST and Fashion-MNIST read from the generated digits in ``idx_dir``), two
    steps, no logger, all paths in tmp_path."""
    trainer = config["trainer"]
    trainer.pop("max_epochs", None)
    trainer.update(
        max_steps=2, logger=False, enable_progress_bar=False, default_root_dir=str(tmp_path)
    )
    if "autoencoder" in config["model"]["class_path"].lower():
        trainer.pop("callbacks", None)
    for callback in trainer.get("callbacks", []):
        if callback["class_path"].endswith("PrivacyAccountantCallback"):
            callback["init_args"]["also_report"] = []  # PLD is slow; the RDP path is the same
    data = config["data"]["init_args"]
    source = data["source"]
    cls = source["class_path"].rsplit(".", 1)[-1]
    if cls in ("MNIST", "FashionMNIST"):
        source["init_args"].update(idx_dir=idx_dir, limit=80)
    elif cls == "GaussianMixture2D":
        source["init_args"] = {"n": 200, "n_test": 20}
    if "split_file" in data:
        data["split_file"] = str(ae_dir / f"{cls}_split.json")
    if "autoencoder_checkpoint" in data:
        data["autoencoder_checkpoint"] = str(ae_dir / f"{cls}_autoencoder.ckpt")
    if "batch_size" in data:
        data["batch_size"] = 16
    if "sample_rate" in data:
        data["sample_rate"], data["steps_per_epoch"] = 0.25, 2
    model = config["model"]["init_args"]
    if "num_particles" in model:
        model["num_particles"] = 20
    if "generated_batch_size" in model:
        model["generated_batch_size"] = 8
    return config


def _train_tiny_autoencoder(config_path: Path, tmp_path: Path, idx_dir: str, ae_dir: Path):
    config = _shrink(compose_config(config_path), tmp_path, idx_dir, ae_dir)
    cls = config["data"]["init_args"]["source"]["class_path"].rsplit(".", 1)[-1]
    config["trainer"]["enable_checkpointing"] = True
    path = tmp_path / "ae.yaml"
    path.write_text(yaml.safe_dump(config))
    main(["fit", "--config", str(path)])
    ckpt = next((tmp_path / "checkpoints").glob("*.ckpt"))
    ckpt.rename(ae_dir / f"{cls}_autoencoder.ckpt")


@pytest.fixture(scope="module")
def tiny_autoencoders(tmp_path_factory, digit_idx_dir):
    ae_dir = tmp_path_factory.mktemp("ae")
    for name in ("mnist_autoencoder.yaml", "fashion_mnist_autoencoder.yaml"):
        _train_tiny_autoencoder(
            CONFIG_DIR / name, tmp_path_factory.mktemp("stage1"), str(digit_idx_dir), ae_dir
        )
    return ae_dir


def _latent_dm(ae_dir: Path, mnist_dir: str, **kw) -> PrivateLatentDataModule:
    from lightning_dpot.data import MNIST
    from lightning_dpot.nn import ConvAutoencoder32

    args = {
        "source": MNIST(
            idx_dir=mnist_dir, split="test-only", test_size=2000, image_size=32, limit=80
        ),  # fmt: skip
        "autoencoder": ConvAutoencoder32(8, 1),
        "autoencoder_checkpoint": str(ae_dir / "MNIST_autoencoder.ckpt"),
        "split_file": str(ae_dir / "MNIST_split.json"),
        **kw,
    }
    return PrivateLatentDataModule(**args)


def test_private_latents_are_on_the_unit_sphere_and_disjoint_from_public(
    tiny_autoencoders, digit_idx_dir
):
    dm = _latent_dm(tiny_autoencoders, str(digit_idx_dir))
    dm.setup("fit")
    norms = dm.private_records().norm(dim=1)
    torch.testing.assert_close(norms, torch.ones_like(norms))
    assert not set(dm.split.public) & set(dm.split.private)
    assert len(dm.split.private) == 40


@pytest.mark.parametrize(
    "change", [{"split_seed": 1}, {"public_fraction": 0.25}], ids=["seed", "fraction"]
)
def test_split_check_refuses_a_mismatched_split(tiny_autoencoders, digit_idx_dir, change):
    dm = _latent_dm(tiny_autoencoders, str(digit_idx_dir), split_file=None, **change)
    with pytest.raises(SplitMismatchError, match="differs from"):
        dm.setup("fit")


def test_split_check_refuses_different_records(tiny_autoencoders, digit_idx_dir):
    from lightning_dpot.data import MNIST

    dm = _latent_dm(tiny_autoencoders, str(digit_idx_dir), split_file=None)
    dm.source = MNIST(idx_dir=str(digit_idx_dir), split="test-only", test_size=2000,
                      image_size=32, limit=80, split_seed=3)  # fmt: skip
    with pytest.raises(SplitMismatchError, match="data_hash"):
        dm.setup("fit")


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_parses_and_runs_two_steps_on_tiny_data(
    config: Path, tmp_path, request, digit_idx_dir
):
    loaded = compose_config(config)
    assert config.read_text().startswith("# Sebag et al. 2023"), "each config cites the paper first"
    cls = loaded["data"]["init_args"]["source"]["class_path"].rsplit(".", 1)[-1]
    if cls == "CelebA":
        from lightning_dpot.training import run_lightning

        cli = run_lightning(["--config", str(config), "--trainer.logger=false"], run=False)
        assert cli.model is not None and cli.datamodule is not None
        pytest.skip("CelebA is not available here: parsed and instantiated only, not run")
    ae_dir = tmp_path / "ae"
    ae_dir.mkdir()
    if "autoencoder_checkpoint" in loaded["data"]["init_args"]:
        ae_src = request.getfixturevalue("tiny_autoencoders")
        for f in ae_src.iterdir():
            (ae_dir / f.name).write_bytes(f.read_bytes())
    shrunk = _shrink(loaded, tmp_path / "run", str(digit_idx_dir), ae_dir)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(shrunk))
    main(["fit", "--config", str(path)])
    if "autoencoder" not in loaded["model"]["class_path"].lower():
        path = tmp_path / "run" / "privacy_report.json"
        private = loaded["model"]["init_args"].get("noise_scale") != 0
        assert path.exists() == private  # every private run is accounted, configured or not
        if private:
            report = json.loads(path.read_text())
            assert report["releases"] in (1, 2) and report["epsilon"] is not None
            run_report = json.loads((tmp_path / "run" / "report.json").read_text())
            assert run_report["privacy"] == report


def test_toy_flow_sigma0_converges_and_sigma05_ends_between(tmp_path):
    """Sebag et al. 2023, §5.4 / Fig. 1: SW to the target falls far below its start with σ = 0; with
    σ = 0.5 the particles are more dispersed, ending between the two (paper: 0.08 vs 0.81)."""
    target = GaussianMixture2D(n=300, n_test=50).load().train
    distances = {}
    for sigma in (0.0, 0.5):
        model = DPSWFlow(num_particles=300, num_directions=50, directions_per_step=50,
                         noise_scale=sigma, diffusion=1e-3)  # fmt: skip
        _trainer(tmp_path, 40).fit(model, _toy(n=300))
        distances[sigma] = dpsw.toy_sliced_wasserstein(model.particles, target)
    start = dpsw.toy_sliced_wasserstein(model._init_particles(300, 2, 0), target)
    assert distances[0.0] < 0.2 * start
    assert distances[0.0] < distances[0.5] < start


# -- releases count themselves; Θ is checked -----------------------------------------------------


def test_dpswgen_accumulation_releases_every_batch_and_the_accountant_composes_each(
    tmp_path, release_spy, monkeypatch
):
    """With accumulate_grad_batches = 2 each batch releases (its own subset
    and Θ); the module's own count and the accountant both say 2 per optimizer step."""
    from lightning_dpot.nn import MLPGenerator

    drawn: list[tuple[int, ...]] = []
    real_draw = PrivateLatentDataModule.without_replacement_indices

    def spy_draw(self, step):
        indices = real_draw(self, step)
        drawn.append(tuple(sorted(indices.tolist())))
        return indices

    monkeypatch.setattr(PrivateLatentDataModule, "without_replacement_indices", spy_draw)
    generator = MLPGenerator(latent_dim=2, output_shape=[2], hidden=[16])
    model = DPSWGen(generator, num_directions=12, noise_scale=2.0, generated_batch_size=32)
    accountant = PrivacyAccountantCallback()
    trainer = _trainer(tmp_path, 3, [accountant], accumulate_grad_batches=2)
    dm = _toy(batch_size=30)
    trainer.fit(model, dm)
    assert trainer.global_step == 3
    assert model.mechanism_calls == len(release_spy) == accountant.releases == 6
    assert len(set(drawn)) == 6  # a fresh subset per release, never one subset re-released
    multiplier = model.release.event.noise_multiplier
    expected = subsampled_gaussian_epsilon(
        multiplier, 30 / dm.num_private, 6, 1e-5, sampling=WITHOUT_REPLACEMENT
    )
    assert accountant.epsilon() == pytest.approx(expected, rel=1e-9)
    assert accountant.report()["releases"] == 6


def test_directions_are_checked_so_the_sensitivity_holds_for_every_draw():
    """Θ comes from a public seed, so the worst pair can be chosen knowing
    it; every Θ the release uses has ‖Θ‖²_op ≤ w, i.e. Δ = 2√w holds deterministically."""
    release = SlicedGaussianRelease(70, delta=1e-5, delta_s=1e-2, w_bound="clt")
    release.calibrate(1.0, 8)
    w = 13.0  # a tight threshold (median ‖Θ‖²_op ≈ 13.3 here), to exercise the redraws
    release.w = lambda dim: w
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        theta = release.directions(8, generator)
        u = torch.linalg.svd(theta.double())[2][0]  # the adversary's worst direction
        assert float((theta.double() @ u).square().sum()) <= w * (1 + 1e-9)
    assert release.redraws > 0  # some draws were rejected
    records = torch.nn.functional.normalize(torch.randn(5, 8), dim=1)
    bad = torch.nn.functional.normalize(torch.ones(70, 8), dim=1)  # ‖Θ‖²_op = 70 > w
    with pytest.raises(ValueError, match="exceeds w"):
        release(records, bad, generator)
    assert release.events.total == 0  # refused before anything was released


def test_a_target_the_one_release_would_exceed_is_refused_before_it_is_drawn(tmp_path, release_spy):
    model = DPSWFlow(num_particles=16, num_directions=8, directions_per_step=4, noise_scale=0.5)
    accountant = PrivacyAccountantCallback(target_epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="before training .* would spend epsilon=.*nothing was"):
        _trainer(tmp_path, 3, [accountant]).fit(model, _toy())
    assert release_spy == [] and model.mechanism_calls == 0 and not bool(model.released)


@pytest.mark.parametrize("setting", [{"limit_train_batches": 0}, {"max_epochs": 0}])
def test_the_one_release_is_refused_in_a_fit_that_trains_no_batch(tmp_path, release_spy, setting):
    """Nothing would compose or report it: refused before the noise is drawn."""
    model = DPSWFlow(num_particles=16, num_directions=8, directions_per_step=4, noise_scale=0.5)
    trainer = L.Trainer(
        logger=False, enable_checkpointing=False, enable_progress_bar=False, accelerator="cpu",
        default_root_dir=str(tmp_path), callbacks=[PrivacyAccountantCallback()], **setting,
    )  # fmt: skip
    with pytest.raises(ValueError, match="trains no batch"):
        trainer.fit(model, _toy())
    assert release_spy == [] and model.mechanism_calls == 0


def test_a_flow_without_an_accountant_warns_once_and_before_its_release(tmp_path, release_spy):
    model = DPSWFlow(num_particles=16, num_directions=8, directions_per_step=4, noise_scale=0.5)
    with pytest.warns(UserWarning, match="no PrivacyAccountantCallback") as caught:
        with pytest.MonkeyPatch.context() as patch:  # the release must not have run yet
            patch.setattr(sliced_release, "gaussian_sliced_release", _refuse_if_warned(caught))
            _trainer(tmp_path, 2).fit(model, _toy())
    assert sum("no PrivacyAccountantCallback" in str(w.message) for w in caught) == 1


def _refuse_if_warned(caught):
    real = sliced_release.gaussian_sliced_release

    def release(*args, **kwargs):
        assert any("no PrivacyAccountantCallback" in str(w.message) for w in caught)
        return real(*args, **kwargs)

    return release


def test_dpswgen_target_epsilon_counts_every_accumulated_release(tmp_path):
    """σ from target_epsilon is calibrated for max_steps × accumulate_grad_batches releases."""
    from lightning_dpot.nn import MLPGenerator

    generator = MLPGenerator(latent_dim=2, output_shape=[2], hidden=[16])
    model = DPSWGen(generator, num_directions=12, target_epsilon=1.0, generated_batch_size=16)
    accountant = PrivacyAccountantCallback()
    trainer = _trainer(tmp_path, 4, [accountant], accumulate_grad_batches=3)
    dm = _toy(batch_size=30)
    trainer.fit(model, dm)
    # 4 optimizer steps of 3 batches plan 12 releases (Lightning may flush an accumulation
    # window at an epoch end, so fewer can happen); σ is calibrated for the 12.
    multiplier = model.release.event.noise_multiplier
    planned = subsampled_gaussian_epsilon(
        multiplier, 30 / dm.num_private, 12, 1e-5, sampling=WITHOUT_REPLACEMENT
    )
    assert planned == pytest.approx(1.0, rel=0.05) and planned <= 1.0
    assert accountant.releases <= 12 and accountant.epsilon() <= 1.0


def test_private_flow_without_an_accountant_warns_and_public_subsets_claim_no_amplification(
    tmp_path,
):
    model = DPSWFlowR(num_particles=16, num_directions=8, noise_scale=1.0)
    with pytest.warns(UserWarning, match="no PrivacyAccountantCallback is attached"):
        _trainer(tmp_path, 2).fit(model, _toy(batch_size=40, seed=5))
    event = model.release.event  # subsets from a public seed are known: b of b
    assert event.dataset_size == event.batch_size == 40 and event.sample_rate == 1.0


def test_dpot_fit_attaches_the_accountant_before_the_checkpoint_callback():
    from lightning.pytorch.callbacks import Checkpoint

    from lightning_dpot.training import run_lightning

    cli = run_lightning(
        ["--config", str(CONFIG_DIR / "toy_5gaussians_sigma0p5.yaml"), "--trainer.logger=false"],
        run=False,
    )
    kinds = [type(cb).__name__ for cb in cli.trainer.callbacks]
    checkpoint = next(i for i, cb in enumerate(cli.trainer.callbacks) if isinstance(cb, Checkpoint))
    assert kinds.count("PrivacyAccountantCallback") == 1
    assert kinds.index("PrivacyAccountantCallback") < checkpoint
