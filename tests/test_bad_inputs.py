"""The bad-input table of docs/bad_inputs.md: every row is one case here (or names the test that
covers it elsewhere, for checks that need a training run). Each case must raise the exception
with the key phrase of its documented message, naming the parameter and what is accepted."""

from __future__ import annotations

import argparse
import math

import lightning as L
import pytest
import torch

from lightning_dpot.callbacks.privacy_accountant import PrivacyAccountantCallback
from lightning_dpot.commands import sample
from lightning_dpot.commands.checkpoint import load_model
from lightning_dpot.commands.evaluate import load_sample_file
from lightning_dpot.data import (
    MNIST,
    GaussianMixture2D,
    HalfCircle,
    PrivateLatentDataModule,
    PrivatizedDataModule,
)
from lightning_dpot.data.central import CentralDPDataModule
from lightning_dpot.data.poisson import PoissonBatchSampler
from lightning_dpot.data.release import Release
from lightning_dpot.data.tabular import TensorFile
from lightning_dpot.methods import DPMERF, DPSinkhorn, DPSWFlow, EntropicWGAN
from lightning_dpot.metrics.fid import InceptionFID
from lightning_dpot.metrics.selection import MetricSelection
from lightning_dpot.nn import MLPGenerator
from lightning_dpot.plugins import AtomicCheckpointIO
from lightning_dpot.privacy.accounting.analysis.epsilon import subsampled_gaussian_epsilon
from lightning_dpot.privacy.mechanisms.gradient_sanitizer import GradientSanitizer
from lightning_dpot.privacy.mechanisms.ldp import LocalRandomizer
from lightning_dpot.privacy.mechanisms.transforms import make_transform


def _half_circle() -> HalfCircle:
    return HalfCircle(n=100, n_test=10)


def _randomize(records: torch.Tensor, low: float = -1.0, high: float = 1.0) -> None:
    transform = make_transform("identity", (2,))
    randomizer = LocalRandomizer.build("laplace", transform, low, high, 4.0, 2.9, epsilon=1.0)
    randomizer(records, torch.Generator())


def _gen() -> MLPGenerator:
    return MLPGenerator(2, (2,), (4,))


def _tensor_file(tmp_path) -> str:
    path = tmp_path / "x.pt"
    torch.save(torch.zeros(10, 2), path)
    return str(path)


def _setup(datamodule):
    datamodule.setup("fit")
    return datamodule.train_dataloader()


def _text_file(tmp_path) -> str:
    path = tmp_path / "notes.txt"
    path.write_text("not a tensor file")
    return str(path)


