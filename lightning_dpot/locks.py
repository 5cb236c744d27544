"""Exclusive file locks that leave no lock file behind (``flock``, POSIX)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["exclusive_lock", "locked_file", "unlock_and_remove"]


@contextmanager
def exclusive_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block: the
    processes that lock the same path run their blocks one at a time. The file is removed when
    the block ends, so no lock file is left behind (``locked_file``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = locked_file(path, blocking=True)
    assert fd is not None
    try:
        yield
    finally:
        unlock_and_remove(path, fd)


def locked_file(path: Path, blocking: bool) -> int | None:
    """A descriptor of ``path`` holding its exclusive ``flock`` (``None``: held elsewhere and
    not ``blocking``). A holder removes the file before unlocking (``unlock_and_remove``), so a
    lock taken on a file no longer at ``path`` is dropped and taken again on the new one: two
    processes never hold ``path`` at once."""
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if blocking else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # removed by its last holder while this process waited: lock the new one


def unlock_and_remove(path: Path, fd: int) -> None:
    """Remove ``path`` (still locked: nobody else holds it), then release the lock."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
