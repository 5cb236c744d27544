r"""Poisson sampling of private records, the sampling the SGM accountants assume.

At every step each record of the (private) dataset is put in the batch independently with
probability ``sample_rate`` q: the batch size is Binomial(N, q), and an empty batch is a
possible, legitimate outcome that still counts as a step (the module still adds its noise and
steps). The number of steps per epoch is fixed in advance (default ``round(1/q)``, one expected
pass) and never depends on the data. This is exactly the subsampling of
``lightning_dpot.privacy.accounting.analysis.rdp_poisson`` (Abadi et al. 2016; Mironov, Talwar,
Zhang 2019): a fixed-size batch, shuffling, or ``drop_last`` would need a different analysis.

Privacy implications
--------------------
* **Adjacency.** The guarantee is for adding or removing one record. Under Poisson sampling a
  record's presence changes the batch by at most that record, so a query clipped to ℓ2 norm Δ per
  batch-level release has sensitivity 2Δ under "clip the whole block" (DP-Sinkhorn,
  docs/dp_sinkhorn.md) or Δ under per-example clipping of a sum; the module states which and passes
  the matching noise multiplier to the accountant. The sampler itself never looks at record values.
* **Fresh randomness.** Each step's inclusion mask must be independent of every other step's.
  The mask of step ``s`` of epoch ``e`` on rank ``r`` comes from its own generator seeded by
  ``(seed, e, r, s)``, so it is reproducible and can be drawn in any order, and the sampler
  keeps its position: a mask is never drawn twice in one process, an abandoned epoch resumes
  where it stopped, and ``PoissonDataLoader`` saves the position of the last *consumed*
  batch in Lightning checkpoints so that a resumed run continues with the next mask instead of
  replaying the epoch's first masks (a replayed mask would correlate two releases and void the
  composition bound). Epochs advance automatically after a full pass (and by ``set_epoch``,
  which Lightning calls), so forgetting ``set_epoch`` does not repeat masks either.
* **DDP (parallel composition).** With ``world_size`` W, rank r owns the fixed shard of indices
  ``r, r + W, r + 2W, ...`` and Poisson-samples it with the same q, from its own stream. Every
  record lives on one rank only and is included with probability q, so one record changes only
  its own rank's release and the per-step guarantee, hence the accounting, is that of one SGM
  step with the same (σ, q), whatever W. The shard map is a function of the record's index, so
  the guarantee is for adding/removing a record while the other records keep their indices (a
  dataset addressed by stable record ids); re-indexing the dataset between runs is a new
  dataset. The sampler is a ``DistributedSampler`` by type, so Lightning keeps it under DDP
  with its default ``use_distributed_sampler=True`` (Lightning replaces only samplers that are
  not one): its own ``DistributedSampler`` would draw fixed-size shuffled batches, a sampling
  the accountant does not assume.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset
from torch.utils.data import default_collate as _default_collate
from typing_extensions import override

from lightning_dpot.checks import (
    check_nonnegative_int,
    check_positive_int,
    check_probability,
)
from lightning_dpot.data.tensor_batches import TensorBatches, unbatched
from lightning_dpot.distributed import rank_world


class PoissonBatchSampler(DistributedSampler[list[int]]):
    """Yields ``num_steps`` Poisson-sampled index batches per epoch (module docstring).

    Args:
        num_samples: size N of the indexed dataset (indices ``0 .. N-1``).
        sample_rate: inclusion probability q of every record at every step, in (0, 1].
        num_steps: steps per epoch, fixed and data-independent; default ``max(1, round(1/q))``.
        seed: seed of the inclusion masks (an integer >= 0).
        rank, world_size: this process's shard; default from ``torch.distributed`` when it is
            initialised when iteration starts, else ``0`` and ``1``.

    The sampler is stateful: ``epoch`` and the next step to draw advance as batches are drawn;
    ``state_dict`` / ``load_state_dict`` save and restore that position.

    It is the ``sampler`` of a ``PoissonDataLoader`` (each item it yields is a whole
    batch) and a ``DistributedSampler`` subclass, so that Lightning leaves it in place under DDP
    (module docstring). ``DistributedSampler.__init__`` is not run: it reads the process group at
    construction and pads the shards to equal length, where this sampler reads the rank when
    iteration starts and never repeats a record.
    """

    def __init__(
        self,
        num_samples: int,
        sample_rate: float,
        num_steps: int | None = None,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.num_samples = check_positive_int("num_samples", num_samples)
        self.sample_rate = check_probability("sample_rate", sample_rate)
        if num_steps is None:
            num_steps = max(1, round(1.0 / self.sample_rate))
        self.num_steps = check_positive_int("num_steps", num_steps)
        self.seed = check_nonnegative_int("seed", seed)
        if world_size is not None:
            world_size = check_positive_int("world_size", world_size)
        if rank is not None:
            rank = check_nonnegative_int("rank", rank)
            if world_size is not None and rank >= world_size:
                raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank!r}")
        self._rank = rank
        self._world_size = world_size
        self.epoch = 0
        self._next_step = 0

    # -- sharding and masks ---------------------------------------------------------------------

    def _rank_and_world_size(self) -> tuple[int, int]:
        rank, world_size = rank_world()
        rank = rank if self._rank is None else self._rank
        world_size = world_size if self._world_size is None else self._world_size
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank!r}")
        return rank, world_size

    @property
    def rank(self) -> int:  # type: ignore[override]
        """This process's shard (``DistributedSampler``'s name), read now."""
        return self._rank_and_world_size()[0]

    @property
    def num_replicas(self) -> int:  # type: ignore[override]
        """The number of shards W (``DistributedSampler``'s name), read now."""
        return self._rank_and_world_size()[1]

    def shard(self) -> np.ndarray:
        """Indices owned by this rank: ``rank, rank + world_size, ...`` (all when W = 1)."""
        rank, world_size = self._rank_and_world_size()
        return np.arange(rank, self.num_samples, world_size, dtype=np.int64)

    def batch_indices(self, epoch: int, step: int) -> list[int]:
        """The batch of ``step`` in ``epoch`` for this rank; a pure function of
        ``(seed, epoch, rank, step)``: each index of the shard kept iff U < q, U ~ Unif[0, 1)
        from a PCG64 stream seeded by ``SeedSequence([seed, epoch, rank, step])``."""
        epoch = check_nonnegative_int("epoch", epoch)
        step = check_nonnegative_int("step", step)
        rank, _ = self._rank_and_world_size()
        shard = self.shard()
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch, rank, step]))
        keep = rng.random(shard.shape[0]) < self.sample_rate
        return shard[keep].tolist()

    # -- iteration --------------------------------------------------------------------------------

    def position(self) -> tuple[int, int]:
        """``(epoch, next step to draw)``, rolled over to the next epoch after a full pass."""
        if self._next_step >= self.num_steps:
            self.epoch += 1
            self._next_step = 0
        return self.epoch, self._next_step

    @override
    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch`` (step 0), unless already in it: re-setting the current epoch keeps
        the position, so Lightning's call at every epoch start (on ``loader.sampler``) does not
        replay a resumed epoch's masks."""
        epoch = check_nonnegative_int("epoch", epoch)
        if epoch != self.epoch:
            self.epoch, self._next_step = epoch, 0

    @override
    def __iter__(self) -> Iterator[list[int]]:
        epoch, _ = self.position()
        while self.epoch == epoch and self._next_step < self.num_steps:
            step = self._next_step
            self._next_step += 1  # marked drawn before it is handed out: never drawn twice
            yield self.batch_indices(epoch, step)

    @override
    def __len__(self) -> int:
        return self.num_steps

    # -- state ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Position plus the settings, for the reader (plain JSON types). The seed is left out:
        checkpoints must not reveal the masks of a secret seed."""
        return {
            "epoch": self.epoch,
            "next_step": self._next_step,
            "sample_rate": self.sample_rate,
            "num_steps": self.num_steps,
            "num_samples": self.num_samples,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the position ``(epoch, next_step)``; the settings are not overwritten."""
        self.epoch = check_nonnegative_int("epoch", state_dict["epoch"])
        self._next_step = check_nonnegative_int("next_step", state_dict["next_step"])


