"""Release files: a privatized dataset and the metadata needed to audit it.

A release is written once (atomically: temporary file, then ``os.replace``) and only read
afterwards; ``lightning_dpot.locks.exclusive_lock`` serializes the processes that may write the
same one. It
holds the privatized records in the mechanism's domain ``(n, m)`` and metadata: mechanism, ε, δ,
noise scale, sensitivity, projection, transform, seed status, a keyed digest (HMAC-SHA256, key
kept in the cache directory, ``keyed_digest``) of the raw training records, and the library
version. Raw labels are never stored: they would be released without privacy.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
import secrets
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


def secret_key(key_dir: str | Path) -> bytes:
    """The 32 random bytes in ``key_dir/digest.key``, created with mode 0600 on first use.

    The key is written to a temporary file and published with ``os.link``, which fails if the
    key exists: a process racing the creator reads either no key (and links its own, losing
    the race) or the whole key, never a partly written one."""
    key_path = Path(key_dir) / "digest.key"
    if key_path.is_file():
        return key_path.read_bytes()
    key_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=key_path.parent, prefix="digest.key", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:  # mkstemp creates the file with mode 0600
            f.write(secrets.token_bytes(32))
        try:
            os.link(tmp, key_path)
        except FileExistsError:
            pass
    finally:
        os.remove(tmp)
    return key_path.read_bytes()


def keyed_digest(x: Tensor, key_dir: str | Path) -> str:
    """HMAC-SHA256 of a tensor's bytes and shape under a secret key kept in
    ``key_dir/digest.key`` (32 random bytes, created with mode 0600 on first use).

    Detects a change of the raw data between runs on the data owner's side without putting a
    plain hash of private records into a release file: an unkeyed hash is a deterministic
    function of the data, which lets anyone who knows all records but one test candidates for
    the last. Without the key the digest says nothing."""
    key = secret_key(key_dir)
    arr = x.detach().to("cpu", torch.float32).contiguous().numpy()
    mac = hmac.new(key, str(tuple(arr.shape)).encode(), hashlib.sha256)
    mac.update(arr.tobytes())
    return mac.hexdigest()


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
