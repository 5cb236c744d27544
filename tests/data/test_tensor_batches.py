"""Poisson batches fetched by one gather per tensor: bit for bit the BatchView + collate batches,
on the host or resident on the trainer's device, with unchanged masks and private fits."""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import Tensor
from torch.utils.data import TensorDataset

from lightning_dpot.callbacks.privacy_accountant import PrivacyAccountantCallback
from lightning_dpot.data.central import CentralDPDataModule
from lightning_dpot.data.poisson import (
    BatchView,
    EmptyBatchCollate,
    PoissonBatchSampler,
    PoissonDataLoader,
    poisson_dataloader,
)
from lightning_dpot.data.sources import DataSource, DataSplits
from lightning_dpot.data.tensor_batches import TensorBatches
from lightning_dpot.methods.dp_sinkhorn import DPSinkhorn
from lightning_dpot.nn.dcgan import ConditionalDCGANGenerator

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _quiet_and_single_threaded():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=".*log_every_n_steps.*")
        warnings.filterwarnings("ignore", message=".*LeafSpec.*")
        yield
    torch.set_num_threads(threads)


def _bits(t: Tensor) -> Tensor:
    """The tensor's bytes, so that equality is bit for bit (NaN payloads, signed zeros)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def _same_batches(first: list, second: list) -> None:
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert (x.dtype, x.shape) == (y.dtype, y.shape)
            assert torch.equal(_bits(x.cpu()), _bits(y.cpu()))


def _records(n: int = 40) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 1, 4, 4, generator=gen)
    x[0, 0, 0, 0], x[1, 0, 0, 0] = -0.0, float("nan")  # bits a value comparison would miss
    return TensorDataset(x, torch.randint(10, (n,), generator=gen))


def test_gathered_batches_equal_batchview_collate_bit_for_bit_including_empty_ones():
    data = _records()

    def sampler() -> PoissonBatchSampler:
        return PoissonBatchSampler(len(data), 0.05, num_steps=60, seed=4)

    old = PoissonDataLoader(data, sampler(), collate_fn=EmptyBatchCollate(data[0]))
    new = poisson_dataloader(data, 0.05, num_steps=60, seed=4)
    assert isinstance(old.dataset, BatchView) and isinstance(new.dataset, TensorBatches)
    old_batches, new_batches = list(old), list(new)
    assert isinstance(new_batches[0], tuple)
    _same_batches(old_batches, new_batches)
    sizes = [len(batch[0]) for batch in new_batches]
    assert 0 in sizes and max(sizes) > 1  # P(empty) = 0.95^40 ≈ 0.13 per step
    empty = new_batches[sizes.index(0)]
    assert empty[0].shape == (0, 1, 4, 4) and empty[1].dtype == torch.int64
    assert new.state_dict()["next_step"] == 60  # the resume position is kept as before


def test_a_shard_gathers_the_global_indices_of_its_rank_and_refuses_others():
    data = _records(31)
    shard = TensorBatches(*data.tensors, rank=1, world_size=3)
    assert len(shard) == 31 and len(shard.tensors[0]) == 10  # rows 1, 4, ..., 28
    sampler = PoissonBatchSampler(31, 0.5, num_steps=5, seed=2, rank=1, world_size=3)
    masks, whole = list(sampler), TensorBatches(*data.tensors)
    _same_batches([shard[b] for b in masks], [whole[b] for b in masks])
    with pytest.raises(ValueError, match=r"outside this rank's shard 1::3"):
        shard[[1, 2]]


class TinyImages(DataSource):
    """``n`` seeded random 1×8×8 images in [−1, 1] with 10 labels."""

    low, high = -1.0, 1.0
    sample_shape = (1, 8, 8)
    num_classes = 10

    def __init__(self, n: int = 200) -> None:
        self.n = n

    def load(self) -> DataSplits:
        gen = torch.Generator().manual_seed(0)
        x = torch.rand(self.n, 1, 8, 8, generator=gen) * 2 - 1
        return DataSplits(x, torch.randint(10, (self.n,), generator=gen))


class _Batches(L.Callback):
    """Keeps every training batch, and whether the strategy's transfer leaves a freshly gathered
    batch of the loader's dataset as it is (the same tensors, no copy)."""

    def __init__(self) -> None:
        self.batches: list = []
        self.moved_in_place = True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches.append(tuple(batch))
        gathered = trainer.train_dataloader.dataset[[0, 1, 2]]
        moved = trainer.strategy.batch_to_device(gathered)
        self.moved_in_place &= all(a is b for a, b in zip(moved, gathered, strict=True))


