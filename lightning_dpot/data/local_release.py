"""One local-DP release of a source's training records, made once and cached.

The cache entry is keyed by the release's configuration (source, randomizer, seed). Its
existence check, the privatization and the save run under an exclusive lock on the entry
(``exclusive_lock``), so runs that share a cache make one release between them, whatever their
timing; only global rank 0 privatizes, and the save is atomic. The release is stored in a secret
uniformly random order, with a keyed digest of the raw records it was made from, so that a
changed source is never privatized again under the same configuration."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning_dpot._version import __version__
from lightning_dpot.data.release import Release, config_key, keyed_digest
from lightning_dpot.data.sources import DataSource, DataSplits, check_source_splits
from lightning_dpot.distributed import rank_world
from lightning_dpot.locks import exclusive_lock
from lightning_dpot.privacy.mechanisms.ldp import LocalRandomizer
from lightning_dpot.rng import SecretNoise, permutation


class LocalReleaseCache:
    """The cached release of ``source``'s training records by ``randomizer``.

    Args:
        source: the raw data.
        randomizer: the local randomizer (its mechanism, bounds and record transform).
        seed: a public noise seed (``None``: a fresh secret one, not recorded).
        secure_rng: draw from the operating system's CSPRNG.
        cache_dir: where the release is kept.
    """

    def __init__(
        self,
        source: DataSource,
        randomizer: LocalRandomizer,
        seed: int | None,
        secure_rng: bool,
        cache_dir: Path,
    ) -> None:
        self.source, self.randomizer = source, randomizer
        self.seed, self.secure_rng, self.cache_dir = seed, secure_rng, cache_dir

    def config(self) -> dict[str, Any]:
        """What the release is made from and with: its cache key."""
        return {
            "source": self.source.describe(),
            "randomizer": self.randomizer.describe(),
            "seed": self.seed,
            "secure_rng": self.secure_rng,
        }

    def key(self) -> str:
        return config_key(self.config())

    def path(self) -> Path:
        return self.cache_dir / f"release-{self.key()[:20]}.pt"

    def make(self, before_release: Callable[[DataSplits], None]) -> Release:
        """Load the source, validate its records, call ``before_release`` (the data module's
        checks and ledger charge: whatever it refuses, nothing is drawn), then privatize every
        training record once and shuffle the reports with the same secret stream."""
        splits = self.source.load()
        # Refused before the ledger is charged: a bad record must not spend anyone's budget.
        check_source_splits(self.source, splits)
        self.randomizer.check_records(splits.train)
        before_release(splits)
        generator = SecretNoise(self.seed, self.secure_rng).source()
        # A secret uniformly random order: the trainer receives shuffled reports, which is what
        # amplification by shuffling requires.
        data = self.randomizer(splits.train, generator)
        data = data[permutation(len(data), generator)]
        metadata = {
            **self.config(),
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

    def cached(self, before_release: Callable[[DataSplits], None]) -> Path:
        """The cached release, privatized first (on global rank 0, ``make``) if there is
        none. The existence check is made inside the lock: of the runs sharing a cache, the
        first privatizes and the others wait for its release and load it. Other ranks never
        privatize."""
        path = self.path()
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
        # Check and make inside one lock: two runs that share the cache must not both
        # privatize (fresh noise on the same records is a second release).
        with exclusive_lock(path.with_name(f"{path.name}.lock")):
            if not path.is_file():
                self.make(before_release).save(path)
        return path

    def check_made_from(self, splits: DataSplits, release: Release, path: Path) -> None:
        """Refuse a cached release made from other raw records than ``splits`` holds now."""
        if keyed_digest(splits.train, self.cache_dir) != release.metadata.get("raw_hmac_sha256"):
            raise ValueError(
                f"the cached release {path} was made from different raw data than the source "
                "now holds; refusing to privatize the changed data again under the same "
                "configuration (fresh noise on unchanged records would leak). Use a new "
                "cache_dir to privatize a different dataset deliberately"
            )
