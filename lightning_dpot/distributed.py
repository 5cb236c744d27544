"""Rank and world helpers shared by the data modules, the methods and the release objects."""

from __future__ import annotations

import torch
from torch import Tensor


def rank_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised process group, ``(0, 1)`` without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def all_gather_rows(x: Tensor) -> Tensor:
    """Concatenate the rows of ``x`` from every rank, in rank order (rows may differ in number)."""
    _, world = rank_world()
    if world == 1:
        return x
    size = torch.tensor([x.shape[0]], device=x.device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    torch.distributed.all_gather(sizes, size)
    longest = int(max(s.item() for s in sizes))
    padded = x.new_zeros((longest, *x.shape[1:]))
    padded[: x.shape[0]] = x
    parts = [torch.zeros_like(padded) for _ in range(world)]
    torch.distributed.all_gather(parts, padded)
    return torch.cat([p[: int(s.item())] for p, s in zip(parts, sizes, strict=True)])
