"""Every method under 2-process CPU DDP (``ddp_spawn``, Lightning's default
``use_distributed_sampler=True``), compared with one process where the algorithm makes them
comparable. (DP-Sinkhorn's 2-process accounting test lives in
tests/methods/test_dp_sinkhorn.py, the entropic WGAN's shared release in
tests/data/test_privatized_ddp.py, FID in tests/metrics/test_fid.py.)

Each rank writes what it saw to ``rank<r>.pt`` from a callback; the test compares the files.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.multiprocessing import ProcessExitedException

from lightning_dpot.callbacks.privacy_accountant import PrivacyAccountantCallback
from lightning_dpot.data import (
    CentralDPDataModule,
    GaussianMixture2D,
    HalfCircle,
    PrivateLatentDataModule,
    PrivatizedDataModule,
    TensorFile,
)
from lightning_dpot.data.poisson import PoissonBatchSampler
from lightning_dpot.data.release import tensor_sha256
from lightning_dpot.methods import DPSWFlow, DPSWFlowR, DPSWGen, NoisyWGAN
from lightning_dpot.nn import MLPGenerator


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*log_every_n_steps.*")
        yield


class _Record(Callback):
    """Per-rank facts at the end of training, saved to ``out/rank<r>.pt``."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_end(self, trainer, pl_module) -> None:
        dm = trainer.datamodule
        facts: dict = {"global_step": trainer.global_step}
        if hasattr(dm, "release") and getattr(dm, "release", None) is not None:
            facts["release"] = tensor_sha256(dm.release)
        if hasattr(dm, "without_replacement_indices") and dm.batch_size is not None:
            facts["indices"] = [dm.without_replacement_indices(s).tolist() for s in range(3)]
        for name in ("release_sorted", "theta", "particles"):
            if hasattr(pl_module, name):
                facts[name] = getattr(pl_module, name).detach().cpu().clone()
        if hasattr(pl_module, "mechanism_calls"):
            facts["mechanism_calls"] = pl_module.mechanism_calls
        for cb in trainer.callbacks:
            if isinstance(cb, PrivacyAccountantCallback):
                facts["history"] = cb.accountant.history
                facts["epsilon"] = cb.epsilon()
        if "train/loss" in trainer.callback_metrics:
            facts["loss"] = float(trainer.callback_metrics["train/loss"])
        facts["batches_per_epoch"] = trainer.num_training_batches
        torch.save(facts, self.out / f"rank{trainer.global_rank}.pt")


def _fit(
    out: Path,
    devices: int,
    model,
    datamodule,
    steps: int,
    accountant: bool = False,
    record: type[Callback] = _Record,
):
    """Fit with Lightning's defaults for DDP (``use_distributed_sampler=True``); ``record``
    writes each rank's facts to ``out/rank<r>.pt``."""
    out.mkdir(parents=True, exist_ok=True)
    callbacks: list[Callback] = [record(out)]
    if accountant:
        callbacks.insert(0, PrivacyAccountantCallback(50.0, 1e-5, also_report=()))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp_spawn" if devices > 1 else "auto",
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
        callbacks=callbacks,
    )
    try:
        trainer.fit(model, datamodule)
    except ProcessExitedException as error:
        # gloo can abort a spawned worker at interpreter exit, after training has finished
        # ("terminate called without an active exception"; seen once in ~700 CI tests). The
        # per-rank files, written at on_train_end, tell whether training itself completed.
        written = all((out / f"rank{r}.pt").exists() for r in range(devices))
        if error.signal_name != "SIGABRT" or not written:
            raise
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(devices)]


def _latents(**kwargs) -> PrivateLatentDataModule:
    return PrivateLatentDataModule(
        GaussianMixture2D(n=240, n_test=40), normalize="ball", steps_per_epoch=5, **kwargs
    )


def test_noisy_wgan_ranks_share_one_release_and_sync_the_loss(tmp_path):
    dm = PrivatizedDataModule(
        HalfCircle(n=200, n_test=20), "laplace", epsilon=5.0, batch_size=50,
        cache_dir=str(tmp_path / "cache"),
    )  # fmt: skip
    ranks = _fit(tmp_path, 2, NoisyWGAN(MLPGenerator(2, (2,), (16,)), p=1), dm, steps=2)
    assert ranks[0]["release"] == ranks[1]["release"]
    assert len(list((tmp_path / "cache").glob("release-*.pt"))) == 1
    assert ranks[0]["loss"] == ranks[1]["loss"]  # sync_dist: the mean over ranks, on every rank


