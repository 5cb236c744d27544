"""Per-record keys of the privacy ledger (``lightning_dpot.data.ledger``): keyed digests
(BLAKE2b-64 under the ledger's secret key) of each record's float32 bytes and, where the source
declares them, of its identity. Without the key they say nothing about the records."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["RecordKeys", "key_files", "keyed_record_keys"]


@dataclass(frozen=True)
class RecordKeys:
    """Ledger keys of a set of records, uint64 and aligned with the records: ``content`` (of
    their float32 bytes) always, ``ids`` (of their declared identities) where the source
    declares them."""

    content: np.ndarray
    ids: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.content)

    def by_keying(self) -> dict[str, np.ndarray]:
        if self.ids is None:
            return {"bytes": self.content}
        return {"id": self.ids, "bytes": self.content}

    @property
    def keying(self) -> str:
        """How the ledger recognises these records in other releases."""
        if self.ids is None:
            return "record bytes after preprocessing (the source declares no record ids)"
        return "record ids declared by the source, and record bytes after preprocessing"


def key_files(entry: dict) -> dict[str, str]:
    """The key files of a ledger entry by keying; an entry written before record ids existed
    names one file of byte keys."""
    return entry.get("keys") or {"bytes": entry["records"]}


def _blake64(digest: hashlib.blake2b) -> int:
    return int.from_bytes(digest.digest(), "big")


def keyed_record_keys(
    key: bytes, records: Tensor, ids: Tensor | None = None, id_namespace: str | None = None
) -> RecordKeys:
    """Keys under ``key`` of the rows of ``records`` and, where given, of their identities
    ``ids`` (int64, one per row) within ``id_namespace``."""
    rows = records.detach().to("cpu").float().contiguous().numpy()
    rows = rows.reshape(rows.shape[0], -1)
    content = np.fromiter(
        (_blake64(hashlib.blake2b(row.tobytes(), key=key, digest_size=8)) for row in rows),
        dtype=np.uint64,
        count=rows.shape[0],
    )
    if ids is None:
        return RecordKeys(content)
    if not isinstance(id_namespace, str) or not id_namespace:
        raise ValueError(
            f"id_namespace must be a non-empty string naming what train_ids identify, got "
            f"{id_namespace!r}"
        )
    if ids.dtype != torch.int64 or tuple(ids.shape) != (rows.shape[0],):
        raise ValueError(
            f"train_ids must be an int64 tensor of shape ({rows.shape[0]},) (one per "
            f"record), got {ids.dtype} of shape {tuple(ids.shape)}"
        )
    prefix = hashlib.blake2b(id_namespace.encode() + b"\0", key=key, digest_size=8)

    def id_key(identity: int) -> int:
        digest = prefix.copy()
        digest.update(identity.to_bytes(8, "little", signed=True))
        return _blake64(digest)

    keyed = np.fromiter(map(id_key, ids.tolist()), dtype=np.uint64, count=len(ids))
    return RecordKeys(content, keyed)
