r"""Raw private records for central-DP training by gradient sanitization (DP-Sinkhorn).

``CentralDPDataModule`` loads a ``DataSource`` (records
and labels, unmodified) and serves them through ``poisson_dataloader``: at each step every record of
this rank's shard is included independently
with probability q (Cao et al. 2021, App. C, Algorithm 2), ``steps_per_epoch`` is fixed in
advance (default ``round(1/q)``, one expected pass), and an empty batch is a step like any other.

Privacy contract. The raw records may only be consumed by a module whose every use of them is
sanitized (a clipped, noised gradient) by a release object that emits the matching events to
``PrivacyAccountantCallback``
(``lightning_dpot.privacy.contract``). This module
never privatizes anything itself, and it has no ``privacy_report()``: the guarantee comes from
the accountant. The held-out test split (where the source has one) is for evaluation only:
used without noise, it is entered in the privacy ledger as a public use when the accountant
opens the run's entry (``lightning_dpot.data.ledger_public``).

Validation. ``CentralDPDataModule.setup`` refuses non-finite records, records outside the
source's declared ``[low, high]`` and labels outside ``[0, num_classes)`` in both splits
(``check_source_splits``) before keeping them: one NaN or huge
record in a batch would make the sanitized gradient differ from any neighbour's in a way the
noise does not hide.

Sample rate. Give ``sample_rate`` q directly (data-independent), or ``expected_batch_size`` b,
from which q = b / N with N the number of training records (the usual practice, e.g. Opacus;
it treats N as public). Under DDP every rank Poisson-samples its own fixed shard
``rank::world_size`` with the same q (parallel composition, accounting unchanged); the loader's
sampler is a ``DistributedSampler``, so Lightning keeps it with its default
``use_distributed_sampler=True`` (``lightning_dpot.data.poisson``).

Feeding the batches. Each step's batch is fetched by one gather per tensor
(``TensorBatches``), bit for bit the rows the records
indexed one by one and stacked would give. With ``device_resident=True`` the training tensors are
copied to the trainer's device once, at ``setup`` (under DDP only this
rank's shard), and a step sends only its index: an ``int64`` tensor copied from pinned memory
without blocking where the device is CUDA, then gathered there. The Poisson masks stay drawn on
the host, from the sampler's per-step generators: the host must know the batch size |B| to launch
the step's kernels at their shapes, and a mask drawn on the device would need a device-to-host
read of |B| (a synchronization) or padding to a bound. A mask costs the host about 0.35 ms at
N = 60,000, and since nothing in the step waits for the device, it overlaps the device's work on
the previous step (docs/performance.md#feeding-poisson-batches).
"""

from __future__ import annotations

import secrets
from typing import Any

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from lightning_dpot.checks import (
    check_nonnegative_int,
    check_positive,
    check_positive_int,
    check_probability,
)
from lightning_dpot.data.fingerprint import check_fingerprint
from lightning_dpot.data.ledger import LedgerSettings, RecordKeys, RunLedger
from lightning_dpot.data.ledger_public import source_part
from lightning_dpot.data.poisson import poisson_dataloader
from lightning_dpot.data.sources import DataSource, check_source_splits
from lightning_dpot.data.tensor_batches import TensorBatches

__all__ = ["CentralDPDataModule"]


