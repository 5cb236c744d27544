"""Stage 1 of the DP sliced-Wasserstein flow (Sebag et al. 2023, §5): the **public** part of a
seeded public/private split (``lightning_dpot.data.split``), served to train the autoencoder.
The split is written to ``split_file`` (if given) and into the autoencoder's checkpoint, where
stage 2 (``lightning_dpot.data.latent``) checks it. The public part is used without noise:
``setup`` enters it in the privacy ledger as a public use (with the held-out split, in a fit),
and refuses records the ledger holds as privately released
(``lightning_dpot.data.ledger_public``, ``public_reuse``)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from lightning_dpot.checks import check_positive_int
from lightning_dpot.data.ledger_public import PublicUse, held_out_use, split_part
from lightning_dpot.data.ledger_settings import LedgerSettings
from lightning_dpot.data.sources import DataSource, DataSplits, check_source_splits
from lightning_dpot.data.split import PublicPrivateSplit, make_public_private_split
from lightning_dpot.distributed import rank_world

__all__ = ["PUBLIC_SPLIT_WHY", "PublicSplitDataModule"]

PUBLIC_SPLIT_WHY = "served without noise to train the autoencoder (stage 1, Sebag et al. 2023)"


class PublicSplitDataModule(L.LightningDataModule):
    """Stage 1: the public part of a seeded public/private split, for the autoencoder.

    Args:
        source: the dataset (e.g. ``MNIST(..., image_size=32)``).
        public_fraction: fraction of the training records that is public (paper: 0.5).
        split_seed: seed of the split permutation.
        split_file: where to write the split as JSON (optional; the split is always saved in
            the autoencoder checkpoint). If the file exists, the split must match it.
        batch_size, num_workers: of the shuffled public loader.
        ledger: the privacy ledger's settings (``LedgerSettings``): its ``dir``, and
            ``public_reuse``: ``"refuse"`` (default): ``setup`` refuses a public split (or, in
            a fit, a held-out split) of which the ledger holds a record as privately released:
            training on it without noise would void that release's guarantee. ``"allow"``
            uses them anyway, and the ledger says so. Nothing here is released, so a
            ``budget`` is refused.

    Raises:
        ValueError: ``batch_size`` < 1, a ``ledger`` with a ``budget``. At
            ``setup``: invalid records, a split that differs from ``split_file``.
        PublicReuseError: at ``setup``, records the ledger holds as privately released,
            with ``public_reuse="refuse"``.
    """

    def __init__(
        self,
        source: DataSource,
        public_fraction: float = 0.5,
        split_seed: int = 0,
        split_file: str | None = None,
        batch_size: int = 128,
        num_workers: int = 0,
        ledger: LedgerSettings | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.public_fraction = public_fraction
        self.split_seed = split_seed
        self.split_file = split_file
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.num_workers = num_workers
        self.ledger_settings = LedgerSettings.of(ledger)
        if self.ledger_settings.budget is not None or self.ledger_settings.exceed_budget:
            raise ValueError(
                "ledger.budget, ledger.exceed_budget: PublicSplitDataModule releases nothing, so "
                "no budget applies (set it on the data module of the private stage)"
            )
        self.ledger = self.ledger_settings.open()
        self.split: PublicPrivateSplit | None = None
        self.public_records: Tensor | None = None
        self.test_records: Tensor | None = None
        self.test_labels: Tensor | None = None

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.source.sample_shape)

    @override
    def setup(self, stage: str | None = None) -> None:
        if self.split is not None:
            return
        splits = self.source.load()
        check_source_splits(self.source, splits)
        split = make_public_private_split(
            splits.train, self.public_fraction, self.split_seed, self.source.describe()
        )
        path = None if self.split_file is None else Path(self.split_file)
        if path is not None and path.is_file():
            split.check_matches(PublicPrivateSplit.load(path), f"split_file={str(path)!r}")
        public = torch.tensor(split.public, dtype=torch.long)
        if rank_world()[0] == 0 and not getattr(self.source, "generated", False):
            self._enter_public_uses(splits, public)
        if path is not None and not path.is_file():
            split.save(path)
        self.split = split
        self.public_records = splits.train[public]
        self.test_records, self.test_labels = splits.test, splits.test_labels
        del splits  # the private records are not kept by stage 1

    def _enter_public_uses(self, splits: DataSplits, public: Tensor) -> None:
        """Enter the public split (and, in a fit, the held-out split) in the privacy ledger as
        used without noise, before any of it is served."""
        which = (
            f"the public split of {type(self.source).__name__} (public_fraction="
            f"{self.public_fraction}, split_seed={self.split_seed})"
        )
        part = split_part(self.source, "public", self.public_fraction, self.split_seed)
        uses = [
            PublicUse(
                self.ledger.training_keys(splits, public), which, PUBLIC_SPLIT_WHY,
                type(self).__name__, part,
            )
        ]  # fmt: skip
        if self.trainer is not None:
            held_out = held_out_use(
                self.ledger.record_keys, self.source, splits.test, type(self).__name__
            )
            uses += [] if held_out is None else [held_out]
        self.ledger.record_public(uses, self.ledger_settings.public_reuse)

    @override
    def train_dataloader(self) -> DataLoader:
        assert self.public_records is not None, "call setup() first"
        return DataLoader(
            TensorDataset(self.public_records),
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.num_workers,
        )
