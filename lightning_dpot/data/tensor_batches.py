r"""Tensors fetched by a whole batch of indices: one gather per tensor, on the host or the device.

A Poisson step's batch is the rows ``B ⊂ {0, ..., N-1}`` of every training tensor
(``lightning_dpot.data.poisson``). ``TensorBatches`` returns it as
``(t.index_select(0, B) for t in tensors)``: one gather per tensor, where a ``TensorDataset``
read through ``BatchView`` and ``default_collate`` indexes |B| records one by one and stacks
them. The values are the same bit for bit (both copy the same rows); an empty batch is the
gather of an empty ``int64`` index, a 0-row tensor of the right dtype and trailing shape.

Device-resident data. With ``device`` set, the tensors are copied there once (all N rows, or
this rank's shard ``rank::world_size`` under DDP, the rows
``shard`` owns) and each step sends only the
index: the host's index list becomes an ``int64`` tensor, pinned and copied with
``non_blocking=True`` where the device is CUDA, and the gather runs on the device. Nothing in
the fetch reads the device back, so the host never waits for the device
(docs/performance.md#feeding-poisson-batches).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from lightning_dpot.checks import check_nonnegative_int, check_positive_int

__all__ = ["TensorBatches", "unbatched"]


def unbatched(batch: Any) -> Any:
    """``collate_fn`` of a dataset that already returns whole batches: the batch itself."""
    return batch


class TensorBatches(Dataset):
    """Tensors with a common first dimension N, indexed by a whole batch of indices.

    ``batches[[i, j, ...]]`` is ``(t[[i, j, ...]] for t in tensors)``, a tuple, in one gather per
    tensor; ``len(batches)`` is N. The read loader needs no automatic batching
    (``batch_size=None``) and no ``collate_fn`` (``unbatched``).

    Args:
        tensors: the tensors, one row per record, all on one device.
        device: where the gathers run; the tensors are copied there once (rows of this rank's
            shard only when ``world_size`` > 1). Default: where the tensors are.
        rank, world_size: keep only the shard ``rank::world_size``; the indices asked for are
            still global (the sampler's), and one outside the shard is refused.

    Raises:
        ValueError: no tensors, tensors of different lengths or devices, ``rank`` outside
            ``[0, world_size)``; at fetch: an index outside the kept shard.
    """

    def __init__(
        self,
        *tensors: Tensor,
        device: torch.device | str | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if not tensors:
            raise ValueError("TensorBatches needs at least one tensor")
        lengths = {int(t.shape[0]) for t in tensors}
        devices = {t.device for t in tensors}
        if len(lengths) != 1 or len(devices) != 1:
            raise ValueError(
                "TensorBatches needs tensors of one length on one device, got lengths "
                f"{[int(t.shape[0]) for t in tensors]} on {[str(t.device) for t in tensors]}"
            )
        self.world_size = check_positive_int("world_size", world_size)
        self.rank = check_nonnegative_int("rank", rank)
        if self.rank >= self.world_size:
            raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank!r}")
        self.num_records = lengths.pop()
        target = devices.pop() if device is None else torch.device(device)
        if self.world_size > 1:
            tensors = tuple(t[self.rank :: self.world_size] for t in tensors)
        self.tensors = tuple(t.to(target).contiguous() for t in tensors)
        self.device = self.tensors[0].device
        # Pinned host memory exists only with CUDA; it makes the index copy asynchronous.
        self._pin = self.device.type == "cuda" and torch.cuda.is_available()

    def __len__(self) -> int:
        return self.num_records

    def device_index(self, indices: Sequence[int]) -> Tensor:
        """The rows to gather on ``device``: the global ``indices`` as ``int64``, mapped to
        shard rows ``(i - rank) / world_size``, sent without waiting (pinned, non-blocking)."""
        index = torch.as_tensor(indices, dtype=torch.int64)
        if self.world_size > 1:
            offset = index - self.rank
            if bool(offset.remainder(self.world_size).any()) or bool((offset < 0).any()):
                raise ValueError(
                    f"an index outside this rank's shard {self.rank}::{self.world_size} was "
                    "asked for: the sampler's rank and world size differ from the kept shard's"
                )
            index = offset.div(self.world_size, rounding_mode="floor")
        if self._pin:
            return index.pin_memory().to(self.device, non_blocking=True)
        return index.to(self.device)

    def __getitem__(self, indices: Sequence[int]) -> tuple[Tensor, ...]:
        index = self.device_index(indices)
        return tuple(t.index_select(0, index) for t in self.tensors)
