"""Poisson sampling: Bernoulli(q) inclusion, empty batches, reproducible and resumable masks
that are never replayed, disjoint data-independent DDP shards."""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, TensorDataset

from lightning_dpot.data.poisson import (
    EmptyBatchCollate,
    PoissonBatchSampler,
    PoissonDataLoader,
    poisson_dataloader,
)


def _all_batches(sampler: PoissonBatchSampler) -> list[list[int]]:
    return [list(batch) for batch in sampler]


def test_inclusion_rate_is_q_for_every_record():
    n, q, steps = 2_000, 0.05, 400
    sampler = PoissonBatchSampler(n, q, num_steps=steps, seed=3)
    counts = np.zeros(n)
    sizes = []
    for batch in sampler:
        assert len(set(batch)) == len(batch) and batch == sorted(batch)
        counts[batch] += 1
        sizes.append(len(batch))
    # total inclusions ~ Binomial(n * steps, q): within 4 standard deviations
    total, mean = counts.sum(), n * steps * q
    assert abs(total - mean) < 4 * math.sqrt(mean * (1 - q))
    # per record ~ Binomial(steps, q) = mean 20, sd 4.36: no record is systematically favoured
    assert counts.min() > 0 and counts.max() < steps * q + 6 * math.sqrt(steps * q * (1 - q))
    # batch sizes vary (Binomial(n, q)), they are not fixed
    assert np.std(sizes) == pytest.approx(math.sqrt(n * q * (1 - q)), rel=0.2)


def test_empty_batches_are_yielded_and_count_as_steps():
    sampler = PoissonBatchSampler(10, 0.02, num_steps=200, seed=0)
    batches = _all_batches(sampler)
    assert len(batches) == 200 == len(sampler)
    assert sum(len(b) == 0 for b in batches) > 100  # P(empty) = 0.98^10 ≈ 0.82


def test_default_steps_per_epoch_is_one_expected_pass():
    assert len(PoissonBatchSampler(60_000, 1 / 1200)) == 1200
    assert len(PoissonBatchSampler(100, 0.3)) == 3
    assert len(PoissonBatchSampler(100, 1.0)) == 1


def test_masks_are_reproducible_and_differ_by_seed_epoch_and_step():
    first = _all_batches(PoissonBatchSampler(500, 0.1, num_steps=5, seed=7))
    again = _all_batches(PoissonBatchSampler(500, 0.1, num_steps=5, seed=7))
    other_seed = _all_batches(PoissonBatchSampler(500, 0.1, num_steps=5, seed=8))
    assert first == again
    assert first != other_seed
    assert len({tuple(b) for b in first}) == 5


def test_epochs_advance_after_a_full_pass_so_masks_never_repeat():
    sampler = PoissonBatchSampler(500, 0.1, num_steps=4, seed=1)
    epoch0, epoch1 = _all_batches(sampler), _all_batches(sampler)
    assert epoch0 == [sampler.batch_indices(0, s) for s in range(4)]
    assert epoch1 == [sampler.batch_indices(1, s) for s in range(4)]
    assert sampler.epoch == 1
    sampler.set_epoch(1)  # Lightning re-setting the current epoch keeps the position
    assert _all_batches(sampler) == [sampler.batch_indices(2, s) for s in range(4)]
    sampler.set_epoch(5)
    assert _all_batches(sampler)[0] == sampler.batch_indices(5, 0)


def test_an_abandoned_epoch_continues_without_replaying_masks():
    sampler = PoissonBatchSampler(500, 0.1, num_steps=6, seed=2)
    iterator = iter(sampler)
    head = [next(iterator), next(iterator)]
    del iterator
    rest = _all_batches(sampler)
    assert head + rest == [sampler.batch_indices(0, s) for s in range(6)]


