"""Loaders that give every DDP rank the same items: the step clock of modules that draw their
own data, and the full-batch release.

Under DDP, Lightning (``use_distributed_sampler=True``, its default) gives every rank a
disjoint share of a loader's indices by replacing its sampler with a ``DistributedSampler``,
unless the sampler already is one. The loaders here carry a one-replica ``DistributedSampler``
(``num_replicas=1``, ``rank=0``, no shuffling): torch's own class, which yields every index in
order, and which Lightning keeps. So a step clock of ``steps_per_epoch`` items runs
``steps_per_epoch`` steps per epoch on every rank, and a full-batch loader hands every rank the
whole release, with 1 process or N.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, Dataset, DistributedSampler

__all__ = ["replicated_loader"]


def replicated_loader(dataset: Dataset, **kwargs: Any) -> DataLoader:
    """A ``DataLoader`` that yields all of ``dataset``, in order, on every rank (module
    docstring). ``kwargs`` go to ``DataLoader`` (``batch_size``, ``collate_fn``...); ``shuffle``
    and ``sampler`` are not allowed."""
    sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False)
    return DataLoader(dataset, sampler=sampler, **kwargs)
