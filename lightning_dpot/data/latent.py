"""DataModules of the two stages of the DP sliced-Wasserstein flow (Sebag et al. 2023, §5 and
App. C).

* ``PublicSplitDataModule`` (stage 1, ``lightning_dpot.data.public_split``) serves the
  **public** part of a seeded public/private split to train the autoencoder.
* ``PrivateLatentDataModule`` (stage 2) recomputes the split from its own source and seed,
  **refuses** to start if it differs from the one stage 1 saved, encodes the **private** part with
  the frozen public autoencoder into ℓ2-normalized latents (``‖z‖₂ = 1``; the sensitivity bound
  of ``lightning_dpot.methods.dpsw.sensitivity`` rests on it) and serves them:

  - ``sample_rate=None``: the module reads the whole private set once
    (``PrivateLatentDataModule.private_records``, DPSWflow); the loader only yields step
    numbers (``steps_per_epoch`` of them) to drive the training loop;
  - ``sample_rate=q``: a Poisson-sampled batch of latents per step
    (``lightning_dpot.data.poisson``), ``steps_per_epoch`` defaulting to ``round(1/q)``;
  - ``batch_size=b``: fixed-size batches of exactly ``b`` of the ``n`` private records drawn
    uniformly **without replacement**, independently at every step (DPSWflow-r, DPSWgen). The
    draw of step ``k`` is ``PrivateLatentDataModule.without_replacement_indices``, a
    function of ``(seed, k)`` only (never of the data), so it is identical on every DDP rank.
    The module draws it itself at its ``global_step`` (the loader then only yields step
    numbers); ``steps_per_epoch`` defaults to ``max(1, round(n/b))``. This is the sampling of
    the replace-one accounting of
    ``subsampled_gaussian_epsilon`` (Wang,
    Balle, Kasiviswanathan 2019): a fixed batch size makes the number of released rows public.

  The amplification by subsampling assumes the drawn subsets stay hidden, so by default
  (``seed=None``) the sampling seed is drawn from the OS entropy pool at ``setup`` (on rank 0
  and broadcast, so every rank draws the same subsets) and never recorded; a resumed run draws a
  fresh one, which keeps every step's subset uniform and independent of the others. An explicit
  ``seed`` makes the subsets reproducible and public (reports say ``subset_seed_is_public``):
  tests and debugging only.

  Without an autoencoder (``autoencoder=None``, the 2-D toy of Sebag et al. 2023, §5.4) the whole
  training set is private and the records themselves are released; they must lie in the unit ball
  (the source's declared support), and ``normalize="ball"`` scales any row with ``‖x‖₂ > 1`` back
  onto it (a per-record map that does not look at other records, so it costs no privacy).

Both modules' ``setup`` refuses records that are non-finite or outside the source's declared
``[low, high]`` (``check_source_splits``) before any encoding;
stage 2 then refuses latents that are non-finite or have ``‖z‖₂ > 1``
(``check_unit_ball``): the normalization guarantees the
bound, but a NaN or Inf from the encoder survives it. Each error names how many records fail
and the first one's index, never a value computed from them.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from typing_extensions import override

from lightning_dpot.checks import (
    check_nonnegative_int,
    check_positive_int,
    check_probability,
    check_unit_ball,
)
from lightning_dpot.data.fingerprint import check_fingerprint
from lightning_dpot.data.ledger import LedgerSettings, RecordKeys, RunLedger
from lightning_dpot.data.ledger_public import source_part, split_part
from lightning_dpot.data.poisson import poisson_dataloader
from lightning_dpot.data.replicated import replicated_loader
from lightning_dpot.data.sources import DataSource, check_source_splits
from lightning_dpot.data.split import (
    SPLIT_CHECKPOINT_KEY,
    PublicPrivateSplit,
    make_public_private_split,
)
from lightning_dpot.rng import seeded_generator

__all__ = ["PrivateLatentDataModule", "PublicDecoder"]

Normalization = Literal["sphere", "ball"]


def _unit_ball(x: Tensor) -> Tensor:
    return x / torch.linalg.vector_norm(x, dim=1, keepdim=True).clamp_min(1.0)


class PublicDecoder:
    """Latents → records with the public stage-1 decoder (a reshape without an autoencoder):
    all a flow needs of its data module to decode, without the module's private latents, which
    a saved flow must not carry."""

    def __init__(self, autoencoder: nn.Module | None, record_shape: tuple[int, ...]) -> None:
        self.autoencoder = autoencoder
        self.record_shape = tuple(record_shape)

    @torch.no_grad()
    def __call__(self, z: Tensor) -> Tensor:
        if self.autoencoder is None:
            return z.reshape(z.shape[0], *self.record_shape)
        self.autoencoder.eval()
        device = next(self.autoencoder.parameters()).device
        return self.autoencoder.decode(z.to(device))


def load_autoencoder_checkpoint(
    autoencoder: nn.Module, checkpoint_path: str | Path
) -> PublicPrivateSplit:
    """Load the weights saved by ``AutoencoderModule``
    (``state_dict`` keys ``autoencoder.*``) into ``autoencoder`` and return the split it saved."""
    path = Path(checkpoint_path)
    if not path.is_file():
        raise FileNotFoundError(
            f"autoencoder_checkpoint={str(path)!r} does not exist; train stage 1 first "
            "(dpot fit --config configs/dpswflow/<dataset>_autoencoder.yaml)"
        )
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    if SPLIT_CHECKPOINT_KEY not in checkpoint:
        raise ValueError(
            f"autoencoder_checkpoint={str(path)!r} holds no public/private split: it was not "
            "written by AutoencoderModule on a PublicSplitDataModule, so there is no evidence "
            "that the autoencoder never saw the private records"
        )
    prefix = "autoencoder."
    state = {
        k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)
    }
    autoencoder.load_state_dict(state)
    return PublicPrivateSplit.from_dict(checkpoint[SPLIT_CHECKPOINT_KEY])


class PrivateLatentDataModule(L.LightningDataModule):
    """Stage 2: ℓ2-normalized latents of the private split (module docstring).

    Args:
        source: the same dataset as stage 1.
        autoencoder: the same architecture as stage 1 (weights come from the checkpoint); ``None``
            for data that is released directly (2-D toy).
        autoencoder_checkpoint: stage 1's checkpoint (required with ``autoencoder``).
        public_fraction, split_seed: must equal stage 1's; the split is recomputed and compared
            with the one in the checkpoint (and ``split_file`` if given): a mismatch is refused.
        split_file: stage 1's JSON split, checked as well when given.
        sample_rate: Poisson rate q per step, or ``None`` (whole private set, read once).
        batch_size: fixed batch size b drawn without replacement per step (module docstring);
            exclusive with ``sample_rate``.
        steps_per_epoch: training steps per epoch (default ``round(1/q)``, ``round(n/b)``, or 100
            with neither).
        normalize: ``"sphere"`` (``z/‖z‖``, latents) or ``"ball"`` (``z/max(1, ‖z‖)``, toy).
        encode_batch_size: batch size of the (no-grad) encoding pass.
        seed: seed of the Poisson masks and of the without-replacement draws; ``None``
            (default) = secret, from the OS entropy pool (module docstring).
        ledger: the privacy ledger's settings (``LedgerSettings``: ``dir``, ``budget``,
            ``exceed_budget``, ``public_reuse``). A run whose target would take its records
            past ``budget`` is refused when the privacy accountant opens its ledger entry; with
            ``public_reuse="refuse"`` (the default) a run is refused when the ledger holds one
            of its private records as used without noise (a DPSW public split, a held-out
            split), or one of its held-out records as privately released. The public part of
            the same split is no reuse.

    Raises:
        ValueError: naming the parameter: ``autoencoder`` without ``autoencoder_checkpoint``
            or the reverse, an unknown ``normalize``, both ``sample_rate`` and ``batch_size``,
            ``sample_rate`` outside (0, 1], ``batch_size``, ``steps_per_epoch`` or
            ``encode_batch_size`` < 1, a negative ``seed``. At
            ``setup``: invalid records, a checkpoint without a split, or latents outside
            the unit ball.
        SplitMismatchError: at ``setup``, a split that differs from stage 1's (a
            ``ValueError``).
        FileNotFoundError: at ``setup``, a missing ``autoencoder_checkpoint``.

    Example::

        >>> from lightning_dpot.data import HalfCircle, PrivateLatentDataModule
        >>> dm = PrivateLatentDataModule(HalfCircle(n=10_000), normalize="ball", batch_size=256)
        >>> dm.setup("fit")
        >>> z = dm.private_records()  # every row in the unit ball
        >>> z.shape[1], bool((z.norm(dim=1) <= 1 + 1e-6).all())
        (2, True)
        >>> len(dm.without_replacement_indices(step=0))  # the records of step 0
        256
    """

    def __init__(
        self,
        source: DataSource,
        autoencoder: nn.Module | None = None,
        autoencoder_checkpoint: str | None = None,
        public_fraction: float = 0.5,
        split_seed: int = 0,
        split_file: str | None = None,
        sample_rate: float | None = None,
        batch_size: int | None = None,
        steps_per_epoch: int | None = None,
        normalize: Normalization = "sphere",
        encode_batch_size: int = 500,
        seed: int | None = None,
        ledger: LedgerSettings | None = None,
    ) -> None:
        super().__init__()
        if (autoencoder is None) != (autoencoder_checkpoint is None):
            raise ValueError(
                "autoencoder and autoencoder_checkpoint go together (both or neither), got "
                f"autoencoder={type(autoencoder).__name__}, "
                f"autoencoder_checkpoint={autoencoder_checkpoint!r}"
            )
        if normalize not in ("sphere", "ball"):
            raise ValueError(f"normalize must be 'sphere' or 'ball', got {normalize!r}")
        self.source = source
        self.autoencoder = autoencoder
        self.autoencoder_checkpoint = autoencoder_checkpoint
        self.public_fraction = public_fraction
        self.split_seed = split_seed
        self.split_file = split_file
        self.sample_rate = (
            None if sample_rate is None else check_probability("sample_rate", sample_rate)
        )
        if sample_rate is not None and batch_size is not None:
            raise ValueError(
                "give at most one of sample_rate (Poisson) and batch_size (fixed size, without "
                f"replacement), got sample_rate={sample_rate!r}, batch_size={batch_size!r}"
            )
        self.batch_size = (
            None if batch_size is None else check_positive_int("batch_size", batch_size)
        )
        if steps_per_epoch is None and sample_rate is not None:
            steps_per_epoch = max(1, round(1.0 / sample_rate))
        elif steps_per_epoch is None and batch_size is None:
            steps_per_epoch = 100
        self._steps_per_epoch = (
            None
            if steps_per_epoch is None
            else check_positive_int("steps_per_epoch", steps_per_epoch)
        )
        self.normalize = normalize
        self.encode_batch_size = check_positive_int("encode_batch_size", encode_batch_size)
        self.seed = None if seed is None else check_nonnegative_int("seed", seed)
        self._sampling_seed: int | None = self.seed
        self.split: PublicPrivateSplit | None = None
        self.latents: Tensor | None = None
        self.test_records: Tensor | None = None
        self.test_labels: Tensor | None = None
        if self.autoencoder is not None:
            self.autoencoder.requires_grad_(False)
        self.run_ledger = RunLedger(ledger, self)  # the privacy accountant's entry
        self.ledger, self.ledger_settings = self.run_ledger.book, self.run_ledger.settings

    def private_record_keys(self) -> RecordKeys:
        """Ledger keys of the private records: the raw records of the private part of the
        public/private split, or every training record without an autoencoder (2-D toy)."""
        splits = self.source.load()
        if self.autoencoder is None:
            return self.ledger.training_keys(splits)
        split = make_public_private_split(splits.train, self.public_fraction, self.split_seed)
        return self.ledger.training_keys(splits, torch.tensor(split.private, dtype=torch.long))

    def private_record_part(self) -> dict:
        if self.autoencoder is None:
            return source_part(self.source, "train")
        return split_part(self.source, "private", self.public_fraction, self.split_seed)

    # -- facts the modules read ------------------------------------------------------------------
    @property
    def steps_per_epoch(self) -> int:
        """Training steps per epoch (with ``batch_size`` and no explicit value: ``round(n/b)``,
        known after ``setup``)."""
        if self._steps_per_epoch is None:
            assert self.batch_size is not None
            self._steps_per_epoch = max(1, round(self.num_private / self.batch_size))
        return self._steps_per_epoch

    def without_replacement_indices(self, step: int) -> Tensor:
        """Indices of the ``batch_size`` records of step ``step``: a uniformly random subset of
        size b of ``range(n)`` without replacement, a function of ``(seed, step)`` only.

        Raises:
            ValueError: if ``batch_size`` is not set or exceeds the number of private records.
        """
        if self.batch_size is None:
            raise ValueError("without_replacement_indices needs batch_size (got None)")
        n = self.num_private
        if self.batch_size > n:
            raise ValueError(
                f"batch_size must be in [1, n={n}] (the number of private records), got "
                f"{self.batch_size!r}"
            )
        step = check_nonnegative_int("step", step)
        if self._sampling_seed is None:
            raise RuntimeError("call setup() first: the secret sampling seed is drawn there")
        g = seeded_generator(self._sampling_seed, 0x5EED, step)
        return torch.randperm(n, generator=g)[: self.batch_size]

    @property
    def latent_dim(self) -> int:
        if self.autoencoder is not None:
            return int(self.autoencoder.latent_dim)
        return int(self.source.dim)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.source.sample_shape)

    @property
    def num_private(self) -> int:
        assert self.latents is not None, "call setup() first"
        return int(self.latents.shape[0])

    def private_records(self) -> Tensor:
        """The ``(n, d)`` private latents, each with ``‖z‖₂ ≤ 1`` (``= 1`` for ``"sphere"``).

        Only a DP mechanism may consume them (a module's release); everything else must use the
        release."""
        assert self.latents is not None, "call setup() first"
        return self.latents

    @torch.no_grad()
    def encode(self, images: Tensor) -> Tensor:
        """Public encoder, then the normalization: records → ``(n, d)`` latents."""
        if self.autoencoder is None:
            z = images.reshape(images.shape[0], -1).float()
        else:
            self.autoencoder.eval()
            device = next(self.autoencoder.parameters()).device
            parts = [
                self.autoencoder.encode(images[i : i + self.encode_batch_size].to(device)).cpu()
                for i in range(0, images.shape[0], self.encode_batch_size)
            ]
            z = torch.cat(parts)
        norms = torch.linalg.vector_norm(z, dim=1, keepdim=True)
        if self.normalize == "sphere":
            return z / norms.clamp_min(1e-12)
        return _unit_ball(z)

    @torch.no_grad()
    def decode(self, z: Tensor) -> Tensor:
        """Latents → records (public decoder; the identity reshaped without an autoencoder)."""
        return self.public_decoder()(z)

    def public_decoder(self) -> PublicDecoder:
        """The decoder alone, without the private latents: what a flow keeps to decode."""
        return PublicDecoder(self.autoencoder, self.sample_shape)

    # -- Lightning -------------------------------------------------------------------------------
    def _draw_secret_sampling_seed(self) -> None:
        """Secret sampling seed from the OS entropy pool, the same on every rank (rank 0's)."""
        seed = [secrets.randbits(63)]
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.broadcast_object_list(seed, src=0)
        self._sampling_seed = int(seed[0])

    @override
    def setup(self, stage: str | None = None) -> None:
        if self._sampling_seed is None:
            self._draw_secret_sampling_seed()
        if self.latents is not None:
            return
        splits = self.source.load()
        check_source_splits(self.source, splits)
        self.test_records, self.test_labels = splits.test, splits.test_labels
        if self.autoencoder is None:
            private = splits.train
        else:
            split = make_public_private_split(
                splits.train, self.public_fraction, self.split_seed, self.source.describe()
            )
            assert self.autoencoder_checkpoint is not None
            saved = load_autoencoder_checkpoint(self.autoencoder, self.autoencoder_checkpoint)
            split.check_matches(saved, f"autoencoder_checkpoint={self.autoencoder_checkpoint!r}")
            if self.split_file is not None:
                split.check_matches(
                    PublicPrivateSplit.load(self.split_file), f"split_file={self.split_file!r}"
                )
            self.split = split
            private = splits.train[torch.tensor(split.private, dtype=torch.long)]
        del splits
        latents = self.encode(private)
        check_unit_ball(latents, "encoded private latents")
        self.latents = latents

    @override
    def state_dict(self) -> dict[str, Any]:
        """Fingerprint (``lightning_dpot.data.fingerprint``): the split's hash, the number of
        private records and the latent dimension; never a hash of private records."""
        if self.latents is None:
            return {}
        fingerprint = {
            "split_hash": None if self.split is None else self.split.split_hash,
            "num_private": self.num_private,
            "latent_dim": self.latent_dim,
        }
        return {"fingerprint": fingerprint}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("fingerprint", {})
        current = self.state_dict().get("fingerprint", {})
        if saved and current:
            check_fingerprint(saved, current, type(self).__name__)

    @override
    def train_dataloader(self) -> DataLoader:
        latents = self.private_records()
        if self.sample_rate is None:  # whole set read once, or drawn by the module (batch_size)
            steps = torch.arange(self.steps_per_epoch)
            return replicated_loader(TensorDataset(steps), batch_size=1)  # every rank: every step
        return poisson_dataloader(
            TensorDataset(latents),
            self.sample_rate,
            num_steps=self.steps_per_epoch,
            seed=self._sampling_seed,
        )
