"""Cost of the release journal: one line per privacy event, made durable in groups.

Every release object emits its event before it draws its noise, and the accountant's journal
writes one JSON line inside that emit; the lines are ``fsync``-ed in groups by ``commit``
before anything derived from them leaves the process
(``lightning_dpot/privacy/accounting/journal.py``). This times ``--appends`` appends to a
journal in ``--dir`` (the disk a run's log directory is on matters: a network file system
``fsync``-s slower than a local disk), a commit after every ``--group`` appends (the
accountant commits every ``log_every_n_steps`` releases, 50 by default), and reading it back,
as a resumed run does.

Run: python benchmarks/bench_journal.py [--dir PATH] [--appends 500] [--group 50]
Prints one JSON object: milliseconds per append and per commit (median and 95th percentile),
and per read.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from lightning_dpot.privacy.accounting.journal import ReleaseJournal
from lightning_dpot.privacy.events import SubsampledGaussianStep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where the journal is written")
    parser.add_argument("--appends", type=int, default=500)
    parser.add_argument("--group", type=int, default=50, help="appends per commit (fsync)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        journal = ReleaseJournal(Path(directory) / "journal.jsonl")
        journal.start()
        event = SubsampledGaussianStep(1.5, 1 / 1200)
        times, commits = [], []
        for index in range(args.appends):
            start = time.perf_counter()
            journal.append(0, event)
            times.append(time.perf_counter() - start)
            if (index + 1) % args.group == 0:
                start = time.perf_counter()
                journal.commit()
                commits.append(time.perf_counter() - start)
        journal.close()
        start = time.perf_counter()
        count = len(journal.read())
        read = time.perf_counter() - start
    times.sort()
    commits.sort()
    print(
        json.dumps(
            {
                "appends": count,
                "append_ms_median": 1e3 * statistics.median(times),
                "append_ms_p95": 1e3 * times[int(0.95 * (len(times) - 1))],
                "commits": len(commits),
                "commit_ms_median": 1e3 * statistics.median(commits) if commits else None,
                "commit_ms_p95": 1e3 * commits[int(0.95 * (len(commits) - 1))] if commits else None,
                "read_ms": 1e3 * read,
            }
        )
    )


if __name__ == "__main__":
    main()
