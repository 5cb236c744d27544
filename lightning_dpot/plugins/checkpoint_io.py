"""Checkpoints that are either complete or absent, whatever kills the process.

Lightning 2.6's ``TorchCheckpointIO`` writes local checkpoints through an fsspec transaction that
stages the bytes in the *system* temporary directory (``tempfile.mkstemp()``) and then
``shutil.move``-s them into place. When that directory is on another filesystem than the
checkpoint (``/tmp`` on tmpfs, checkpoints on a network or scratch disk — the usual cluster
layout), the move is a copy into the destination, and a process killed during the copy leaves a
truncated ``last.ckpt`` behind: the resume then fails or, worse, a private run's accountant state
is lost. ``AtomicCheckpointIO`` stages the bytes in the checkpoint's own directory, flushes
them to disk (``fsync``) and publishes them with ``os.replace``, which POSIX makes atomic within a
filesystem. Remote URLs (``s3://`` ...) go through Lightning's own path. ``dpot`` uses it for
every run. A truncated or corrupt file is refused on load with an error naming it.
"""

from __future__ import annotations

import io
import os
import pickle
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

__all__ = ["AtomicCheckpointIO"]


def _is_local(path: str | Path) -> bool:
    return "://" not in str(path) or str(path).startswith("file://")


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local saves are atomic (module docstring)."""

    @override
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(
                "AtomicCheckpointIO.save_checkpoint does not accept storage_options, got "
                f"{storage_options!r}"
            )
        if not _is_local(path):
            super().save_checkpoint(checkpoint, path)
            return
        target = Path(str(path).removeprefix("file://"))
        get_filesystem(target).makedirs(str(target.parent), exist_ok=True)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        fd, staging = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(buffer.getbuffer())
                f.flush()
                os.fsync(f.fileno())
            os.replace(staging, target)
        except BaseException:
            if os.path.exists(staging):
                os.remove(staging)
            raise
        try:  # make the rename itself durable
            dir_fd = os.open(target.parent, os.O_RDONLY)
        except OSError:
            rank_zero_warn(f"could not fsync the directory {target.parent}")
            return
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    @override
    def load_checkpoint(
        self,
        path: str | Path,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        try:
            return super().load_checkpoint(path, map_location, weights_only)
        except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
            raise ValueError(
                f"ckpt_path={str(path)!r} is not a readable checkpoint (truncated or corrupt: "
                f"{error}); resume from an earlier checkpoint"
            ) from error