def _private_fit(root: Path, resident: bool, accelerator: str = "cpu") -> tuple[dict, _Batches]:
    torch.manual_seed(0)
    generator = ConditionalDCGANGenerator(
        10, latent_dim=4, embed_dim=2, image_size=8, hidden_channels=(8, 8, 8)
    )
    module = DPSinkhorn(
        generator, noise_multiplier=1.0, clip_norm=0.5, num_cross=10, lr=1e-3, noise_seed=11
    )
    dm = CentralDPDataModule(TinyImages(), sample_rate=0.05, seed=3, device_resident=resident)
    batches = _Batches()
    trainer = L.Trainer(
        default_root_dir=root,
        accelerator=accelerator,
        devices=1,
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[PrivacyAccountantCallback(delta=1e-5, target_epsilon=100.0), batches],
    )
    trainer.fit(module, dm)
    assert trainer.global_step == 4
    loader = trainer.train_dataloader
    assert isinstance(loader.dataset, TensorBatches) and loader.num_workers == 0
    assert not loader.pin_memory
    if resident:
        assert loader.dataset.device == trainer.strategy.root_device
    state = {k: v.detach().cpu() for k, v in module.generator.state_dict().items()}
    return state, batches


def test_device_resident_private_fit_equals_the_host_fit_bit_for_bit(tmp_path: Path):
    host, host_batches = _private_fit(tmp_path / "host", resident=False)
    resident, resident_batches = _private_fit(tmp_path / "resident", resident=True)
    _same_batches(host_batches.batches, resident_batches.batches)
    assert resident_batches.moved_in_place  # batch_to_device leaves resident tensors alone
    assert host.keys() == resident.keys()
    for name in host:
        assert torch.equal(_bits(host[name]), _bits(resident[name])), name


@CUDA
def test_device_resident_batches_are_on_the_cuda_device_and_equal_the_host_path(tmp_path: Path):
    _, host = _private_fit(tmp_path / "host", resident=False)
    _, cuda = _private_fit(tmp_path / "cuda", resident=True, accelerator="gpu")
    assert all(t.device.type == "cuda" for batch in cuda.batches for t in batch)
    assert cuda.moved_in_place
    _same_batches(host.batches, cuda.batches)


@CUDA
def test_a_cuda_gather_sends_a_pinned_index_and_refuses_workers():
    data = _records()
    cuda = TensorBatches(*data.tensors, device="cuda")
    whole = TensorBatches(*data.tensors)
    masks = list(PoissonBatchSampler(len(data), 0.3, num_steps=6, seed=1))
    _same_batches([whole[b] for b in masks], [cuda[b] for b in masks])
    with pytest.raises(ValueError, match="num_workers must be 0 and pin_memory False"):
        poisson_dataloader(cuda, 0.3, num_workers=1)


def test_device_resident_setup_keeps_the_host_records_and_the_fingerprint():
    dm = CentralDPDataModule(TinyImages(50), sample_rate=0.1, seed=0, device_resident=True)
    dm.setup("fit")
    assert dm.state_dict() == {"fingerprint": {"num_records": 50, "sample_shape": [1, 8, 8]}}
    loader = dm.train_dataloader()
    assert isinstance(loader.dataset, TensorBatches) and loader.dataset.device.type == "cpu"
    assert loader.dataset.tensors[0].data_ptr() == dm.train_records.data_ptr()  # no copy


def test_device_resident_with_workers_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"device_resident=True .* num_workers must be 0"):
        CentralDPDataModule(TinyImages(), sample_rate=0.1, num_workers=2, device_resident=True)