class _PoissonBatches(Callback):
    """Per rank: the training loader's sampler and the records of every batch, saved to
    ``out/rank<r>.pt``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.batches: list[list[int]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches.append(batch[0][:, 0].long().tolist())  # record i holds the value i

    def on_train_end(self, trainer, pl_module) -> None:
        sampler = trainer.train_dataloader.sampler
        facts = {
            "sampler": type(sampler).__name__,
            "shard": (sampler.rank, sampler.num_replicas),
            "batches": self.batches,
        }
        torch.save(facts, self.out / f"rank{trainer.global_rank}.pt")


class _NoOp(L.LightningModule):
    """Reads its batches and learns nothing (the sampler is what is under test)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        return (self.weight * batch[0].sum()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_ddp_keeps_the_poisson_sampler_on_every_rank(tmp_path):
    """With Lightning's default ``use_distributed_sampler=True``, each of 2 ranks draws exactly
    the package's Poisson masks of its own shard ``rank::2``: Lightning's DistributedSampler in
    its place would give fixed-size shuffled batches the accountant does not assume."""
    n, q, steps, seed = 40, 0.3, 4, 5
    torch.save(torch.arange(n).float().unsqueeze(1), tmp_path / "records.pt")
    source = TensorFile(str(tmp_path / "records.pt"), low=0.0, high=float(n))
    dm = CentralDPDataModule(source, sample_rate=q, steps_per_epoch=steps, seed=seed)
    ranks = _fit(tmp_path / "out", 2, _NoOp(), dm, steps=steps, record=_PoissonBatches)
    for rank, facts in enumerate(ranks):
        assert facts["sampler"] == "PoissonBatchSampler"
        assert facts["shard"] == (rank, 2)
        own = PoissonBatchSampler(n, q, num_steps=steps, seed=seed, rank=rank, world_size=2)
        assert facts["batches"] == [own.batch_indices(0, s) for s in range(steps)]
        assert all(i % 2 == rank for batch in facts["batches"] for i in batch)
    sizes = {len(batch) for facts in ranks for batch in facts["batches"]}
    assert len(sizes) > 1  # Binomial batch sizes, not a fixed batch


def test_dpswflow_releases_once_on_rank_zero_and_broadcasts(tmp_path):
    model = DPSWFlow(num_particles=32, num_directions=10, directions_per_step=5, noise_scale=1.0)
    ranks = _fit(tmp_path, 2, model, _latents(), steps=3)
    assert torch.equal(ranks[0]["release_sorted"], ranks[1]["release_sorted"])
    assert torch.equal(ranks[0]["theta"], ranks[1]["theta"])
    assert [r["mechanism_calls"] for r in ranks] == [1, 0]  # one release, on rank 0 only
    assert [r["batches_per_epoch"] for r in ranks] == [5, 5]  # every step on every rank
    # particles are sharded: 16 per rank, different initial draws, all 32 flow to one release
    assert [tuple(r["particles"].shape) for r in ranks] == [(16, 2), (16, 2)]
    assert not torch.equal(ranks[0]["particles"], ranks[1]["particles"])


@pytest.mark.parametrize("cls", ["DPSWFlowR", "DPSWGen"])
def test_per_step_release_draws_one_subset_and_accounts_as_one_process(tmp_path, cls):
    """The secret sampling seed is drawn on rank 0 and broadcast: both ranks draw the same b
    indices; each releases its half of the rows; the accountant sees one step of (σ/Δ, b/n) per
    optimizer step, exactly as a single process does."""

    def make():
        if cls == "DPSWFlowR":
            return DPSWFlowR(num_particles=32, num_directions=10, noise_scale=10.0)
        generator = MLPGenerator(2, (2,), (16,))
        return DPSWGen(generator, num_directions=10, noise_scale=10.0, generated_batch_size=32)

    two = _fit(tmp_path / "two", 2, make(), _latents(batch_size=60), steps=3, accountant=True)
    one = _fit(tmp_path / "one", 1, make(), _latents(batch_size=60), steps=3, accountant=True)
    assert two[0]["indices"] == two[1]["indices"]
    assert two[0]["indices"] != one[0]["indices"]  # a fresh secret seed per run
    assert two[0]["history"] == two[1]["history"] == one[0]["history"]
    assert two[0]["epsilon"] == one[0]["epsilon"]
    assert two[0]["global_step"] == one[0]["global_step"] == 3
    assert [r["batches_per_epoch"] for r in (*two, *one)] == [5, 5, 5]
    # each rank released its own rows of the 60: 30 each, 3 steps
    assert [r["mechanism_calls"] for r in two] == [3, 3]
