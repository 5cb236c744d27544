"""The release journal: every privacy event of a run, written before its noise is drawn.

A checkpoint holds the accountant's history as of the step it was written; a process killed
later has made more releases, and their outputs (a logged metric, a sample, a checkpoint) may
already have left it. So the accountant attaches a ``ReleaseJournal`` to every release
object's ``EventLog``: ``ReleaseJournal.append`` writes
one JSON line per event inside ``emit``, which a release object calls before it draws its noise.
The line reaches the operating system at once (a killed process loses none); it is made durable
on disk (``fsync``) in groups by ``ReleaseJournal.commit``, which the accountant calls
before anything derived from those releases can leave the process: a logged metric, a
checkpoint, the end of an epoch (samples, evaluations), the end of the run and the crash
handler. One ``fsync`` per group instead of one per release keeps the cost of a step constant
(``docs/performance.md``, "Bookkeeping"); a power loss can lose only releases whose outputs
never left the machine.

One journal serves a run and all its resumes: the checkpoint names it by absolute path and id,
with the number of releases it held when the checkpoint was written, and a resumed process
appends to it. A resumed run composes the whole journal, not the checkpoint, so releases made
after the last checkpoint, by any process, count (a crash over-counts by the one release being
journaled, and two resumes from one checkpoint, one after the other, count both branches: never
an under-count).

One process at a time holds the journal (``ReleaseJournal.acquire``): a second process
resuming the same run while the first still runs is refused.

The first line, ``{"journal": id}``, names the journal (the checkpoint stores the id, so another
run's journal is refused). Each further line is ``{"process": p, "seq": k, "release": i,
"event": {...}}``: ``k`` counts process ``p``'s releases from 0, ``i`` is the index of the
release object in the module's ``privacy_releases``. A last line without its newline is an append
that a crash interrupted: its
``emit`` never returned, so its noise was never drawn. ``ReleaseJournal.read`` ignores it
and ``ReleaseJournal.acquire`` cuts it off (once, with a warning), so the next append starts
on a line of its own. Any other unreadable line is refused.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from lightning_dpot.locks import locked_file, unlock_and_remove
from lightning_dpot.privacy.events import PrivacyEvent, event_from_dict

__all__ = ["ReleaseJournal"]


class ReleaseJournal:
    """An append-only file of a run's privacy events, committed to disk in groups (module
    docstring).

    Args:
        path: the journal file (kept as an absolute path: a resume from another working
            directory finds the same file).
        journal_id: the id its first line holds (a fresh one for a new journal).
    """

    def __init__(self, path: str | Path, journal_id: str | None = None) -> None:
        self.path = Path(os.path.abspath(path))
        self.id = journal_id or uuid.uuid4().hex
        self.process = uuid.uuid4().hex[:12]
        self.count = 0  # this process's appends (its next ``seq``)
        self.position = 0  # release lines in the file, every process's
        self._lock: int | None = None
        self._fd: int | None = None
        self._uncommitted = 0

    def acquire(self) -> None:
        """Hold the journal alone (an ``flock`` on ``<journal>.lock``, which ``release``
        removes) until ``release`` or the process ends: a second process resuming the same run
        at the same time would compose the journal without the first one's later releases and
        check the budget alone, so it is refused. An interrupted last line is cut off here.

        Raises:
            RuntimeError: if another process holds the journal.
        """
        if self._lock is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = locked_file(self._lock_path, blocking=False)
        if fd is None:
            raise RuntimeError(
                f"the release journal {str(self.path)!r} is in use by another process resuming "
                "or running the same run; two processes releasing under one journal would each "
                "account only their own releases. Wait for it to end, or stop it"
            ) from None
        self._lock = fd
        self._cut_torn_tail()

    def release(self) -> None:
        """Commit, close and let another process take the journal (``acquire``)."""
        self.close()
        if self._lock is not None:
            unlock_and_remove(self._lock_path, self._lock)
            self._lock = None

    @property
    def _lock_path(self) -> Path:
        return self.path.with_name(f"{self.path.name}.lock")

    def _cut_torn_tail(self) -> None:
        """Cut a last line without its newline (an append a crash interrupted, whose noise was
        never drawn), so that the next append does not continue it."""
        if not self.path.is_file():
            return
        data = self.path.read_bytes()
        if not data or data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        with open(self.path, "r+b") as fh:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
        warnings.warn(
            f"the release journal {str(self.path)!r} ended in an interrupted line "
            f"({len(data) - keep} bytes, a release whose noise was never drawn); it was cut off",
            UserWarning,
            stacklevel=3,
        )

    def read(self) -> list[tuple[int, PrivacyEvent]]:
        """``(release index, event)`` of every complete line, in file order; sets
        ``position`` to their number.

        Raises:
            FileNotFoundError: if the journal does not exist.
            ValueError: if it is another journal than ``journal_id``, or a line other than an
                interrupted last one is unreadable or out of its process's sequence.
        """
        lines = self.path.read_text().split("\n")
        lines.pop()  # "" after the last newline, or an interrupted append: never released
        where = f"journal={str(self.path)!r}"
        if not lines or _record(lines[0], 1, where).get("journal") != self.id:
            raise ValueError(f"{where} is not the journal {self.id} that the checkpoint names")
        entries, counts = [], {}
        for number, line in enumerate(lines[1:], start=2):
            entry = _record(line, number, where)
            try:
                process, seq = str(entry["process"]), int(entry["seq"])
                index, event = int(entry["release"]), event_from_dict(entry["event"])
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(
                    f"{where}: line {number} is not a release record ({error})"
                ) from error
            if seq != counts.get(process, 0):
                raise ValueError(
                    f"{where}: line {number} has seq={seq} for process {process}, expected "
                    f"{counts.get(process, 0)} (lines lost or reordered)"
                )
            counts[process] = seq + 1
            entries.append((index, event))
        self.position = len(entries)
        return entries

    def start(self, entries: Sequence[tuple[int, PrivacyEvent]] = ()) -> None:
        """Create the journal with its id line and ``entries`` (releases already made, e.g. by
        a run that kept no journal), atomically: staged beside it, ``fsync``-ed, renamed."""
        self.close()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, staging = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps({"journal": self.id}) + "\n")
                for seq, (index, event) in enumerate(entries):
                    fh.write(self._line(seq, index, event))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(staging, self.path)
        except BaseException:
            if os.path.exists(staging):
                os.remove(staging)
            raise
        _fsync_directory(self.path.parent)
        self.count = self.position = len(entries)

    def append(self, index: int, event: PrivacyEvent) -> None:
        """Write one event to the file (the operating system holds it from here on; it is on
        disk after the next ``commit``).

        Raises:
            OSError: if the line could not be written whole (a full disk, a quota): the part
                written is cut off again and the caller's release does not happen.
        """
        line = self._line(self.count, index, event).encode()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        end = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            written = os.write(self._fd, line)
        except OSError:
            os.ftruncate(self._fd, end)
            raise
        if written != len(line):
            os.ftruncate(self._fd, end)
            raise OSError(
                f"journal={str(self.path)!r}: wrote {written} of {len(line)} bytes (disk "
                "full?); the release was not made"
            )
        self.count += 1
        self.position += 1
        self._uncommitted += 1

    def commit(self) -> int:
        """Make every appended line durable (one ``fsync``); returns how many it committed
        (0, and no system call, when there were none)."""
        committed, self._uncommitted = self._uncommitted, 0
        if committed and self._fd is not None:
            os.fsync(self._fd)
        return committed

    def close(self) -> None:
        """Commit and close the file (appending opens it again)."""
        self.commit()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def writer(self, index: int) -> Callable[[PrivacyEvent], None]:
        """The ``EventLog.journal`` of the release object at ``index``."""
        return lambda event: self.append(index, event)

    def _line(self, seq: int, index: int, event: PrivacyEvent) -> str:
        entry = {"process": self.process, "seq": seq, "release": index, "event": event.as_dict()}
        return json.dumps(entry) + "\n"


def _record(line: str, number: int, where: str) -> dict:
    try:
        entry = json.loads(line)
    except ValueError as error:
        raise ValueError(f"{where}: line {number} is not a release record ({error})") from error
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: line {number} is not a release record")
    return entry


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