def test_ddp_shards_are_disjoint_fixed_and_cover_the_data():
    n, world = 1_001, 3
    samplers = [
        PoissonBatchSampler(n, 0.2, num_steps=20, seed=4, rank=r, world_size=world)
        for r in range(world)
    ]
    shards = [set(s.shard().tolist()) for s in samplers]
    assert set().union(*shards) == set(range(n))
    assert all(a.isdisjoint(b) for i, a in enumerate(shards) for b in shards[i + 1 :])
    assert shards[1] == set(range(1, n, world))
    per_rank = [_all_batches(s) for s in samplers]
    for shard, batches in zip(shards, per_rank, strict=True):
        assert len(batches) == 20  # same number of steps on every rank
        assert all(set(b) <= shard for b in batches)
    # each rank draws from its own stream: positions within the shards are not shared
    positions = [[[i // world for i in b] for b in batches] for batches in per_rank]
    assert positions[0] != positions[1]


def test_poisson_dataloader_returns_zero_row_batches_for_empty_samples():
    data = TensorDataset(torch.randn(8, 1, 4, 4), torch.arange(8))
    loader = poisson_dataloader(data, 0.02, num_steps=60, seed=0)
    shapes = [(x.shape, y.shape, x.dtype, y.dtype) for x, y in loader]
    assert len(shapes) == 60
    assert (torch.Size([0, 1, 4, 4]), torch.Size([0]), torch.float32, torch.int64) in shapes
    assert any(s[0][0] > 0 for s in shapes)


def test_dataloader_state_resumes_at_the_next_unconsumed_batch():
    data = TensorDataset(torch.arange(300).float().unsqueeze(1))

    def loader() -> PoissonDataLoader:
        return poisson_dataloader(data, 0.05, num_steps=8, seed=5)

    reference = [x[:, 0].long().tolist() for (x,) in loader()]
    first = loader()
    consumed = []
    for (x,) in first:
        consumed.append(x[:, 0].long().tolist())
        if len(consumed) == 3:
            break
    state = first.state_dict()
    assert (state["epoch"], state["next_step"]) == (0, 3)
    resumed = loader()
    resumed.load_state_dict(state)
    assert consumed + [x[:, 0].long().tolist() for (x,) in resumed] == reference


def test_dataloader_counts_consumed_not_prefetched_batches_with_workers():
    data = TensorDataset(torch.arange(300).float().unsqueeze(1))
    loader = poisson_dataloader(data, 0.05, num_steps=8, seed=5, num_workers=1)
    iterator = iter(loader)
    next(iterator)
    next(iterator)
    assert loader.state_dict()["next_step"] == 2
    assert loader.sampler.position()[1] > 2  # the worker drew ahead
    del iterator


class _DictDataset(Dataset):
    def __len__(self) -> int:
        return 5

    def __getitem__(self, index: int) -> dict:
        return {"image": torch.full((2, 3), float(index)), "label": index}


def test_empty_batch_collate_keeps_structure_dtype_and_trailing_shape():
    collate = EmptyBatchCollate(_DictDataset()[0])
    empty = collate([])
    assert empty["image"].shape == (0, 2, 3) and empty["label"].shape == (0,)
    assert empty["label"].dtype == torch.int64
    full = collate([_DictDataset()[1], _DictDataset()[2]])
    assert full["image"].shape == (2, 2, 3)
    Pair = namedtuple("Pair", "x y")
    assert EmptyBatchCollate(Pair(torch.zeros(3), 1.0))([]).x.shape == (0, 3)
    with pytest.raises(TypeError, match="empty batch"):
        EmptyBatchCollate("text")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sample_rate": 0.0}, r"sample_rate must lie in \(0, 1\], got 0\.0"),
        ({"sample_rate": 1.2}, "sample_rate"),
        ({"num_samples": 0}, r"num_samples must be an integer >= 1, got 0"),
        ({"num_steps": 0}, "num_steps"),
        ({"seed": -1}, r"seed must be an integer >= 0"),
        ({"rank": 2, "world_size": 2}, r"rank must lie in \[0, world_size=2\), got 2"),
    ],
)
def test_bad_sampler_arguments_are_refused(kwargs, match):
    arguments = {"num_samples": 10, "sample_rate": 0.1}
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=match):
        PoissonBatchSampler(**arguments)


def test_dataloader_requires_a_poisson_batch_sampler():
    with pytest.raises(TypeError, match="sampler must be a PoissonBatchSampler, got list"):
        PoissonDataLoader(TensorDataset(torch.zeros(3)), sampler=[[0], [1]])
