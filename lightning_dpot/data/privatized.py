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

The release, its cache entry and its lock are a ``LocalReleaseCache``
(``lightning_dpot.data.local_release``): runs that share a cache make one release between them,
whatever their timing. A release file is read by ``lightning_dpot.data.release_file``; wavelet
denoising (``lightning_dpot.data.denoise.WaveletDenoising``) is post-processing of either.

Noise seed: by default a fresh secret seed from the operating system's entropy pool is used and
not recorded. An explicit ``seed`` makes the release reproducible for research, but anyone who
knows the seed can subtract the noise: the metadata then says ``"seed_is_public": true``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from torch import Tensor
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_dpot.checks import check_delta, check_positive_int
from lightning_dpot.data.denoise import WaveletDenoising
from lightning_dpot.data.fingerprint import check_fingerprint
from lightning_dpot.data.ledger import LedgerSettings, LedgerTotal, PublicUse
from lightning_dpot.data.ledger_public import held_out_use, source_part
from lightning_dpot.data.loaders import Records, full_batch_loader, one_batch
from lightning_dpot.data.local_release import LocalReleaseCache
from lightning_dpot.data.protocols import check_before_release
from lightning_dpot.data.release import (
    Release,
    tensor_sha256,
)
from lightning_dpot.data.release_file import check_given_matches_release, load_release_file
from lightning_dpot.data.sources import DataSource, DataSplits
from lightning_dpot.distributed import rank_world
from lightning_dpot.privacy.mechanisms.additive import MechanismName
from lightning_dpot.privacy.mechanisms.gaussian import GaussianCalibration
from lightning_dpot.privacy.mechanisms.ldp import LocalRandomizer
from lightning_dpot.privacy.mechanisms.transforms import RecordTransform, make_transform


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
        denoise: a ``WaveletDenoising``: train on the release denoised by wavelet thresholding
            (baseline of Reshetova et al. 2024, Fig. 3; identity transform only).
            Post-processing at ``setup``, no privacy cost: the cached release is neither changed
            nor replaced, and the threshold uses only the public noise std
            (``wavelet_denoise``).
        ledger: the privacy ledger's settings (``LedgerSettings``: ``dir``, ``budget``,
            ``exceed_budget``, ``public_reuse``). A new release that would take the records'
            total ε past ``budget`` is refused; with ``public_reuse="refuse"`` (the default) a
            release is refused when the ledger holds one of its records as used without noise
            (a DPSW public split, a held-out split), and a fit when it holds one of its
            held-out records as privately released.

    Raises:
        ValueError: naming the parameter: neither ``source`` nor ``release_path``, an unknown
            ``mechanism``, both or neither of ``epsilon`` and ``noise_scale``, ``delta``
            missing for the Gaussian mechanism or given for the Laplace one, ``seed`` with
            ``secure_rng``, ``batch_size`` < 1, ``denoise`` on records that are not images,
            ``shuffle_delta`` with the Gaussian mechanism, or an argument that differs from the
            ``release_path`` file's. When privatizing (``prepare_data``): records that are
            non-finite or outside the source's bounds.
        PrivacyBudgetError: when privatizing, a new release that would take the records'
            total ε past ``ledger.budget`` (``lightning_dpot.data.ledger``).
        PublicReuseError: before privatizing (or, in a fit, at ``setup``), records used
            without noise before, or held-out records released privately before, with
            ``ledger.public_reuse="refuse"``.

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
        denoise: WaveletDenoising | None = None,
        shuffle_delta: float | None = None,
        ledger: LedgerSettings | None = None,
    ) -> None:
        super().__init__()
        # One release for the whole run: only global rank 0 privatizes (setup refuses on another
        # node that cannot see the cache, see setup()).
        self.prepare_data_per_node = False
        self.ledger_settings = LedgerSettings.of(ledger)
        self.ledger = self.ledger_settings.open()
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
        if denoise is not None and not isinstance(denoise, WaveletDenoising):
            raise ValueError(
                "denoise takes a WaveletDenoising (in a config: denoise: {class_path: "
                f"WaveletDenoising, init_args: {{wavelet: db4}}}}), got {denoise!r}"
            )
        if denoise is not None and release_path is None:
            denoise.check_transform(transform)
        self.denoiser = denoise
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
            self.release_cache = LocalReleaseCache(
                source, self.randomizer, seed, self.secure_rng, self.cache_dir
            )
        else:
            release, self.transform, self.randomizer = load_release_file(self.release_path)
            self.release, self.metadata = release.data, release.metadata
            check_given_matches_release(given, self.metadata, self.release_path)
        if denoise is not None and len(self.sample_shape) != 3:  # before any release
            raise ValueError(
                "denoise: WaveletDenoising needs image records (C, H, W), got sample_shape="
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

    # -- privatize once (lightning_dpot.data.local_release) ---------------------------------
    def cache_path(self) -> Path:
        return self.release_cache.path()

    def _before_release(self, splits: DataSplits) -> None:
        """What a release of ``splits`` waits for: in a fit, the batch size (refused after the
        release otherwise), then the ledger's charge of its ε, δ to the training records."""
        if self.trainer is not None:
            self._check_batch_size(len(splits.train))
        mech = self.randomizer.mechanism
        self.ledger.record(
            self.ledger.training_keys(splits),
            mech.epsilon,
            mech.delta,
            {
                "notion": "local",
                "mechanism": mech.name,
                "config_key": self.release_cache.key(),
                "cache": str(self.cache_path()),
                "partition": source_part(self.source, "train"),
            },
            self.ledger_settings.budget,
            self.ledger_settings.exceed_budget,
            "Reuse the cached release (same configuration and cache_dir), raise ledger.budget, "
            "or set ledger.exceed_budget=True to spend it deliberately",
            self.ledger_settings.public_reuse,
            self._held_out_uses(splits.test),
        )

    def _cached_release(self) -> Path:
        return self.release_cache.cached(self._before_release)

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
        self.release_cache.check_made_from(splits, release, path)
        if rank_world()[0] == 0:  # the report's total; hashing every record once is enough
            self._enter_held_out(splits.test)
            keys = self.ledger.training_keys(splits)
            self.ledger_total, self.ledger_keying = self.ledger.total(keys), keys.keying
        self.release, self.metadata = release.data, release.metadata
        self.test_records, self.test_labels = splits.test, splits.test_labels
        del splits  # raw training records are not retained
        self._apply_denoise()

    # -- post-processing (no privacy cost) --------------------------------------------------
    def _apply_denoise(self) -> None:
        """Wavelet-denoise the release into ``denoised_release``, what training then reads
        (``lightning_dpot.data.denoise.WaveletDenoising``)."""
        if self.denoiser is None or self.denoised_release is not None or self.release is None:
            return
        low, high = self.randomizer.low, self.randomizer.high
        noise_std = self.mechanism.noise_std
        self.denoised_release = self.denoiser(self.release, self.transform, noise_std, low, high)

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
            self.ledger.record_public(uses, self.ledger_settings.public_reuse)

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
        """The central (ε, δ) of the shuffled release (Feldman, McMillan, Talwar 2021), where
        ``shuffle_delta`` asks for it."""
        if self.shuffle_delta is None or self.release is None or self.metadata is None:
            return {}
        from lightning_dpot.privacy.accounting.shuffling import shuffled_release_report

        return {
            "central_by_shuffling": shuffled_release_report(
                self.mechanism.epsilon,
                len(self.release),
                self.shuffle_delta,
                self.metadata["seed_is_public"],
            )
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
            "privacy_budget": self.ledger_settings.budget,
            "path": str(self.ledger.path),
        }

    def _post_processing_report(self) -> dict:
        if self.denoiser is None:
            return {}
        low, high = self.randomizer.low, self.randomizer.high
        return {"post_processing": self.denoiser.report(low, high)}
