"""A seeded public/private split of a training set, saved with the run and checked later.

Sebag et al. 2023 (§5, App. C) train the autoencoder on a public half ``X_pub`` of the training set
and the DP flow on the other half ``X_priv``. The privacy guarantee of the flow covers ``X_priv``
only and assumes that the autoencoder never saw a private record. So the split must be

* **data-independent**: a seeded permutation of ``range(n)``, never a function of the records;
* **identical for every stage**: stage 1 (autoencoder) records it; stage 2 (flow) recomputes it
  from its own source and seed and **refuses** to start when anything differs (the official code
  re-draws the split per run, so its autoencoder may have been trained on "private" records).

``PublicPrivateSplit`` holds the two index sets, the seed, the public fraction and two hashes:
``split_hash`` (SHA-256 of the seed, n and both index lists) and ``data_hash`` (SHA-256 of the
**public** records only, so that a different dataset with the same n is detected too; a hash of
the private records would be a deterministic, non-private function of them, and the checkpoint
that carries it is shared with the decoder). It is saved inside
the autoencoder checkpoint (``checkpoint["public_private_split"]``) and, optionally, as a JSON file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["SplitMismatchError", "PublicPrivateSplit", "data_hash", "make_public_private_split"]

SPLIT_CHECKPOINT_KEY = "public_private_split"


class SplitMismatchError(ValueError):
    """A later stage found a public/private split different from the one saved by stage 1."""


def data_hash(records: Tensor) -> str:
    """SHA-256 of records (shape, dtype and bytes), hex. Only ever applied to public records."""
    x = records.detach().cpu().contiguous()
    h = hashlib.sha256()
    h.update(str((tuple(x.shape), str(x.dtype))).encode())
    h.update(x.numpy().tobytes())
    return h.hexdigest()


def _split_hash(seed: int, n: int, public: list[int], private: list[int]) -> str:
    payload = json.dumps({"seed": seed, "n": n, "public": public, "private": private})
    return hashlib.sha256(payload.encode()).hexdigest()


@dataclass
class PublicPrivateSplit:
    """Indices of the public and private parts of a training set of ``n`` records.

    Attributes:
        seed: seed of the permutation.
        public_fraction: fraction of the records in the public part, in (0, 1).
        n: number of training records split.
        public, private: sorted index lists (disjoint, union ``range(n)``).
        data_hash: ``data_hash`` of the training records ("" if not recorded).
        split_hash: SHA-256 of (seed, n, public, private).
        source: the data source's description (informative, not compared).
    """

    seed: int
    public_fraction: float
    n: int
    public: list[int]
    private: list[int]
    data_hash: str = ""
    split_hash: str = ""
    source: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.split_hash:
            self.split_hash = _split_hash(self.seed, self.n, self.public, self.private)

    # -- persistence -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> PublicPrivateSplit:
        split = cls(**state)
        recomputed = _split_hash(split.seed, split.n, split.public, split.private)
        if recomputed != split.split_hash:
            raise SplitMismatchError(
                f"the saved split is corrupt: its split_hash {split.split_hash[:12]}… does not "
                f"match its indices ({recomputed[:12]}…)"
            )
        return split

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict()))
        return path

    @classmethod
    def load(cls, path: str | Path) -> PublicPrivateSplit:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"split_file={str(path)!r} does not exist; run stage 1 (the autoencoder) first, "
                "it writes the split"
            )
        return cls.from_dict(json.loads(path.read_text()))

    # -- checking --------------------------------------------------------------------------------
    def check_matches(self, other: PublicPrivateSplit, what: str = "the saved split") -> None:
        """Raise ``SplitMismatchError`` unless ``other`` is the same split of the same data."""
        problems = []
        for name in ("seed", "n", "public_fraction", "split_hash"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                problems.append(f"{name}: {theirs!r} in {what} vs {mine!r} now")
        if self.data_hash and other.data_hash and self.data_hash != other.data_hash:
            problems.append(
                f"data_hash: {other.data_hash[:12]}… in {what} vs {self.data_hash[:12]}… now "
                "(different training records)"
            )
        if problems:
            raise SplitMismatchError(
                "the public/private split of this stage differs from "
                f"{what}: " + "; ".join(problems) + ". The private records of this stage might "
                "have been seen by the public autoencoder; use the same source, split_seed and "
                "public_fraction as stage 1"
            )


def make_public_private_split(
    records: Tensor,
    public_fraction: float = 0.5,
    seed: int = 0,
    source: dict[str, Any] | None = None,
) -> PublicPrivateSplit:
    """Seeded split: ``perm = randperm(n, Generator().manual_seed(seed))``; the first
    ``round(n·public_fraction)`` indices of ``perm`` are public, the rest private (both sorted).
    Depends on the records only through ``n`` (and records the public part's hash, for
    checking)."""
    public_fraction = float(public_fraction)
    if not 0.0 < public_fraction < 1.0:
        raise ValueError(f"public_fraction must lie in (0, 1), got {public_fraction!r}")
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise ValueError(f"split_seed must be an integer >= 0, got {seed!r}")
    n = int(records.shape[0])
    n_public = int(round(n * public_fraction))
    if not 0 < n_public < n:
        raise ValueError(
            f"public_fraction={public_fraction} of n={n} records leaves an empty part; "
            "use more records or a fraction nearer 0.5"
        )
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(seed)))
    public = sorted(perm[:n_public].tolist())
    private = sorted(perm[n_public:].tolist())
    return PublicPrivateSplit(
        seed=int(seed),
        public_fraction=public_fraction,
        n=n,
        public=public,
        private=private,
        data_hash=data_hash(records[torch.tensor(public, dtype=torch.long)]),
        source=dict(source or {}),
    )