class CentralDPDataModule(L.LightningDataModule):
    """Poisson-sampled raw (record, label) batches for a sanitizing central-DP module.

    Args:
        source: the private dataset (records and, for conditional methods, labels).
        sample_rate: Poisson rate q in (0, 1]. Exactly one of ``sample_rate`` and
            ``expected_batch_size``.
        expected_batch_size: b > 0; q = b / N (module docstring).
        steps_per_epoch: training steps per epoch, fixed; default ``max(1, round(1/q))``.
        seed: seed of the Poisson inclusion masks (``lightning_dpot.data.poisson``). Like the
            noise, the masks must not be known to an adversary for the amplification by
            subsampling to hold, so ``None`` (default) draws a secret seed from the OS entropy
            pool for every loader (each rank samples its own shard, so ranks need not agree; a
            resumed run draws fresh, independent masks). An integer makes the masks
            reproducible and public: tests and debugging only.
        num_workers: DataLoader workers; must be 0 with ``device_resident``.
        device_resident: keep the training records and labels on the trainer's device
            (``trainer.strategy.root_device``; under DDP only this rank's shard), copied once at
            ``setup``, and gather each batch there (module docstring). Without a trainer
            they stay on the host. Default ``False``: batches are gathered on the host and the
            trainer copies them.
        ledger: the privacy ledger's settings (``LedgerSettings``: ``dir``, ``budget``,
            ``exceed_budget``, ``public_reuse``). A run whose target would take its records
            past ``budget`` is refused when the privacy accountant opens its ledger entry; with
            ``public_reuse="refuse"`` (the default) a run is refused when the ledger holds one
            of its training records as used without noise (a DPSW public split, a held-out
            split), or one of its held-out records as privately released.

    Raises:
        ValueError: naming the parameter: both or neither of ``sample_rate`` and
            ``expected_batch_size``, ``sample_rate`` outside (0, 1], ``expected_batch_size``,
            ``steps_per_epoch`` not > 0, a negative ``seed`` or ``num_workers``,
            ``num_workers`` > 0 with ``device_resident``. At
            ``setup``: non-finite or out-of-bounds records or bad labels; at
            ``train_dataloader``: ``expected_batch_size`` > N.

    Example::

        >>> from lightning_dpot.data import CentralDPDataModule, Digits
        >>> dm = CentralDPDataModule(Digits(), expected_batch_size=64)
        >>> dm.setup("fit")
        >>> round(dm.sample_rate * dm.num_private, 6), dm.steps_per_epoch  # q·N, round(1 / q)
        (64.0, ...)
        >>> records, labels = next(iter(dm.train_dataloader()))  # one Poisson-sampled batch
        >>> records.shape[1:], len(records) == len(labels)  # scikit-learn's 8×8 digits
        (torch.Size([1, 8, 8]), True)
    """

    def __init__(
        self,
        source: DataSource,
        sample_rate: float | None = None,
        expected_batch_size: float | None = None,
        steps_per_epoch: int | None = None,
        seed: int | None = None,
        num_workers: int = 0,
        ledger: LedgerSettings | None = None,
        device_resident: bool = False,
    ) -> None:
        super().__init__()
        if (sample_rate is None) == (expected_batch_size is None):
            raise ValueError(
                "give exactly one of sample_rate (q in (0, 1]) and expected_batch_size (> 0), "
                f"got sample_rate={sample_rate!r}, expected_batch_size={expected_batch_size!r}"
            )
        self.source = source
        self._sample_rate = (
            None if sample_rate is None else check_probability("sample_rate", sample_rate)
        )
        self.expected_batch_size = (
            None
            if expected_batch_size is None
            else check_positive("expected_batch_size", expected_batch_size)
        )
        self._steps_per_epoch = (
            None
            if steps_per_epoch is None
            else check_positive_int("steps_per_epoch", steps_per_epoch)
        )
        self.seed = None if seed is None else check_nonnegative_int("seed", seed)
        self.num_workers = check_nonnegative_int("num_workers", num_workers)
        self.device_resident = bool(device_resident)
        if self.device_resident and self.num_workers > 0:
            raise ValueError(
                f"device_resident=True gathers batches on the device in the training process: "
                f"num_workers must be 0, got num_workers={num_workers!r}"
            )
        self._resident: TensorBatches | None = None
        self.train_records: Tensor | None = None
        self.train_labels: Tensor | None = None
        self.test_records: Tensor | None = None
        self.test_labels: Tensor | None = None
        self.run_ledger = RunLedger(ledger, self)  # the privacy accountant's entry
        self.ledger, self.ledger_settings = self.run_ledger.book, self.run_ledger.settings

    def private_record_keys(self) -> RecordKeys:
        """Ledger keys of every training record (all of them are private)."""
        return self.ledger.training_keys(self.source.load())

    def private_record_part(self) -> dict:
        return source_part(self.source, "train")

    # -- public facts the module reads ----------------------------------------------------------
    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.source.sample_shape)

    @property
    def num_classes(self) -> int | None:
        return self.source.num_classes

    @property
    def value_range(self) -> float:
        """Declared ``high − low`` of one coordinate (public; see
        docs/design.md#local-privatization)."""
        return float(self.source.high - self.source.low)

    @property
    def num_private(self) -> int:
        if self.train_records is None:
            raise RuntimeError("call setup() first: the private records are not loaded yet")
        return int(self.train_records.shape[0])

    @property
    def sample_rate(self) -> float:
        """q: given, or ``expected_batch_size / N`` (needs ``setup``)."""
        if self._sample_rate is not None:
            return self._sample_rate
        assert self.expected_batch_size is not None
        q = self.expected_batch_size / self.num_private
        if not 0 < q <= 1:
            raise ValueError(
                f"expected_batch_size={self.expected_batch_size} must lie in "
                f"(0, N={self.num_private}] (N = number of training records)"
            )
        return q

    @property
    def steps_per_epoch(self) -> int:
        return self._steps_per_epoch or max(1, round(1.0 / self.sample_rate))

    @property
    def expected_real_batch(self) -> float:
        """q·N, the expected Poisson batch size over all ranks."""
        return self.sample_rate * self.num_private

    # -- Lightning ------------------------------------------------------------------------------
    @override
    def setup(self, stage: str | None = None) -> None:
        if self.train_records is None:
            self._load_checked()
        if self.device_resident and self.trainer is not None:
            self._resident_batches()

    def _load_checked(self) -> None:
        """Load both splits and keep them only once every record and label is valid."""
        splits = self.source.load()
        if self.source.num_classes is not None and splits.train_labels is None:
            raise ValueError(
                f"{type(self.source).__name__} declares num_classes={self.source.num_classes} "
                "but loaded no training labels"
            )
        check_source_splits(self.source, splits)
        self.train_records = splits.train.float()
        self.train_labels = splits.train_labels
        self.test_records = splits.test
        self.test_labels = splits.test_labels

    def _training_tensors(self) -> list[Tensor]:
        assert self.train_records is not None
        tensors = [self.train_records]
        if self.train_labels is not None:
            tensors.append(self.train_labels.long())
        return tensors

    def _resident_batches(self) -> TensorBatches:
        """The training tensors on the trainer's root device (this rank's shard under DDP),
        copied once; on the host, all of them, without a trainer."""
        trainer = self.trainer
        if trainer is None:
            device, rank, world_size = torch.device("cpu"), 0, 1
        else:
            device = trainer.strategy.root_device
            rank, world_size = trainer.global_rank, trainer.world_size
        kept = self._resident
        if kept is None or (kept.device, kept.rank, kept.world_size) != (device, rank, world_size):
            self._resident = None  # free the old copy before making the new one
            self._resident = TensorBatches(
                *self._training_tensors(), device=device, rank=rank, world_size=world_size
            )
        return self._resident

    @override
    def state_dict(self) -> dict[str, Any]:
        """Fingerprint of the private set (``lightning_dpot.data.fingerprint``): its size and
        record shape, never a hash of the records."""
        if self.train_records is None:
            return {}
        return {"fingerprint": {"num_records": len(self.train_records),
                                "sample_shape": list(self.sample_shape)}}  # fmt: skip

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("fingerprint", {})
        current = self.state_dict().get("fingerprint", {})
        if saved and current:
            check_fingerprint(saved, current, type(self).__name__)

    @override
    def train_dataloader(self) -> DataLoader:
        if self.train_records is None:
            self.setup("fit")
        dataset = (
            self._resident_batches()
            if self.device_resident
            else TensorDataset(*self._training_tensors())
        )
        return poisson_dataloader(
            dataset,
            self.sample_rate,
            num_steps=self.steps_per_epoch,
            seed=secrets.randbits(63) if self.seed is None else self.seed,
            num_workers=self.num_workers,
        )
