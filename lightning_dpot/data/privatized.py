"""``PrivatizedDataModule``: local differential privacy applied once, at setup
(Reshetova et al. 2024).

Every record is privatized exactly once by a
``LocalRandomizer`` and the release is cached on disk
with its metadata. Every later ``setup`` — other DDP ranks, a resumed run, a second run with the
same configuration — loads the cached release and never draws noise again (redrawing would let an
observer average the noise away). Raw training records are dropped as soon as the release exists; a
raw held-out test split, where the source has one, is kept for evaluation only, and in a fit is
entered in the privacy ledger as a public use (``lightning_dpot.data.ledger_public``).

Alternatively ``release_path`` points at a file written by ``dpot privatize``: the trainer then
never sees raw data, which is the real LDP deployment. The file's metadata fixes the mechanism,
ε, δ and every other privatization setting; a given argument that differs from it is refused.

Concurrency: the existence check of a cached release, the privatization and the save run under
an exclusive lock on the cache entry (``exclusive_lock``), so
runs that share a cache make one release between them, whatever their timing.

Noise seed: by default a fresh secret seed from the operating system's entropy pool is used and
not recorded. An explicit ``seed`` makes the release reproducible for research, but anyone who
knows the seed can subtract the noise: the metadata then says ``"seed_is_public": true``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, TensorDataset
from typing_extensions import override

from lightning_dpot._version import __version__
from lightning_dpot.checks import check_delta, check_epsilon, check_positive_int
from lightning_dpot.data.fingerprint import check_fingerprint
from lightning_dpot.data.ledger import LedgerTotal, PrivacyLedger, PublicUse
from lightning_dpot.data.ledger_public import (
    PublicReuse,
    check_public_reuse,
    held_out_use,
    source_part,
)
from lightning_dpot.data.protocols import check_before_release
from lightning_dpot.data.release import (
    Release,
    config_key,
    exclusive_lock,
    keyed_digest,
    tensor_sha256,
)
from lightning_dpot.data.replicated import replicated_loader
from lightning_dpot.data.sources import DataSource, check_source_splits
from lightning_dpot.distributed import rank_world
from lightning_dpot.privacy.mechanisms.additive import MechanismName, make_mechanism
from lightning_dpot.privacy.mechanisms.gaussian import GaussianCalibration
from lightning_dpot.privacy.mechanisms.ldp import LocalRandomizer
from lightning_dpot.privacy.mechanisms.transforms import RecordTransform, make_transform
from lightning_dpot.rng import SecretNoise, permutation


class FullBatch(Dataset):
    """A dataset of one item, the whole tensors: full-batch training (Reshetova et al. 2024,
    §IV-A, b = n).
    The OT losses are order-free, so the release is neither shuffled nor re-collated; under
    DDP ``full_batch_loader`` yields this one item, the whole cached release, on every
    rank."""

    def __init__(self, *tensors: Tensor) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> tuple[Tensor, ...]:
        return self.tensors


class Records(TensorDataset):
    """Released records, fetched a minibatch at a time: torch's ``__getitems__`` protocol hands
    the sampler's whole index list to one indexing op per tensor, instead of indexing and
    re-stacking record by record (2,000 2-D records: 0.8 ms instead of 19 ms per batch on two
    CPU threads). ``__getitems__`` returns the whole batch as one item, so the loader must use
    ``one_batch`` as ``collate_fn``."""

    def __getitems__(self, indices: list[int]) -> list[tuple[Tensor, ...]]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return [tuple(tensor[index] for tensor in self.tensors)]


def one_batch(items: list[tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
    """The collate function of ``Records``: its one already batched item."""
    if len(items) != 1:
        raise ValueError(f"one_batch collates Records' single batched item, got {len(items)} items")
    return items[0]


def full_batch_loader(*tensors: Tensor) -> DataLoader:
    """One step per epoch over the whole ``tensors`` (no per-record indexing or collation), on
    every DDP rank (``lightning_dpot.data.replicated``)."""
    return replicated_loader(FullBatch(*tensors), batch_size=None)


def _same(given: Any, recorded: Any) -> bool:
    """Equal, numbers up to rounding (a file's ε may be derived from its noise scale)."""
    numbers = (int, float)
    if isinstance(given, numbers) and isinstance(recorded, numbers):
        if isinstance(given, bool) or isinstance(recorded, bool):
            return given is recorded
        return math.isclose(given, recorded, rel_tol=1e-9, abs_tol=0.0)
    return given == recorded


class PrivatizedDataModule(L.LightningDataModule):
    """Locally privatized training data.

    The privatization arguments (``mechanism`` to ``secure_rng``) default to ``None``, "not
    given"; without ``release_path`` that means the default named below. With ``release_path``
    each given one must equal the release file's value.

    Args:
        source: the raw dataset with its declared bounds (omit when ``release_path`` is given).
        mechanism: ``"laplace"`` (pure ε-LDP, ℓ1 sensitivity) or ``"gaussian"`` ((ε, δ)-LDP,
            ℓ2 sensitivity, the default).
        epsilon: privacy budget ε > 0; give it or ``noise_scale``, not both.
        delta: δ ∈ (0, 1) for the Gaussian mechanism.
        noise_scale: Laplace scale b or Gaussian std σ; ε is then derived.
        calibration: Gaussian calibration: ``analytic`` (Balle & Wang 2018, the default),
            ``zhao`` or ``classical``.
        l1_radius: project each record onto the ℓ1 ball of this radius before noise.
        l2_radius: project each record onto the ℓ2 ball of this radius before noise.
        transform: ``identity`` (the default) or ``dct`` (orthonormal 2-D DCT, Reshetova et
            al. 2024, §IV-E).
        dct_keep: side of the kept low-frequency DCT block.
        seed: noise seed; ``None`` draws a secret one (recommended, see module docstring).
        secure_rng: draw the noise and the release order from the OS CSPRNG
            (``OSRandom``, ``docs/secure_noise.md``)
            instead of a secretly seeded ``torch.Generator``; excludes ``seed``. Default False.
        batch_size: training batch size (the full release when ``None``).
        cache_dir: where releases are cached.
        release_path: load this release (written by ``dpot privatize``) instead of privatizing;
            a given privatization argument that differs from the file's metadata is refused.
        shuffle_delta: if set, also report the central (ε, δ)-DP guarantee that the shuffled
            release gives by amplification by shuffling (Feldman, McMillan, Talwar 2021), at
            this δ; pure ε0-LDP (Laplace) only.
        denoise: ``"wavelet"`` trains on the release denoised by wavelet thresholding (baseline
            of Reshetova et al. 2024, Fig. 3; identity transform only). Post-processing at
            ``setup``, no privacy cost: the cached release is neither changed nor replaced, and the
            threshold uses only the public noise std (``wavelet_denoise``).
        denoise_wavelet: the PyWavelets wavelet used by ``denoise="wavelet"``.
        privacy_budget: total ε the raw records may spend over every release ever made from
            them (``lightning_dpot.data.ledger``); a new release past it is refused.
        exceed_privacy_budget: make a release that takes the total past ``privacy_budget``.
        ledger_dir: the privacy ledger's directory (default ``$DPOT_LEDGER_DIR`` or
            ``~/.local/share/lightning_dpot/ledger``).
        public_reuse: ``"refuse"`` (default): a release is refused when the ledger holds one
            of its records as used without noise (a DPSW public split, a held-out split), and a
            fit when it holds one of its held-out records as privately released. ``"allow"``
            releases (or evaluates) anyway, and the ledger says so.

    Raises:
        ValueError: naming the parameter: neither ``source`` nor ``release_path``, an unknown
            ``mechanism``, both or neither of ``epsilon`` and ``noise_scale``, ``delta``
            missing for the Gaussian mechanism or given for the Laplace one, ``seed`` with
            ``secure_rng``, ``batch_size`` < 1, ``privacy_budget`` not > 0, a bad ``denoise``
            setting, ``shuffle_delta`` with the Gaussian mechanism, ``public_reuse`` not
            ``"refuse"`` or ``"allow"``, or an argument that differs from the ``release_path``
            file's. When privatizing (``prepare_data``): records that are non-finite or
            outside the source's bounds.
        PrivacyBudgetError: when privatizing, a new release that would take the records'
            total ε past ``privacy_budget`` (``lightning_dpot.data.ledger``).
        PublicReuseError: before privatizing (or, in a fit, at ``setup``), records used
            without noise before, or held-out records released privately before, with
            ``public_reuse="refuse"``.

    Example::

        >>> import tempfile
        >>> from lightning_dpot.data import HalfCircle, PrivatizedDataModule
        >>> dm = PrivatizedDataModule(HalfCircle(n=10_000), mechanism="laplace", epsilon=2.5,
        ...                           batch_size=500, cache_dir=tempfile.mkdtemp())
        >>> dm.prepare_data()  # privatizes once (rank 0) and caches the release
        >>> dm.setup("fit")
        >>> (records,) = next(iter(dm.train_dataloader()))
        >>> records.shape  # privatized records
        torch.Size([500, 2])
    """

    def __init__(
        self,
        source: DataSource | None = None,
        mechanism: MechanismName | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        noise_scale: float | None = None,
        calibration: GaussianCalibration | None = None,
        l1_radius: float | None = None,
        l2_radius: float | None = None,
        transform: str | None = None,
        dct_keep: int | None = None,
        seed: int | None = None,
        secure_rng: bool | None = None,
        batch_size: int | None = 256,
        num_workers: int = 0,
        cache_dir: str = ".dpot_cache",
        release_path: str | None = None,
        denoise: str | None = None,
        denoise_wavelet: str = "db4",
        shuffle_delta: float | None = None,
        privacy_budget: float | None = None,
        exceed_privacy_budget: bool = False,
        ledger_dir: str | None = None,
        public_reuse: PublicReuse = "refuse",
    ) -> None:
        super().__init__()
        # One release for the whole run: only global rank 0 privatizes (setup refuses on another
        # node that cannot see the cache, see setup()).
        self.prepare_data_per_node = False
        self.ledger = PrivacyLedger(ledger_dir)
        self.privacy_budget = (
            None if privacy_budget is None else check_epsilon("privacy_budget", privacy_budget)
        )
        self.exceed_privacy_budget = bool(exceed_privacy_budget)
        self.public_reuse = check_public_reuse(public_reuse)
        self.ledger_total: LedgerTotal | None = None
        self.ledger_keying: str | None = None
        given = {
            "mechanism": mechanism,
            "epsilon": epsilon,
            "delta": delta,
            "noise_scale": noise_scale,
            "calibration": calibration,
            "l1_radius": l1_radius,
            "l2_radius": l2_radius,
            "transform": transform,
            "dct_keep": dct_keep,
            "seed": seed,
            "secure_rng": secure_rng,
        }
        transform = transform or "identity"
        self._check_denoise(denoise, denoise_wavelet, transform if release_path is None else None)
        self.denoise, self.denoise_wavelet = denoise, denoise_wavelet
        self.denoised_release: Tensor | None = None
        if source is None and release_path is None:
            raise ValueError("give a data source or a release_path written by `dpot privatize`")
        if batch_size is not None:
            check_positive_int("batch_size", batch_size)
        self.source = source
        if secure_rng and seed is not None:
            raise ValueError(
                f"secure_rng=True draws from the OS CSPRNG, which has no seed: got seed={seed!r} "
                "(give one or the other)"
            )
        self.seed = seed
        self.secure_rng = bool(secure_rng)  # None (not given) is False
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.cache_dir = Path(cache_dir)
        self.release_path = None if release_path is None else Path(release_path)
        self.release: Tensor | None = None
        self._fingerprint: dict[str, Any] | None = None
        self.metadata: dict | None = None
        self.test_records: Tensor | None = None
        self.test_labels: Tensor | None = None
        if self.release_path is None:
            assert source is not None
            self.transform: RecordTransform = make_transform(
                transform, source.sample_shape, dct_keep
            )
            self.randomizer = LocalRandomizer.build(
                mechanism or "gaussian",
                self.transform,
                source.low,
                source.high,
                source.diameter(1),
                source.diameter(2),
                epsilon=epsilon,
                delta=delta,
                noise_scale=noise_scale,
                calibration=calibration or "analytic",
                l1_radius=l1_radius,
                l2_radius=l2_radius,
            )
        else:
            self._load_release_file(self.release_path)
            self._check_given_matches_release(given)
        if denoise is not None and len(self.sample_shape) != 3:  # before any release
            raise ValueError(
                "denoise='wavelet' needs image records (C, H, W), got sample_shape="
                f"{self.sample_shape}"
            )
        self.shuffle_delta = shuffle_delta
        if shuffle_delta is not None:
            check_delta("shuffle_delta", shuffle_delta)
            if self.mechanism.name != "laplace":
                raise ValueError(
                    "shuffle_delta: amplification by shuffling (Feldman, McMillan, Talwar 2021) "
                    "is proven for pure ε0-LDP randomizers; the Gaussian mechanism is only "
                    "(ε, δ)-LDP, so no shuffled central guarantee is reported for it"
                )

    # -- the public facts the methods read -------------------------------------------------
    @property
    def mechanism(self):
        return self.randomizer.mechanism

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return self.transform.sample_shape

    def support_diameter(self, p: int) -> float:
        """Public bound on ‖y − y'‖_p for released vectors y (p ∈ {1, 2}), used to start the
        Sinkhorn ε-schedule: the declared diameter plus 8 noise standard deviations per
        coordinate. It depends on public quantities only."""
        d1, d2 = self.transform.diameters(*self._source_diameters())
        m = self.transform.out_dim
        spread = 8.0 * self.mechanism.noise_std
        return d1 + spread * m if p == 1 else d2 + spread * m**0.5

    def _source_diameters(self) -> tuple[float, float]:
        if self.source is not None:
            return self.source.diameter(1), self.source.diameter(2)
        return tuple(self.metadata["source_diameters"])  # type: ignore[index,return-value]

    # -- privatize once ---------------------------------------------------------------------
    def _release_config(self) -> dict:
        assert self.source is not None
        return {
            "source": self.source.describe(),
            "randomizer": self.randomizer.describe(),
            "seed": self.seed,
            "secure_rng": self.secure_rng,
        }

    def cache_path(self) -> Path:
        return self.cache_dir / f"release-{config_key(self._release_config())[:20]}.pt"

    def _privatize(self) -> Release:
        assert self.source is not None
        splits = self.source.load()
        # Refused before the ledger is charged: a bad record must not spend anyone's budget.
        check_source_splits(self.source, splits)
        self.randomizer.check_records(splits.train)
        if self.trainer is not None:  # a fit, which would refuse the batch after the release
            self._check_batch_size(len(splits.train))
        mech = self.randomizer.mechanism
        self.ledger.record(
            self.ledger.training_keys(splits),
            mech.epsilon,
            mech.delta,
            {
                "notion": "local",
                "mechanism": mech.name,
                "config_key": config_key(self._release_config()),
                "cache": str(self.cache_path()),
                "partition": source_part(self.source, "train"),
            },
            self.privacy_budget,
            self.exceed_privacy_budget,
            "Reuse the cached release (same configuration and cache_dir), raise privacy_budget, "
            "or set exceed_privacy_budget=True to spend it deliberately",
            self.public_reuse,
            self._held_out_uses(splits.test),
        )
        generator = SecretNoise(self.seed, self.secure_rng).source()
        # The release is stored in a secret uniformly random order: the trainer receives
        # shuffled reports, which is what amplification by shuffling requires.
        data = self.randomizer(splits.train, generator)
        data = data[permutation(len(data), generator)]
        metadata = {
            **self._release_config(),
            "privacy": self.randomizer.describe(),
            "seed": self.seed if self.seed is not None else "secret (os entropy, not recorded)",
            "seed_is_public": self.seed is not None,
            "raw_hmac_sha256": keyed_digest(splits.train, self.cache_dir),
            "n": len(data),
            "sample_shape": list(self.source.sample_shape),
            "source_diameters": [self.source.diameter(1), self.source.diameter(2)],
            "labels_released": False,
            "lightning_dpot_version": __version__,
        }
        return Release(data, metadata)

    def _cached_release(self) -> Path:
        """The cached release, privatized first (on global rank 0) if there is none.

        The existence check, the privatization and the save hold an exclusive lock on the cache
        entry, and the check is made inside it: of the runs sharing a cache, the first
        privatizes and the others wait for its release and load it. Other ranks never
        privatize; the save is atomic, so they need no lock to see a whole release or none."""
        path = self.cache_path()
        rank, world = rank_world()
        if rank != 0:
            if not path.is_file():
                raise RuntimeError(
                    f"rank {rank} of {world} cannot see the release {path} that rank 0 made: "
                    "a second release of the same records would spend the budget again. Use a "
                    "cache_dir shared by every node, or write the release once with `dpot "
                    "privatize` and pass release_path"
                )
            return path
        with exclusive_lock(path.with_name(f"{path.name}.lock")):
            if not path.is_file():
                self._privatize().save(path)
        return path

    @override
    def prepare_data(self) -> None:
        """Runs on global rank 0 before ``setup``: privatize if no cached release, once the
        module and the trainer's callbacks have had their say and Lightning's tuners were
        refused (``check_before_release``: a run they refuse
        releases nothing)."""
        if self.release_path is None:
            check_before_release(self.trainer)
            self._cached_release()

    @override
    def setup(self, stage: str | None = None) -> None:
        if self.release is not None:
            self._apply_denoise()
            return
        if self.release_path is not None:
            if self.source is not None:
                self._load_test_split()
            return
        path = self._cached_release()
        release = Release.load(path)
        splits = self.source.load()  # type: ignore[union-attr]
        if keyed_digest(splits.train, self.cache_dir) != release.metadata.get("raw_hmac_sha256"):
            raise ValueError(
                f"the cached release {path} was made from different raw data than the source "
                "now holds; refusing to privatize the changed data again under the same "
                "configuration (fresh noise on unchanged records would leak). Use a new "
                "cache_dir to privatize a different dataset deliberately"
            )
        if rank_world()[0] == 0:  # the report's total; hashing every record once is enough
            self._enter_held_out(splits.test)
            keys = self.ledger.training_keys(splits)
            self.ledger_total, self.ledger_keying = self.ledger.total(keys), keys.keying
        self.release, self.metadata = release.data, release.metadata
        self.test_records, self.test_labels = splits.test, splits.test_labels
        del splits  # raw training records are not retained
        self._apply_denoise()

    # -- post-processing (no privacy cost) --------------------------------------------------
    @staticmethod
    def _check_denoise(denoise: str | None, wavelet: str, transform: str | None) -> None:
        if denoise is None:
            return
        if denoise != "wavelet":
            raise ValueError(f"denoise must be None or 'wavelet', got {denoise!r}")
        import pywt

        if wavelet not in pywt.wavelist(kind="discrete"):
            raise ValueError(
                "denoise_wavelet must be a discrete PyWavelets wavelet "
                f"(pywt.wavelist(kind='discrete')), got {wavelet!r}"
            )
        if transform is not None and transform != "identity":
            raise ValueError(
                f"denoise='wavelet' needs transform='identity' (the release must hold images), "
                f"got transform={transform!r}"
            )

    def _apply_denoise(self) -> None:
        """Wavelet-denoise the release into ``denoised_release`` (what training then reads):
        release → images (inverse transform) → wavelet thresholding with the mechanism's
        public noise std, clipped to the declared bounds → forward transform. Post-processing
        of the release: the release itself and its cache file are left as they are."""
        if self.denoise is None or self.denoised_release is not None or self.release is None:
            return
        from lightning_dpot.data.denoise import wavelet_denoise

        if self.transform.name != "identity" or len(self.sample_shape) != 3:
            raise ValueError(
                "denoise='wavelet' needs an image release (C, H, W) with transform='identity', "
                f"got transform={self.transform.name!r}, sample_shape={self.sample_shape}"
            )
        images = self.transform.inverse(self.release)
        low, high = self.randomizer.low, self.randomizer.high
        denoised = wavelet_denoise(
            images, self.mechanism.noise_std, self.denoise_wavelet, clip=(low, high)
        )
        self.denoised_release = self.transform.forward(denoised)

    def _load_release_file(self, path: Path) -> None:
        release = Release.load(path)
        meta = release.metadata
        privacy = meta["privacy"]
        self.transform = make_transform(
            privacy["transform"], tuple(meta["sample_shape"]), privacy.get("dct_keep")
        )
        mechanism = make_mechanism(
            privacy["name"],
            privacy["sensitivity"],
            noise_scale=privacy["noise_scale"],
            delta=privacy["delta"] or None,
            calibration=privacy.get("calibration", "analytic"),
        )
        low, high = privacy["declared_bounds"]
        self.randomizer = LocalRandomizer(
            mechanism, self.transform, low, high, privacy["l1_radius"], privacy["l2_radius"]
        )
        self.release, self.metadata = release.data, meta

    def _check_given_matches_release(self, given: dict[str, Any]) -> None:
        """Refuse every given privatization argument that differs from the release file's
        metadata, naming the parameter, the given value and the file's value: the release was
        made once, under its own settings, and training on it spends exactly those."""
        assert self.metadata is not None and self.release_path is not None
        meta, privacy = self.metadata, self.metadata["privacy"]
        recorded = {
            "mechanism": privacy["name"],
            "epsilon": privacy["epsilon"],
            "delta": privacy["delta"],
            "noise_scale": privacy["noise_scale"],
            "calibration": privacy.get("calibration"),
            "l1_radius": privacy["l1_radius"],
            "l2_radius": privacy["l2_radius"],
            "transform": privacy["transform"],
            "dct_keep": privacy.get("dct_keep"),
            "seed": meta["seed"] if meta["seed_is_public"] else "secret (not recorded)",
            "secure_rng": meta.get("secure_rng", False),
        }
        differ = [
            f"{name}={value!r} is given but the release file has {name}={recorded[name]!r}"
            for name, value in given.items()
            if value is not None and not _same(value, recorded[name])
        ]
        if differ:
            raise ValueError(
                f"release_path={str(self.release_path)!r}: " + "; ".join(differ) + ". A "
                "release's privatization is fixed when it is made: drop these arguments or "
                "make a new release with `dpot privatize`"
            )

    def _load_test_split(self) -> None:
        splits = self.source.load()  # type: ignore[union-attr]
        if rank_world()[0] == 0:
            self._enter_held_out(splits.test)
        self.test_records, self.test_labels = splits.test, splits.test_labels

    def _held_out_uses(self, test: Tensor | None) -> list[PublicUse]:
        """In a fit, the held-out split ``test``, which evaluation reads without noise."""
        if self.trainer is None or self.source is None:
            return []
        use = held_out_use(self.ledger.record_keys, self.source, test, type(self).__name__)
        return [] if use is None else [use]

    def _enter_held_out(self, test: Tensor | None) -> None:
        """Enter ``_held_out_uses`` in the ledger (a use it holds adds no line)."""
        uses = self._held_out_uses(test)
        if uses:
            self.ledger.record_public(uses, self.public_reuse)

    def write_release(self, path: str | Path) -> Path:
        """Privatize (or reuse the cached release) and write it to ``path`` for a trainer."""
        self.prepare_data()
        self.setup("fit")
        assert self.release is not None and self.metadata is not None
        return Release(self.release, self.metadata).save(path)

    # -- loaders ----------------------------------------------------------------------------
    # -- checkpoints: refuse a resume on another release (lightning_dpot.data.fingerprint) ---
    def fingerprint(self) -> dict[str, Any]:
        """The release's SHA-256 (it is DP output, so hashing it costs nothing) and the mechanism
        settings; computed once per release."""
        if self.release is None:
            return {}
        if self._fingerprint is None:
            mech = self.mechanism
            self._fingerprint = {
                "release_sha256": tensor_sha256(self.release),
                "mechanism": mech.name,
                "epsilon": mech.epsilon,
                "delta": mech.delta,
                "sensitivity": mech.sensitivity,
            }
        return self._fingerprint

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict.get("fingerprint", {})
        if saved and self.release is not None:
            check_fingerprint(saved, self.fingerprint(), type(self).__name__)

    def _check_batch_size(self, num_records: int) -> None:
        """A batch no larger than the release (the record count is public); in a fit, checked
        before the release is drawn too, so a run refused for it spends nothing."""
        if self.batch_size is not None and self.batch_size > num_records:
            raise ValueError(
                f"batch_size={self.batch_size} exceeds the number of released records "
                f"({num_records})"
            )

    @override
    def train_dataloader(self) -> DataLoader:
        if self.release is None:
            raise RuntimeError("call setup() before train_dataloader()")
        records = self.release if self.denoised_release is None else self.denoised_release
        if self.batch_size is None:
            return full_batch_loader(records)
        self._check_batch_size(len(self.release))
        return DataLoader(
            Records(records),
            batch_size=self.batch_size,
            shuffle=True,
            drop_last=True,
            num_workers=self.num_workers,
            collate_fn=one_batch,
        )

    def _shuffling_report(self) -> dict:
        """The central (ε, δ) of the shuffled release (Feldman, McMillan, Talwar 2021). With a
        public seed the permutation (and the noise) can be recomputed, so the release is not
        shuffled for anyone who knows it, and no central guarantee by shuffling is claimed."""
        if self.shuffle_delta is None or self.release is None or self.metadata is None:
            return {}
        if self.metadata["seed_is_public"]:
            return {
                "central_by_shuffling": {
                    "applies": False,
                    "reason": "the release's seed is public (seed_is_public: true): its "
                    "permutation and noise can be recomputed, so the shuffled release has "
                    "only the local guarantee",
                    "delta": self.shuffle_delta,
                }
            }
        from lightning_dpot.privacy.accounting.shuffling import (
            closed_form_max_epsilon0,
            shuffle_epsilon_closed_form,
            shuffle_epsilon_numerical,
        )

        eps0, n, delta = self.mechanism.epsilon, len(self.release), self.shuffle_delta
        closed = (
            shuffle_epsilon_closed_form(eps0, n, delta)
            if eps0 <= closed_form_max_epsilon0(n, delta)
            else None
        )
        return {
            "central_by_shuffling": {
                "applies": True,
                "guarantee": "central (ε, δ)-DP of the shuffled release, replace-one adjacency",
                "reference": "Feldman, McMillan, Talwar 2021 (Hiding among the clones)",
                "epsilon0": eps0,
                "n": n,
                "delta": delta,
                "epsilon_numerical": shuffle_epsilon_numerical(eps0, n, delta),
                "epsilon_closed_form": closed,
            }
        }

    def privacy_report(self) -> dict:
        """The LDP guarantee of the release: fixed at privatization, it does not grow with
        training (Reshetova et al. 2024, Remark 1; post-processing)."""
        mech = self.mechanism
        return {
            "notion": "local",
            "kind": "local differential privacy (one release per record, post-processed)",
            "mechanism": mech.name,
            "epsilon": mech.epsilon,
            "delta": mech.delta,
            "noise_scale": mech.noise_scale,
            f"sensitivity_l{mech.p}": mech.sensitivity,
            **{k: v for k, v in self.randomizer.describe().items() if k not in mech.describe()},
            "n_released": None if self.release is None else len(self.release),
            "seed_is_public": None if self.metadata is None else self.metadata["seed_is_public"],
            "secure_rng": None if self.metadata is None else self.metadata.get("secure_rng", False),
            **self._shuffling_report(),
            **self._post_processing_report(),
            "ledger": self._ledger_report(),
        }

    def _ledger_report(self) -> dict | None:
        """Every release of these raw records so far (``lightning_dpot.data.ledger``)."""
        if self.ledger_total is None:
            return None
        return {
            "all_releases_of_these_records": self.ledger_total.as_dict(),
            "composition": "basic (sum of epsilons and deltas), worst record",
            "keying": self.ledger_keying,
            "privacy_budget": self.privacy_budget,
            "path": str(self.ledger.path),
        }

    def _post_processing_report(self) -> dict:
        if self.denoise is None:
            return {}
        return {
            "post_processing": {
                "denoise": self.denoise,
                "wavelet": self.denoise_wavelet,
                "threshold": "VisuShrink sigma*sqrt(2 ln(H*W)), sigma = the mechanism's noise std",
                "clip": [self.randomizer.low, self.randomizer.high],
                "privacy_cost": "none (post-processing of the release)",
            }
        }