CASES = {
    # -- privacy parameters ------------------------------------------------------------------
    "epsilon = 0": (
        lambda tmp: PrivatizedDataModule(_half_circle(), "laplace", epsilon=0.0),
        ValueError, r"epsilon must be a finite number > 0, got 0\.0",
    ),
    "epsilon = nan": (
        lambda tmp: PrivatizedDataModule(_half_circle(), "laplace", epsilon=math.nan),
        ValueError, r"epsilon must be a finite number > 0, got nan",
    ),
    "epsilon = inf": (
        lambda tmp: PrivatizedDataModule(_half_circle(), "laplace", epsilon=math.inf),
        ValueError, r"epsilon must be a finite number > 0, got inf",
    ),
    "epsilon and noise_scale": (
        lambda tmp: PrivatizedDataModule(_half_circle(), "laplace", epsilon=1.0, noise_scale=1.0),
        ValueError, "give exactly one of epsilon or noise_scale",
    ),
    "Gaussian without delta": (
        lambda tmp: PrivatizedDataModule(_half_circle(), "gaussian", epsilon=1.0),
        ValueError, r"delta is required for the Gaussian mechanism, in \(0, 1\)",
    ),
    "delta = 1": (
        lambda tmp: PrivatizedDataModule(_half_circle(), "gaussian", epsilon=1.0, delta=1.0),
        ValueError, r"delta must lie in the open interval \(0, 1\), got 1\.0",
    ),
    "delta with the Laplace mechanism": (
        lambda tmp: PrivatizedDataModule(_half_circle(), "laplace", epsilon=1.0, delta=1e-5),
        ValueError, "delta must be unset for the pure-DP Laplace mechanism, got 1e-05",
    ),
    "unknown mechanism": (
        lambda tmp: PrivatizedDataModule(_half_circle(), "exponential", epsilon=1.0),
        ValueError, "mechanism must be 'laplace' or 'gaussian', got 'exponential'",
    ),
    "unknown calibration": (
        lambda tmp: PrivatizedDataModule(
            _half_circle(), "gaussian", epsilon=1.0, delta=1e-5, calibration="rdp"
        ),
        ValueError, r"calibration must be one of \('analytic', 'zhao', 'classical'\)",
    ),
    "negative l1_radius": (
        lambda tmp: PrivatizedDataModule(_half_circle(), "laplace", epsilon=1.0, l1_radius=-1.0),
        ValueError, r"l1_radius must be a finite number > 0, got -1\.0",
    ),
    "unbounded data, no projection": (
        lambda tmp: LocalRandomizer.build(
            "laplace", make_transform("identity", (2,)), -math.inf, math.inf, math.inf,
            math.inf, epsilon=1.0,
        ),
        ValueError, "sensitivity_l1 is unbounded: the declared bounds are infinite",
    ),
    "shuffling with the Gaussian": (
        lambda tmp: PrivatizedDataModule(
            _half_circle(), "gaussian", epsilon=1.0, delta=1e-5, shuffle_delta=1e-6
        ),
        ValueError, "proven for pure ε0-LDP randomizers",
    ),
    "secure_rng with a seed": (
        lambda tmp: PrivatizedDataModule(
            _half_circle(), "laplace", epsilon=1.0, seed=1, secure_rng=True
        ),
        ValueError, r"secure_rng=True draws from the OS CSPRNG, which has no seed: got seed=1",
    ),
    "sample_rate = 0": (
        lambda tmp: subsampled_gaussian_epsilon(1.0, 0.0, 10, 1e-5),
        ValueError, r"sample_rate must lie in \(0, 1\], got 0\.0",
    ),
    "sample_rate > 1": (
        lambda tmp: CentralDPDataModule(_half_circle(), sample_rate=2.0),
        ValueError, r"sample_rate must lie in \(0, 1\], got 2\.0",
    ),
    "noise_multiplier = 0 for an accountant": (
        lambda tmp: subsampled_gaussian_epsilon(0.0, 0.1, 10, 1e-5),
        ValueError, r"noise_multiplier must be a finite number > 0, got 0\.0",
    ),
    "negative noise_multiplier": (
        lambda tmp: DPSinkhorn(_gen(), noise_multiplier=-1.0, conditional=False),
        ValueError, r"noise_multiplier must be a finite number >= 0, got -1\.0",
    ),
    "DP-MERF length_scale = 0": (
        lambda tmp: DPMERF(_gen(), noise_scale=1.0, length_scale=0.0, conditional=False),
        ValueError, r"length_scale must be a finite number > 0, got 0\.0",
    ),
    "DP-MERF with neither noise nor target": (
        lambda tmp: DPMERF(_gen(), conditional=False),
        ValueError, r"give exactly one of noise_scale .* and target_epsilon",
    ),
    "clip_norm = 0": (
        lambda tmp: GradientSanitizer(clip_norm=0.0, noise_multiplier=1.0),
        ValueError, r"clip_norm must be a finite number > 0, got 0\.0",
    ),
    "target_epsilon = 0": (
        lambda tmp: PrivacyAccountantCallback(0.0, 1e-5),
        ValueError, r"target_epsilon must be a finite number > 0, got 0\.0",
    ),
    "noise_scale and target_epsilon": (
        lambda tmp: DPSWFlow(noise_scale=1.0, target_epsilon=1.0),
        ValueError, "give exactly one of noise_scale",
    ),
    "delta_s = 0": (
        lambda tmp: DPSWFlow(noise_scale=1.0, delta_s=0.0),
        ValueError, r"delta_s must lie in the open interval \(0, 1\), got 0\.0",
    ),
    "unknown w_bound": (
        lambda tmp: DPSWFlow(noise_scale=1.0, w_bound="hoeffding"),
        ValueError, "w_bound must be one of",
    ),
    "p = 3": (
        lambda tmp: EntropicWGAN(_gen(), p=3),
        ValueError, "p must be 1 or 2, got 3",
    ),
    # -- sizes and shapes --------------------------------------------------------------------
    "batch_size = 0": (
        lambda tmp: PrivatizedDataModule(_half_circle(), "laplace", epsilon=1.0, batch_size=0),
        ValueError, "batch_size must be an integer >= 1, got 0",
    ),
    "batch_size > n (LDP release)": (
        lambda tmp: _setup(
            PrivatizedDataModule(
                HalfCircle(n=10, n_test=2), "laplace", 1.0, batch_size=11, cache_dir=str(tmp)
            )
        ),
        ValueError, r"batch_size=11 exceeds the number of released records \(10\)",
    ),
    "expected_batch_size > n (central DP)": (
        lambda tmp: _setup(CentralDPDataModule(HalfCircle(n=10, n_test=2), expected_batch_size=11)),
        ValueError, r"expected_batch_size=11(\.0)? must lie in \(0, N=10\]",
    ),
    "sample_rate and expected_batch_size": (
        lambda tmp: CentralDPDataModule(_half_circle(), sample_rate=0.1, expected_batch_size=5),
        ValueError, "give exactly one of sample_rate",
    ),
    "sample_rate and batch_size (DPSW)": (
        lambda tmp: PrivateLatentDataModule(
            GaussianMixture2D(n=10, n_test=2), batch_size=2, sample_rate=0.1
        ),
        ValueError, "give at most one of sample_rate",
    ),
    "num_steps = 0": (
        lambda tmp: PoissonBatchSampler(10, 0.1, num_steps=0),
        ValueError, "num_steps must be an integer >= 1, got 0",
    ),
    "directions_per_step > num_directions": (
        lambda tmp: DPSWFlow(noise_scale=1.0, num_directions=5, directions_per_step=6),
        ValueError, "directions_per_step must be <= num_directions=5, got 6",
    ),
    "n = 0": (
        lambda tmp: HalfCircle(n=0),
        ValueError, "n must be an integer >= 1, got 0",
    ),
    "test_fraction = 1": (
        lambda tmp: TensorFile(_tensor_file(tmp), -1.0, 1.0, test_fraction=1.0).load(),
        ValueError, r"test_fraction must lie in \[0, 1\), got 1\.0",
    ),
    "record shape ≠ declared sample_shape": (
        lambda tmp: _randomize(torch.zeros(3, 3)),
        ValueError, r"records must have shape \(2,\) \(the declared sample_shape",
    ),
    "unknown transform": (
        lambda tmp: PrivatizedDataModule(_half_circle(), "laplace", epsilon=1.0, transform="fft"),
        ValueError, "transform must be 'identity' or 'dct', got 'fft'",
    ),
    # -- data ----------------------------------------------------------------------------------
    "NaN in the data": (
        lambda tmp: _randomize(torch.tensor([[math.nan, 0.0]])),
        ValueError, r"data: 1 record\(s\) contain NaN or Inf values, the first at index 0",
    ),
    "Inf in the data": (
        lambda tmp: _randomize(torch.tensor([[math.inf, 0.0]])),
        ValueError, r"data: 1 record\(s\) contain NaN or Inf values, the first at index 0",
    ),
    "data outside the declared bounds": (
        lambda tmp: _randomize(torch.tensor([[2.0, 0.0]])),
        ValueError,
        r"data: 1 record\(s\) lie outside the declared bounds \[low, high\] = \[-1\.0, 1\.0\], "
        r"the first at index 0",
    ),
    "empty dataset": (
        lambda tmp: _randomize(torch.zeros(0, 2)),
        ValueError, "the dataset is empty: nothing to privatize",
    ),
    "declared bounds high <= low": (
        lambda tmp: TensorFile(_tensor_file(tmp), 1.0, 1.0),
        ValueError, r"high must be > low, got low=1\.0, high=1\.0",
    ),
    # -- paths and files -------------------------------------------------------------------------
    "missing data file": (
        lambda tmp: TensorFile(str(tmp / "none.pt"), -1.0, 1.0).load(),
        FileNotFoundError, r"path='.*none\.pt': no such tensor file",
    ),
    "data file not a tensor file": (
        lambda tmp: TensorFile(_text_file(tmp), -1.0, 1.0).load(),
        ValueError, r"path='.*notes\.txt' is not a torch\.save tensor file",
    ),
    "neither source nor release_path": (
        lambda tmp: PrivatizedDataModule(),
        ValueError, "give a data source or a release_path",
    ),
    "missing release_path": (
        lambda tmp: PrivatizedDataModule(release_path=str(tmp / "none.pt")),
        FileNotFoundError, r"release_path='.*none\.pt': no such release file",
    ),
    "release_path not a release": (
        lambda tmp: Release.load(_text_file(tmp)),
        ValueError, r"release_path='.*notes\.txt' is not a lightning_dpot release file",
    ),
    "missing MNIST directory": (
        lambda tmp: MNIST(idx_dir=str(tmp / "none")).load(),
        FileNotFoundError, r"idx_dir='.*none' is not a directory",
    ),
    "missing FID weights": (
        lambda tmp: InceptionFID(feature_extractor_weights_path=str(tmp / "none.pth")),
        FileNotFoundError, r"feature_extractor_weights_path='.*none\.pth' is not an existing file",
    ),
    "autoencoder without checkpoint": (
        lambda tmp: PrivateLatentDataModule(
            GaussianMixture2D(n=10, n_test=2), autoencoder=torch.nn.Linear(2, 2)
        ),
        ValueError, "autoencoder and autoencoder_checkpoint go together",
    ),
    "missing autoencoder checkpoint": (
        lambda tmp: PrivateLatentDataModule(
            GaussianMixture2D(n=10, n_test=2), autoencoder=torch.nn.Linear(2, 2),
            autoencoder_checkpoint=str(tmp / "none.ckpt"),
        ).setup("fit"),
        FileNotFoundError, r"autoencoder_checkpoint='.*none\.ckpt' does not exist; train stage 1",
    ),
    "missing checkpoint (dpot sample / evaluate)": (
        lambda tmp: load_model(str(tmp / "none.ckpt")),
        FileNotFoundError, r"ckpt='.*none\.ckpt': no such checkpoint file",
    ),
    "dpot sample --num_samples 0": (
        lambda tmp: sample.run(
            argparse.Namespace(num=0, batch_size=1, grid_size=1, output=None, grid=None)
        ),
        ValueError, "num must be an integer >= 1, got 0",
    ),
    "missing dpot evaluate --samples file": (
        lambda tmp: load_sample_file(tmp / "none.pt"),
        FileNotFoundError, r"--samples='.*none\.pt': no such file",
    ),
    "unknown metric (dpot evaluate --metrics, a suite's evaluation)": (
        lambda tmp: MetricSelection.parse("fid,bogus"),
        ValueError, r"metrics: unknown metric 'bogus'; accepted: frechet, utility, w2, manifold",
    ),
    "corrupt checkpoint": (
        lambda tmp: AtomicCheckpointIO().load_checkpoint(_text_file(tmp)),
        ValueError, r"ckpt_path='.*notes\.txt' is not a readable checkpoint",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_with_a_clear_error(case, tmp_path):
    call, error, match = CASES[case]
    with pytest.raises(error, match=match):
        call(tmp_path)


def test_a_batch_larger_than_the_release_is_refused_before_anything_is_released(tmp_path):
    """The record count is public: a fit with batch_size > n is refused before the ledger is
    charged or a release drawn."""
    data = PrivatizedDataModule(
        HalfCircle(n=10, n_test=2), "laplace", 1.0, batch_size=11, cache_dir=str(tmp_path / "c")
    )
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match=r"batch_size=11 exceeds the number of released"):
        trainer.fit(EntropicWGAN(_gen()), data)
    assert not list(tmp_path.rglob("release-*.pt"))  # a lock file may stay, empty
    assert data.ledger_total is None or data.ledger_total.releases == 0
    assert not data.ledger.path.is_file() or not data.ledger.path.read_text().strip()
