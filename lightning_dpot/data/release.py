"""Release files: a privatized dataset and the metadata needed to audit it.

A release is written once (atomically: temporary file, then ``os.replace``) and only read
afterwards. It holds the privatized records in the mechanism's domain ``(n, m)`` and metadata:
mechanism, ε, δ, noise scale, sensitivity, projection, transform, seed status, a SHA-256 of the
raw training records, and the library version. Raw labels are never stored: they would be
released without privacy.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

RELEASE_FORMAT = 1


def tensor_sha256(x: Tensor) -> str:
    """SHA-256 of a tensor's bytes (contiguous float32 CPU copy) and shape."""
    arr = x.detach().to("cpu", torch.float32).contiguous().numpy()
    digest = hashlib.sha256(str(tuple(arr.shape)).encode())
    digest.update(arr.tobytes())
    return digest.hexdigest()


def config_key(config: dict) -> str:
    """Stable hash of a JSON-able configuration, used to name cached releases."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Release:
    data: Tensor
    metadata: dict

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        os.close(fd)
        try:
            torch.save(
                {"format": RELEASE_FORMAT, "data": self.data, "metadata": self.metadata}, tmp
            )
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Release:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"release_path={str(path)!r}: no such release file")
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
            raise ValueError(
                f"release_path={str(path)!r} is not a lightning_dpot release file ({error})"
            ) from error
        if not isinstance(obj, dict) or obj.get("format") != RELEASE_FORMAT:
            raise ValueError(f"release_path={str(path)!r} is not a lightning_dpot release file")
        return cls(obj["data"], obj["metadata"])