def _empty_batch_like(batch: Any) -> Any:
    """A batch with the structure, dtypes and trailing shapes of ``batch`` and 0 rows."""
    if isinstance(batch, torch.Tensor):
        return torch.empty((0, *batch.shape[1:]), dtype=batch.dtype)
    if isinstance(batch, Mapping):
        return type(batch)({key: _empty_batch_like(value) for key, value in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_empty_batch_like(value) for value in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_empty_batch_like(value) for value in batch)
    raise TypeError(
        f"cannot build an empty batch of type {type(batch).__name__}; pass a collate_fn that "
        "handles an empty list of samples"
    )


class EmptyBatchCollate:
    """``collate_fn`` that also handles Poisson's empty batches.

    Non-empty lists go to ``collate_fn`` (default ``torch.utils.data.default_collate``); an
    empty list returns a batch of the same structure with 0 rows, e.g. ``(Tensor[0, 1, 28, 28],
    Tensor[0])`` for ``(image, label)`` samples. The template is built once from
    ``collate_fn([example])``; only its structure, dtypes and shapes are kept, never its values.
    Picklable, so it works with worker processes.
    """

    def __init__(self, example: Any, collate_fn: Callable[[list[Any]], Any] | None = None) -> None:
        self.collate_fn = _default_collate if collate_fn is None else collate_fn
        self._template = _empty_batch_like(self.collate_fn([example]))

    def __call__(self, samples: Sequence[Any]) -> Any:
        if len(samples) == 0:
            return _empty_batch_like(self._template)
        return self.collate_fn(list(samples))


class BatchView(Dataset):
    """``dataset`` indexed by a whole batch: ``view[[i, j, ...]]`` is the list of samples
    ``[dataset[i], dataset[j], ...]`` (one ``__getitems__`` call where the dataset has one).
    What a loader without automatic batching (``batch_size=None``) fetches when its sampler
    yields batches of indices."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, indices: list[int]) -> list[Any]:
        getitems = getattr(self.dataset, "__getitems__", None)
        if getitems is not None:
            return list(getitems(indices))
        return [self.dataset[i] for i in indices]


class PoissonDataLoader(DataLoader):
    """A ``DataLoader`` over a ``PoissonBatchSampler`` that Lightning keeps under DDP and
    resumes exactly.

    The sampler is the loader's ``sampler`` and yields whole batches (``batch_size=None``: no
    automatic batching). Lightning replaces a loader's sampler under DDP unless it is a
    ``DistributedSampler``, which this one is, so the Poisson sampling the accountant assumes is
    what every process draws, with ``use_distributed_sampler`` left at its default. Besides:

    * a ``TensorBatches``, or a plain ``TensorDataset``
      without a ``collate_fn`` (read as one), is fetched by one gather per tensor and gives the
      batch tuple directly; any other dataset is read through ``BatchView``, with
      ``collate_fn`` defaulting to ``EmptyBatchCollate`` (built from ``dataset[0]``). Either
      way empty batches arrive as 0-row tensors;
    * tensors already on an accelerator are fetched there, in this process: ``num_workers`` must
      be 0 and ``pin_memory`` False;
    * ``state_dict`` / ``load_state_dict`` (Lightning's resumable-loader interface, saved in
      checkpoints under ``loops``) record the position after the last batch handed to the
      training loop, not the last one drawn (workers draw ahead), so a run resumed from a
      mid-epoch checkpoint continues with exactly the next batch.

    ``kwargs`` go to ``DataLoader`` (``num_workers``, ``pin_memory``...); ``batch_size``,
    ``shuffle``, ``batch_sampler`` and ``drop_last`` are not allowed (the sampler sets them).

    Raises:
        TypeError: ``sampler`` is not a ``PoissonBatchSampler``.
        ValueError: ``num_workers`` > 0 or ``pin_memory`` with tensors on an accelerator.
    """

    def __init__(
        self,
        dataset: Dataset,
        sampler: PoissonBatchSampler,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(sampler, PoissonBatchSampler):
            raise TypeError(f"sampler must be a PoissonBatchSampler, got {type(sampler).__name__}")
        if type(dataset) is TensorDataset and collate_fn is None:  # a subclass may transform
            dataset = TensorBatches(*dataset.tensors)
        if isinstance(dataset, TensorBatches):
            if dataset.device.type != "cpu" and (
                kwargs.get("num_workers", 0) > 0 or kwargs.get("pin_memory", False)
            ):
                raise ValueError(
                    f"tensors on {dataset.device} are fetched in this process: num_workers must "
                    f"be 0 and pin_memory False, got num_workers={kwargs.get('num_workers', 0)!r}"
                    f", pin_memory={kwargs.get('pin_memory', False)!r}"
                )
            batched, collate_fn = dataset, unbatched if collate_fn is None else collate_fn
        else:
            batched = BatchView(dataset)
            collate_fn = EmptyBatchCollate(dataset[0]) if collate_fn is None else collate_fn
        super().__init__(batched, sampler=sampler, batch_size=None, collate_fn=collate_fn, **kwargs)
        self._consumed = sampler.state_dict()

    @property
    def poisson_sampler(self) -> PoissonBatchSampler:
        """The loader's ``PoissonBatchSampler`` (its ``sampler``)."""
        assert isinstance(self.sampler, PoissonBatchSampler)
        return self.sampler

    @override
    def __iter__(self) -> Iterator[Any]:
        sampler = self.poisson_sampler
        epoch, next_step = sampler.position()
        self._consumed = {**sampler.state_dict(), "epoch": epoch, "next_step": next_step}
        for batch in super().__iter__():
            next_step += 1
            self._consumed = {**self._consumed, "next_step": next_step}
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """Position after the last consumed batch (see the class docstring)."""
        return dict(self._consumed)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue after the position saved by ``state_dict``."""
        sampler = self.poisson_sampler
        sampler.load_state_dict(state_dict)
        self._consumed = sampler.state_dict()


def poisson_dataloader(
    dataset: Dataset,
    sample_rate: float,
    num_steps: int | None = None,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    **kwargs: Any,
) -> PoissonDataLoader:
    """``PoissonDataLoader`` over ``dataset`` (which must have ``len``; a ``TensorDataset``
    is fetched by one gather per tensor) with a fresh ``PoissonBatchSampler``; ``kwargs`` go
    to the loader."""
    sampler = PoissonBatchSampler(
        len(dataset),  # type: ignore[arg-type]
        sample_rate,
        num_steps=num_steps,
        seed=seed,
        rank=rank,
        world_size=world_size,
    )
    return PoissonDataLoader(dataset, sampler, **kwargs)
